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


async def _store_with_validation_passes(tasks: List[Dict[str, Any]]) -> Any:
    """Pass 0: every question recorded, the first solved. Pass 1: the first solved, the other rollouts failed."""
    from support.flow_grpo import add_solve_record

    from agentbolt.store.memory import InMemoryLightningStore

    store = InMemoryLightningStore()
    for step in (0, 1):
        for index, task in enumerate(tasks):
            rollout = await store.start_rollout(task, mode="val", metadata={"grpo_group": f"val-{step}-{index}"})
            rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
            status = "succeeded" if step == 0 or index == 0 else "failed"
            if status == "succeeded":
                record = {
                    "id": task["id"], "source": task["source"], "question": task["question"], "gold": ["g"],
                    "answer": "g", "reward": 1.0 if index == 0 else 0.0, "planner_turns": 1, "tool_calls": 1,
                    "stop_reason": "planner", "steps": [{"turn": 1, "tool": "search", "sub_goal": ""}],
                }  # fmt: skip
                await add_solve_record(store, rid, aid, record)
            await store.update_attempt(rid, aid, status=status)
            await store.update_rollout(rid, status=status)
    return store


def test_the_summary_counts_a_held_out_question_whose_rollout_failed_as_unsolved(tmp_path: Path) -> None:
    import asyncio
    from types import SimpleNamespace

    from examples.flow_grpo.reward import RuleReward

    tasks = [
        {"id": i, "question": f"Who founded town {i}?", "source": "multihop", "extra_info": {"ground_truth": ["g"]}}
        for i in range(4)
    ]
    history = [{"step": 0, "val/accuracy": 0.25}, STEP_ONE_TRAIN, {"step": 1, "val/accuracy": 0.25}]
    summary = _summary(history, 1, tmp_path)
    store = asyncio.run(_store_with_validation_passes(tasks))
    flow_train._add_evaluation(summary, store, tasks, SimpleNamespace(reward=RuleReward()), tmp_path)
    assert summary.evaluation is not None
    after = {row.source: (row.solved, row.total) for row in summary.evaluation.after}
    assert after == {"multihop": (1, 4), "all": (1, 4)}  # not 1/1: the three failed rollouts count
    assert summary.evaluation.after[-1].rate == summary.final_val_success
    assert summary.evaluation.loop_after.stop_reasons == {"rollout failed": 3, "planner": 1}
