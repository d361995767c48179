"""``benchmarks/queue_wait_bench.py`` at a few rollouts: both kinds of runners claim every rollout, and the result
file holds their claim delays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_waiting_and_sleeping_runners_are_timed_side_by_side(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/queue_wait_bench.py", "--runners", "2", "--poll-interval", "0.5"]
    command += ["--rollouts", "2", "--rounds", "1", "--results-dir", str(tmp_path), "--result-name", "queue-wait"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "queue-wait.json").read_text())["results"]
    assert set(results["modes"]) == {"wait", "sleep"}
    for mode in results["modes"].values():
        delays = mode["claim_delay_ms"]
        assert mode["rollouts"] == 2 and 0 <= delays["p50"] <= delays["max"]
