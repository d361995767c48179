"""A trained example interrupted before its final validation reports no "after" score and no result file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from examples.common import training
from examples.common.training import ExampleSpec, TrainingConfig

SPEC = ExampleSpec(
    name="toy",
    description="a toy example",
    make_agent=lambda config: object(),
    load_train=lambda: [{"id": "t0"}],
    load_test=lambda: [{"id": "v0"}],
    slice_of=lambda task: "all",
    defaults=TrainingConfig(steps=2),
)


def _fit_stopped_after_step_one(*args: Any, **kwargs: Any) -> Any:
    """What fit_grpo returns after Ctrl-C during step 2: the baseline validation and one step, no final validation."""
    history = [{"step": 0, "val/accuracy": 0.25}, {"step": 1, "train/reward_mean": 0.5, "rollouts/total": 4.0}]
    return SimpleNamespace(config=SimpleNamespace(max_steps=2), history=history)


def test_an_interrupted_run_exits_130_without_an_after_score_or_result_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(training, "fit_grpo", _fit_stopped_after_step_one)
    results = tmp_path / "results"
    argv = ["--output-dir", str(tmp_path / "runs"), "--results-dir", str(results), "--quiet"]
    with pytest.raises(SystemExit) as stopped:
        training.main(SPEC, argv)
    assert stopped.value.code == 130
    assert "after: not measured (interrupted)" in capsys.readouterr().out
    assert not results.exists() or not list(results.iterdir())
    assert not list((tmp_path / "runs").rglob("summary.json"))
