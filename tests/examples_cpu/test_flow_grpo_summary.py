"""The Flow-GRPO run summary reports what was measured and trained: no "after" score without a final validation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from examples.flow_grpo import train as flow_train
from examples.flow_grpo.train import _print_summary, _summarize, load_config

STEP_ONE_TRAIN: Dict[str, Any] = {
    "step": 1,
    "train/reward_mean": 0.5,
    "rollouts/total": 4.0,
    "samples/calls": 10.0,
    "samples/other_agents": 4.0,
    "samples/trained": 0.0,
}


def _summary(history: List[Dict[str, Any]], max_steps: int, tmp_path: Path) -> flow_train.TrainSummary:
    return _summarize(load_config("cpu", {}), history, tmp_path, time.perf_counter(), 4, max_steps)


def test_planner_samples_count_the_samples_trained_on(tmp_path: Path) -> None:
    history = [{"step": 0, "val/accuracy": 0.25}, STEP_ONE_TRAIN, {"step": 1, "val/accuracy": 0.5}]
    summary = _summary(history, 1, tmp_path)
    assert summary.planner_samples == 0  # every group had zero variance: nothing was trained on
    assert summary.final_val_success == 0.5 and not summary.interrupted


def test_a_run_interrupted_before_its_final_validation_has_no_after_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = _summary([{"step": 0, "val/accuracy": 0.25}, STEP_ONE_TRAIN], 1, tmp_path)
    assert summary.interrupted and summary.final_val_success is None
    _print_summary(summary)
    out = capsys.readouterr().out
    assert "not measured (interrupted)" in out and "25.0%" in out


def test_a_run_of_zero_steps_shows_no_after_score(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _summary([{"step": 0, "val/accuracy": 0.25}], 0, tmp_path)
    assert summary.final_val_success is None and not summary.interrupted
    _print_summary(summary)
    assert "success after" not in capsys.readouterr().out


def test_main_exits_130_and_writes_no_summary_when_interrupted(tmp_path: Path, monkeypatch: Any) -> None:
    interrupted = _summary([{"step": 0, "val/accuracy": 0.25}, STEP_ONE_TRAIN], 1, tmp_path)
    monkeypatch.setattr(flow_train, "run_training", lambda *args, **kwargs: interrupted)
    monkeypatch.setattr(flow_train, "exit_cleanly_on_sigterm", lambda: None)  # keep pytest's SIGTERM handling
    summary_json = tmp_path / "summary.json"
    assert flow_train.main(["--summary-json", str(summary_json), "--output-dir", str(tmp_path / "run")]) == 130
    assert not summary_json.exists()
