"""Held-out evaluation helpers: Wilson intervals, per-source success, loop statistics, the copied-question check."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from examples.flow_grpo.evaluation import (
    compare,
    copied_question_credit,
    format_trajectory,
    loop_stats,
    pick_examples,
    source_success,
    trajectories_markdown,
    wilson_interval,
)
from examples.flow_grpo.reward import RuleReward


@pytest.mark.parametrize(
    ("successes", "total", "low", "high"),
    [
        # Reference values of the Wilson score interval at z = 1.96.
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (12, 36, 0.2021, 0.4967),
        (41, 100, 0.3187, 0.5080),
    ],
)
def test_wilson_interval_matches_reference_values(successes: int, total: int, low: float, high: float) -> None:
    got_low, got_high = wilson_interval(successes, total)
    assert got_low == pytest.approx(low, abs=1e-4) and got_high == pytest.approx(high, abs=1e-4)


def test_wilson_interval_edge_cases() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(1, 1, z=1.0)
    assert 0.0 < low < 1.0 == high
    for bad in ((-1, 3), (4, 3)):
        with pytest.raises(ValueError, match="successes"):
            wilson_interval(*bad)


def _record(index: int, source: str, reward: float, tools: List[str], stop: str = "verifier") -> Dict[str, Any]:
    steps = [
        {"turn": t + 1, "tool": tool, "sub_goal": f"goal {t}", "tool_input": "x", "result": "r", "verifier_stop": None}
        for t, tool in enumerate(tools)
    ]
    return {
        "index": index,
        "id": index,
        "source": source,
        "question": f"question {index}?",
        "gold": ["g"],
        "answer": "g" if reward else "h",
        "reward": reward,
        "planner_turns": len(tools),
        "tool_calls": len([t for t in tools if t != "finish"]),
        "stop_reason": stop,
        "steps": steps,
    }


def test_source_success_counts_per_source_then_all() -> None:
    records = [_record(0, "b", 1.0, ["search"]), _record(1, "a", 0.0, ["finish"]), _record(2, "b", 0.0, ["search"])]
    rows = source_success(records)
    assert [(r.source, r.solved, r.total) for r in rows] == [("a", 0, 1), ("b", 1, 2), ("all", 1, 3)]
    assert rows[1].rate == 0.5 and (rows[1].low, rows[1].high) == wilson_interval(1, 2)
    assert rows[2].text().startswith("1/3 = 33.3 % [")


def test_loop_stats_average_turns_and_count_stop_reasons() -> None:
    records = [_record(0, "a", 1.0, ["search", "search"]), _record(1, "a", 0.0, ["finish"], stop="planner")]
    stats = loop_stats(records)
    assert stats.mean_planner_turns == 1.5 and stats.mean_tool_calls == 1.0
    assert stats.stop_reasons == {"verifier": 1, "planner": 1}
    assert stats.first_actions == {"search": 1, "finish": 1}
    with pytest.raises(ValueError, match="no solve records"):
        loop_stats([])


def test_examples_prefer_questions_training_fixed_from_different_sources() -> None:
    before = [
        _record(0, "a", 1.0, ["search"]),
        _record(1, "a", 0.0, ["finish"]),
        _record(2, "a", 0.0, ["finish"]),
        _record(3, "b", 0.0, ["finish"]),
    ]
    after = [
        _record(0, "a", 1.0, ["search"]),
        _record(1, "a", 1.0, ["search"]),
        _record(2, "a", 1.0, ["search"]),
        _record(3, "b", 1.0, ["python"]),
    ]
    assert pick_examples(before, after) == [1, 3]
    # Nothing fixed: questions whose trajectory changed, then the first ones.
    assert pick_examples(before[:2], [after[0], _record(1, "a", 0.0, ["search"])]) == [1, 0]
    comparison = compare(before, after)
    assert comparison.example_indices == [1, 3]
    assert comparison.before[-1].solved == 1 and comparison.after[-1].solved == 4
    text = trajectories_markdown(before, after, [1])
    assert "## Question 1" in text and "planner -> `finish`" in text and "planner -> `search` (goal 0)" in text


def test_format_trajectory_shows_plan_tool_and_verifier() -> None:
    record = _record(0, "multihop", 1.0, ["search"])
    record["steps"][0]["verifier_stop"] = True
    text = format_trajectory(record)
    assert "input `x` -> r" in text and "verifier: stop" in text and "answer: **g** (stop: verifier, reward 1)" in text


def test_copied_question_check_scores_the_question_and_its_expression() -> None:
    tasks = [
        {"id": 1, "question": "Which event was held in the year 927 + 785?", "source": "calc_lookup",
         "extra_info": {"ground_truth": ["Daybreak Accord"]}},
        {"id": 2, "question": "How many years did Ada Brask live?", "source": "lookup_calc",
         "extra_info": {"ground_truth": ["61"]}},
    ]  # fmt: skip
    check = copied_question_credit(tasks, RuleReward())
    assert (check.tasks, check.candidates, check.credited) == (2, 3, 0)

    def lenient(task: Any, answer: str) -> float:  # a reward that credits any answer holding the expression
        return 1.0 if "927 + 785" in answer else 0.0

    loose = copied_question_credit(tasks, lenient)
    assert loose.credited == 2 and loose.examples[0].startswith("task 1: ")
