"""system_snapshot describes the real machine."""

from __future__ import annotations

import datetime
import json

from agentbolt.utils import system_snapshot as module
from agentbolt.utils.system_snapshot import system_snapshot


def test_snapshot_fields() -> None:
    snapshot = system_snapshot()
    assert "gpus" not in snapshot
    datetime.datetime.fromisoformat(snapshot["timestamp"])
    assert snapshot["cpu_threads"] >= 1
    assert 0 <= snapshot["mem_pct"] <= 100 and 0 <= snapshot["disk_pct"] <= 100
    assert 0 < snapshot["mem_used_gb"] <= snapshot["mem_total_gb"]
    assert snapshot["disk_total_gb"] > 0
    for key in ("mem_total_gb", "disk_used_gb", "bytes_sent_mb", "bytes_recv_mb"):
        assert round(snapshot[key], 2) == snapshot[key]
    json.dumps(snapshot)


def test_gpu_query_never_fails() -> None:
    snapshot = system_snapshot(include_gpu=True)
    assert isinstance(snapshot["gpus"], list)
    if module.GPUStatCollection is None:
        assert snapshot["gpus"] == []
    for name in ("platform", "socket", "psutil", "GPUStatCollection"):
        assert hasattr(module, name)
