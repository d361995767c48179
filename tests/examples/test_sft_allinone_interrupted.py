"""The all-in-one SFT run interrupted before its final validation reports no "after" score and no result file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import agentbolt
import agentbolt.serving.transformers_engine


class _StoppedSFT:
    """What SFT holds after Ctrl-C during step 2 of 2: the baseline validation and one step, no final validation."""

    def __init__(self, **options: Any) -> None:
        self.config = SimpleNamespace(max_steps=2)
        self.history = [{"step": 0, "val/correct": 1.0, "val/total": 4.0}, {"step": 1, "update/loss": 0.5}]


class _ReturningTrainer:
    """Trainer.fit returns normally after Ctrl-C."""

    def __init__(self, **kwargs: Any) -> None:
        pass

    def fit(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_an_interrupted_run_exits_130_without_an_after_score_or_result_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from examples.sft.allinone import main

    monkeypatch.setattr(agentbolt, "SFT", _StoppedSFT)
    monkeypatch.setattr(agentbolt, "Trainer", _ReturningTrainer)
    monkeypatch.setattr(agentbolt.serving.transformers_engine, "configure_openmp", lambda: None)
    results = tmp_path / "results"
    argv = ["--output-dir", str(tmp_path / "runs"), "--results-dir", str(results), "--runners", "1"]
    assert main(argv) == 130
    out = capsys.readouterr().out
    assert "after: not measured (interrupted)" in out and "before" not in out
    assert not results.exists() or not list(results.iterdir())
    assert not list((tmp_path / "runs").rglob("summary.json"))
