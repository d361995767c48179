"""A resumed run's ``metrics.jsonl`` whose last line a killed process cut short: the run's log and reward curve."""

from __future__ import annotations

import json
from pathlib import Path

from agentbolt.algorithm.grpo.metrics import TrainingLogger


def test_a_resumed_run_drops_a_last_line_cut_short_and_still_draws_its_reward_curve(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text(
        '{"step": 1, "reward/mean": 0.25}\n{"step": 2, "reward/mean": 0.5}\n{"step": 3, "reward/me'  # killed here
    )
    metrics = TrainingLogger(log_dir=str(tmp_path), total_steps=3, start_step=2, console=False, resumed=True)
    metrics.log(3, {"reward/mean": 0.75})
    metrics.close()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in records] == [(1, 0.25), (2, 0.5), (3, 0.75)]
