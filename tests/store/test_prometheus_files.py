"""``agentbolt store --workers N --tracker prometheus`` with ``PROMETHEUS_MULTIPROC_DIR``: the per-process files
follow prometheus-client's multiprocess rules. A process that exited is marked dead (its live gauges stop counting),
whether it exited before the store started or is a worker that died or stopped; counters and histograms of exited
processes are kept, as prometheus-client sums them into the totals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import httpx
import psutil
import pytest
from support.servers import free_port, start_store_process, wait_serving

pytest.importorskip("prometheus_client")
from prometheus_client.mmap_dict import MmapedDict, mmap_key


def _write_metric_file(path: Path, metric: str) -> None:
    """A per-process file as prometheus-client writes it, holding one sample of ``metric``."""
    values = MmapedDict(str(path))
    try:
        values.write_value(mmap_key(metric, metric, [], [], metric), 3.0, 0.0)
    finally:
        values.close()


def _exited_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


async def _wait_for(condition: object, what: str) -> None:
    for _ in range(1200):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(what)


def _worker_pids(server: subprocess.Popen[bytes]) -> List[int]:
    return sorted(child.pid for child in psutil.Process(server.pid).children())


async def test_files_of_exited_processes_follow_prometheus_client_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    earlier = _exited_pid()  # a process of an earlier run
    _write_metric_file(metrics_dir / f"gauge_livesum_{earlier}.db", "in_progress")
    _write_metric_file(metrics_dir / f"gauge_liveall_{earlier}.db", "in_progress_by_pid")
    _write_metric_file(metrics_dir / f"gauge_all_{earlier}.db", "last_seen")
    _write_metric_file(metrics_dir / f"counter_{earlier}.db", "earlier_total")
    _write_metric_file(metrics_dir / f"histogram_{earlier}.db", "earlier_seconds")

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(
        tmp_path / "store.db", port, ["--workers", "2", "--tracker", "prometheus"], stderr=subprocess.DEVNULL
    )
    try:
        await asyncio.to_thread(wait_serving, server)
        # At start, the earlier process's live gauges are gone; everything else it wrote is kept.
        assert sorted(p.name for p in metrics_dir.iterdir() if p.name.endswith(f"_{earlier}.db")) == [
            f"counter_{earlier}.db",
            f"gauge_all_{earlier}.db",
            f"histogram_{earlier}.db",
        ]
        for _ in range(20):  # requests write the workers' own counter files
            assert httpx.get(f"{endpoint}/v1/agl/statistics").status_code == 200
        workers = _worker_pids(server)
        assert len(workers) == 2
        for pid in workers:
            _write_metric_file(metrics_dir / f"gauge_livesum_{pid}.db", "in_progress")
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        await _wait_for(lambda: victim not in _worker_pids(server) and len(_worker_pids(server)) == 2, "no replacement")
        assert not (metrics_dir / f"gauge_livesum_{victim}.db").exists()  # marked dead when it was replaced
        assert (metrics_dir / f"gauge_livesum_{workers[1]}.db").exists()  # still serving
        counters = [p.name for p in metrics_dir.iterdir() if p.name.startswith("counter_")]
        assert f"counter_{victim}.db" in counters or f"counter_{workers[1]}.db" in counters, counters
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    # Stopped workers are marked dead too; the counters of every process stay.
    assert not list(metrics_dir.glob("gauge_livesum_*.db"))
    assert (metrics_dir / f"counter_{earlier}.db").exists()
