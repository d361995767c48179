"""Held-out score of the room selector before and after each prompt optimizer, with the embedded model as the agent.

Runs ``python -m examples.apo.room_selector_apo --algorithm NAME`` once per optimizer (each in its own process, one
after the other) and prints one JSON document: the machine (CPU model, cores, load before each run, date) and, per
optimizer, the test-split score of the seed and of the best prompt (overall and per slice, with 95% Wilson
intervals), rollouts and optimizer tokens spent, and wall time. Hold the machine-wide measurement lock while it runs:

    flock /tmp/agentbolt-measure.lock .venv/bin/python benchmarks/apo_bench.py --output /tmp/apo_bench.json \\
        --log-dir /tmp/apo_logs
    .venv/bin/python benchmarks/apo_bench.py --algorithms fewshot --rounds 1     # one optimizer
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
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run_one(algorithm: str, extra: Sequence[str], log_dir: Optional[Path] = None) -> Dict[str, Any]:
    """One optimizer run in a fresh process; its result document plus the load before it started.

    The run's log (every critique, candidate score and new best prompt) goes to ``log_dir/ALGORITHM.log`` when a
    directory is given.
    """
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "examples.apo.room_selector_apo", "--algorithm", algorithm]
        command += ["--output", str(output), *extra]
        load = os.getloadavg()
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - started
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / f"{algorithm}.log").write_text(completed.stderr, encoding="utf-8")
        if completed.returncode != 0:
            return {"algorithm": algorithm, "error": completed.stderr[-4000:], "returncode": completed.returncode}
        result = json.loads(output.read_text(encoding="utf-8"))
    result["load_before"] = list(load)
    result["process_wall_seconds"] = wall
    return result


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["fewshot", "apo", "pareto"])
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each run's log here")
    args, extra = parser.parse_known_args(argv)
    runs: List[Dict[str, Any]] = []
    for algorithm in args.algorithms:
        runs.append(run_one(algorithm, extra, args.log_dir))
    document = {
        "benchmark": "apo_room_selector",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "extra_args": extra,
        "runs": runs,
    }
    text = json.dumps(document, indent=1)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
