"""Held-out success counts every held-out task: a failed or missing rollout is an unsolved question, never dropped."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest
from support.flow_grpo import add_solve_record

from agentbolt.store.memory import InMemoryLightningStore
from examples.flow_grpo.evaluation import (
    compare,
    complete_pass,
    loop_stats,
    read_validation_records,
    source_success,
)

TASKS = [
    {"id": 100 + i, "question": f"question {i}?", "source": "multihop", "extra_info": {"ground_truth": ["g"]}}
    for i in range(10)
]


def _record(index: int, reward: float) -> Dict[str, Any]:
    return {
        "index": index,
        "id": 100 + index,
        "source": "multihop",
        "question": f"question {index}?",
        "gold": ["g"],
        "answer": "g" if reward else "h",
        "reward": reward,
        "planner_turns": 2,
        "tool_calls": 1,
        "stop_reason": "planner",
        "steps": [{"turn": 1, "tool": "search", "sub_goal": "", "tool_input": "x", "result": "r"}],
    }


BEFORE = [_record(i, 1.0 if i < 3 else 0.0) for i in range(10)]  # 3 of 10 solved
AFTER = [_record(i, 1.0) for i in range(4)]  # 6 rollouts left no record; the 4 recorded ones are solved


def _all(rows: List[Any]) -> str:
    return next(row.text() for row in rows if row.source == "all")


def test_a_held_out_task_without_a_record_counts_as_unsolved() -> None:
    assert _all(source_success(AFTER, TASKS)).startswith("4/10 = 40.0 %")


def test_the_comparison_counts_every_held_out_task_in_both_passes() -> None:
    comparison = compare(BEFORE, AFTER, TASKS)
    assert [(r.solved, r.total) for r in comparison.before] == [(3, 10), (3, 10)]
    assert [(r.solved, r.total) for r in comparison.after] == [(4, 10), (4, 10)]


def test_passes_of_different_tasks_are_refused_without_the_task_list() -> None:
    with pytest.raises(ValueError, match="held-out tasks"):
        compare(BEFORE, AFTER)


def test_a_record_of_a_failed_rollout_counts_as_unsolved_whatever_its_reward() -> None:
    failed = {**_record(0, 1.0), "failed": True}
    assert [(r.solved, r.total) for r in source_success([failed, _record(1, 1.0)])][-1] == (1, 2)


def test_a_completed_pass_names_each_missing_task_by_its_own_id_and_source() -> None:
    records = complete_pass(AFTER, TASKS)
    assert [r["index"] for r in records] == list(range(10))
    missing = records[7]
    assert (missing["id"], missing["source"], missing["reward"], missing["stop_reason"]) == (
        107,
        "multihop",
        0.0,
        "rollout missing",
    )
    with pytest.raises(ValueError, match="task indices \\[10\\]"):
        complete_pass([_record(10, 1.0)], TASKS)


def test_loop_statistics_average_the_recorded_solves_and_count_the_failed_ones() -> None:
    stats = loop_stats(complete_pass(AFTER, TASKS))
    assert stats.mean_planner_turns == 2.0 and stats.first_actions == {"search": 4}
    assert stats.stop_reasons == {"rollout missing": 6, "planner": 4}


async def _store_with_a_failed_validation_rollout() -> InMemoryLightningStore:
    store = InMemoryLightningStore()
    outcomes = [("succeeded", 1.0), ("failed", None), ("failed", 1.0), ("succeeded", None)]
    for index, (status, reward) in enumerate(outcomes):
        rollout = await store.start_rollout(TASKS[index], mode="val", metadata={"grpo_group": f"val-0-{index}"})
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        if reward is not None:  # the solve record (the third rollout records a solve, then fails)
            await add_solve_record(store, rid, aid, _record(index, reward))
        await store.update_attempt(rid, aid, status=status)
        await store.update_rollout(rid, status=status)
    return store


def test_validation_records_read_from_a_store_include_failed_rollouts_as_unsolved() -> None:
    store = asyncio.run(_store_with_a_failed_validation_rollout())
    [records] = read_validation_records(store).values()
    assert [(r["index"], r["reward"], bool(r.get("failed"))) for r in records] == [
        (0, 1.0, False),
        (1, 0.0, True),
        (2, 0.0, True),
        (3, 0.0, True),
    ]
    assert [r["stop_reason"] for r in records[1:]] == ["rollout failed", "rollout failed", "rollout without record"]
    assert [(r.solved, r.total) for r in source_success(records)][-1] == (1, 4)
