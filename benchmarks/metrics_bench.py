"""Cost of recording one gateway call's metrics (``GatewayMetrics.record``) with the Prometheus backend.

The gateway records each call after its answer is sent; this measures the work that adds to the event loop per
call: a few counter and histogram updates through :class:`~agentbolt.utils.metrics.PrometheusMetricsBackend`, in
the default single-process mode and in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, values in memory-mapped
files), each in a fresh process.

Usage::

    python benchmarks/metrics_bench.py [--calls 20000]

Prints one JSON object (microseconds per recorded call, median of 5 rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

_CHILD = """
import asyncio, statistics, sys, time
from agentbolt.gateway.metrics import CallOutcome, GatewayMetrics
from agentbolt.utils.metrics import PrometheusMetricsBackend
calls = int(sys.argv[1])
metrics = GatewayMetrics(PrometheusMetricsBackend())
usage = {"prompt_tokens": 42, "completion_tokens": 16}

async def round_() -> float:
    started = time.perf_counter()
    for i in range(calls):
        outcome = CallOutcome("chat/completions", started, model="bench", status=200, usage=usage)
        outcome.first_token = started if i % 2 else None
        await metrics.record(outcome, time.perf_counter())
    return (time.perf_counter() - started) / calls * 1e6

rounds = [asyncio.run(round_()) for _ in range(5)]
print(statistics.median(rounds))
"""


def _measure(calls: int, multiprocess: bool) -> float:
    env = dict(os.environ)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with tempfile.TemporaryDirectory(prefix="agentbolt-metrics-bench-") as directory:
        if multiprocess:
            env["PROMETHEUS_MULTIPROC_DIR"] = directory
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(calls)], env=env, check=True, capture_output=True, text=True
        )
    return round(float(out.stdout.strip().splitlines()[-1]), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = os.getloadavg()
    result = {
        "benchmark": "metrics",
        "calls": args.calls,
        "gateway_record_us_single_process": _measure(args.calls, multiprocess=False),
        "gateway_record_us_multiprocess": _measure(args.calls, multiprocess=True),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "started": started,
        "load_average_start": [round(x, 2) for x in load],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
