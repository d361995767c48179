"""A point-in-time summary of the machine (CPU, memory, disk, network, optionally GPUs) for worker heartbeats."""

from __future__ import annotations

import datetime
import logging
import platform
import socket
from typing import Any, Dict, List

import psutil

try:  # Optional: only needed for GPU statistics.
    from gpustat import GPUStatCollection  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    GPUStatCollection = None

__all__ = ["system_snapshot"]

logger = logging.getLogger(__name__)

_GB = float(2**30)
_MB = float(2**20)


def _gpu_snapshot() -> List[Dict[str, Any]]:
    if GPUStatCollection is None:
        return []
    try:
        collection = GPUStatCollection.new_query()
        return [
            {
                "gpu": gpu.name,
                "util_pct": gpu.utilization,
                "mem_used_mb": gpu.memory_used,
                "mem_total_mb": gpu.memory_total,
                "temp_c": gpu.temperature,
            }
            for gpu in collection.gpus
        ]
    except Exception as exc:  # any driver/NVML failure means "no GPU information"
        logger.debug("GPU query failed: %s", exc)
        return []


def system_snapshot(include_gpu: bool = False) -> Dict[str, Any]:
    """Describe the machine's current state.

    Args:
        include_gpu: Add a ``gpus`` list (needs the ``gpustat`` package; empty when unavailable).

    Returns:
        A JSON-serialisable dict: ``timestamp``, ``host``, ``os``, ``cpu_name``, ``cpu_cores``, ``cpu_threads``,
        ``cpu_usage_pct`` (non-blocking: usage since the previous call), memory/disk (``/``) usage in GiB and
        percent, network bytes sent/received in MiB, and ``gpus`` when requested.
    """
    memory = psutil.virtual_memory()
    disk = psutil.disk_usage("/")
    network = psutil.net_io_counters()
    snapshot: Dict[str, Any] = {
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu_name": platform.processor() or platform.machine(),
        "cpu_cores": psutil.cpu_count(logical=False),
        "cpu_threads": psutil.cpu_count(logical=True),
        "cpu_usage_pct": psutil.cpu_percent(0.0),
        "mem_used_gb": round(memory.used / _GB, 2),
        "mem_total_gb": round(memory.total / _GB, 2),
        "mem_pct": memory.percent,
        "disk_used_gb": round(disk.used / _GB, 2),
        "disk_total_gb": round(disk.total / _GB, 2),
        "disk_pct": disk.percent,
        "bytes_sent_mb": round(network.bytes_sent / _MB, 2) if network else 0.0,
        "bytes_recv_mb": round(network.bytes_recv / _MB, 2) if network else 0.0,
    }
    if include_gpu:
        snapshot["gpus"] = _gpu_snapshot()
    return snapshot
