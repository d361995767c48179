"""Each trained example's ``train.py`` end to end on a tiny random model (seconds), and the held-out statistics.

The tiny model answers nonsense, so the rewards are 0: the run checks the plumbing (GRPO under the Trainer, runner
processes, the MCP servers, LangGraph, the held-out passes read back from the store), not learning. Learning runs
on the embedded model are the ``train.py`` commands of each README.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from examples.common.heldout import (
    MIN_BOOTSTRAP_TASKS,
    TaskScore,
    change_interval,
    compare,
    format_table,
    hoeffding_interval,
    mean_interval,
    paired_change_interval,
    wilson_interval,
)

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("mcp")
pytest.importorskip("langgraph")


@pytest.mark.parametrize("example", ["calc", "sql", "rag", "search_r1"])
def test_train_runs_on_a_tiny_model(example: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    import importlib

    spec = importlib.import_module(f"examples.{example}.train").SPEC
    argv = [
        "--model", str(tiny_model_dir), "--dtype", "float32", "--steps", "1", "--batch-size", "1",
        "--group-size", "2", "--runners", "2", "--n-train", "1", "--n-test", "1", "--max-tokens", "6",
        "--micro-batch-size", "4", "--no-gradient-checkpointing", "--threads", "1", "--quiet",
        "--output-dir", str(tmp_path / "runs"),
        "--result-name", f"{example}_smoke", "--results-dir", str(tmp_path / "results"),
    ]  # fmt: skip
    result = importlib.import_module(f"examples.{example}.train").run(argv)
    assert result.example == spec.name and result.steps == 1 and result.train_rollouts == 2
    assert result.n_test == 1
    overall = result.row("all", "accuracy")
    assert overall["n"] == 1 and 0.0 <= overall["before"] <= 1.0 and 0.0 <= overall["after"] <= 1.0
    for metric in spec.metrics:
        result.row("all", metric)
    summary = json.loads((Path(result.run_dir) / "summary.json").read_text())
    assert summary["all_accuracy"] == overall
    assert Path(result.checkpoint_dir or "").is_dir()
    recorded = json.loads((tmp_path / "results" / f"{example}_smoke.json").read_text())
    assert "examples." + example + ".train" in json.dumps(recorded)


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def _pass(correct: set, f1: float = 0.5) -> list:
    return [
        TaskScore(task_id=f"t{i}", slice="a" if i < 10 else "b", scores={"accuracy": float(i in correct), "f1": f1})
        for i in range(20)
    ]


def test_compare_pairs_tasks_per_slice_and_overall() -> None:
    rows = compare(_pass(set(range(5))), _pass(set(range(15)), f1=0.75), metrics=("accuracy", "f1"))
    assert [(r.slice, r.metric) for r in rows] == [
        ("a", "accuracy"), ("a", "f1"), ("b", "accuracy"), ("b", "f1"), ("all", "accuracy"), ("all", "f1"),
    ]  # fmt: skip
    overall = rows[4]
    assert (overall.n, overall.before, overall.after, overall.change) == (20, 0.25, 0.75, 0.5)
    # Every task either stayed or improved: the paired interval of the change excludes 0.
    assert 0.0 < overall.change_low <= overall.change <= overall.change_high
    # Every task's F1 rose by exactly 0.25: a bootstrap would shrink to that point; the bound keeps a width.
    assert rows[5].change == pytest.approx(0.25) and rows[5].change_low < 0.25 < rows[5].change_high
    table = format_table(rows)
    assert "| all | accuracy | 20 | 25.0 [" in table and "+50.0" in table
    assert compare(_pass({1}), _pass({1})) == compare(_pass({1}), _pass({1}))  # seeded: reproducible


def _accuracy_passes(before: list, after: list, name: str = "s") -> tuple:
    def scores(values: list) -> list:
        return [TaskScore(f"t{i}", name, {"accuracy": float(v)}) for i, v in enumerate(values)]

    return scores(before), scores(after)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ([0], [1]),  # one task going from wrong to right
        ([1], [0]),
        ([0] * 6, [1] * 6),  # every task flipping
        ([1] * 5, [1] * 5),  # all right both times
        ([0] * 5, [0] * 5),  # all wrong both times
        ([1, 0, 0], [1, 1, 0]),
        ([1] * 10 + [0] * 10, [1] * 10 + [0] * 10),  # no task changed
    ],
)
def test_the_change_in_accuracy_has_an_interval_of_positive_width_holding_it(before: list, after: list) -> None:
    row = compare(*_accuracy_passes(before, after))[-1]
    assert row.change == pytest.approx((sum(after) - sum(before)) / len(before))
    assert -1.0 <= row.change_low < row.change_high <= 1.0
    assert row.change_low <= row.change <= row.change_high


def test_the_paired_accuracy_interval_is_newcombes_method_10() -> None:
    # 14 tasks right both times, 5 right only after, 22 wrong both times; the limits worked by hand from the method
    # (Wilson limits of 19/41 and 14/41, phi = (14 * 22 - 41 / 2) / sqrt(14 * 27 * 19 * 22)).
    low, high = paired_change_interval([1] * 14 + [0] * 27, [1] * 19 + [0] * 22)
    assert (low, high) == (pytest.approx(0.0115, abs=1e-4), pytest.approx(0.2265, abs=1e-4))
    # One task from wrong to right: the Wilson limits of 0/1 and 1/1, uncorrelated (a margin is empty).
    low, high = paired_change_interval([0], [1])
    assert high == 1.0 and low == pytest.approx(1 - (2 * (1 - wilson_interval(1, 1)[0]) ** 2) ** 0.5)
    assert paired_change_interval([], []) == (-1.0, 1.0)
    with pytest.raises(ValueError, match="0/1"):
        paired_change_interval([0.5], [1.0])


def test_agreement_between_passes_narrows_the_paired_interval() -> None:
    # Same margins (10 of 20 right before, 14 after); in the first pair of passes every task right before stays right.
    agreeing = paired_change_interval([1] * 10 + [0] * 10, [1] * 14 + [0] * 6)
    crossing = paired_change_interval([1] * 10 + [0] * 10, [0] * 6 + [1] * 14)
    assert agreeing[1] - agreeing[0] < crossing[1] - crossing[0]


@pytest.mark.parametrize("n", [1, 2, 5, MIN_BOOTSTRAP_TASKS - 1])
def test_a_continuous_score_over_too_few_tasks_gets_a_bound_not_a_bootstrap(n: int) -> None:
    before, after = [0.3] * n, [0.8] * n
    low, high = mean_interval(before, binary=False)
    assert (low, high) == hoeffding_interval(before, 0.0, 1.0) and low < 0.3 < high
    low, high = change_interval(before, after, binary=False)
    assert (low, high) == hoeffding_interval([0.5] * n, -1.0, 1.0) and low < 0.5 < high
    assert f"| s | f1 | {n}* |" in format_table(compare(*_f1_passes(before, after), metrics=("accuracy", "f1")))


def _f1_passes(before: list, after: list) -> tuple:
    def scores(values: list) -> list:
        return [TaskScore(f"t{i}", "s", {"accuracy": 0.0, "f1": v}) for i, v in enumerate(values)]

    return scores(before), scores(after)


def test_hoeffdings_bound_narrows_with_n_and_spans_the_range_for_one_task() -> None:
    assert hoeffding_interval([0.5], 0.0, 1.0) == (0.0, 1.0)
    widths = [hoeffding_interval([0.5] * n, 0.0, 1.0) for n in (4, 16, 64)]
    assert widths[0][1] - widths[0][0] > widths[1][1] - widths[1][0] > widths[2][1] - widths[2][0] > 0
    _, high = hoeffding_interval([0.5] * 64, 0.0, 1.0)  # half-width sqrt(ln(40) / 128)
    assert high - 0.5 == pytest.approx(math.sqrt(math.log(40) / 128))


def test_a_continuous_score_over_enough_varied_tasks_keeps_the_paired_bootstrap() -> None:
    before = [0.1 * (i % 5) for i in range(30)]
    after = [min(1.0, x + 0.1 * (i % 3)) for i, x in enumerate(before)]
    change = sum(after) / 30 - sum(before) / 30
    low, high = change_interval(before, after, binary=False)
    assert low < change < high and high - low < 0.2  # far narrower than Hoeffding's bound at n = 30


def test_compare_refuses_passes_over_different_tasks() -> None:
    with pytest.raises(ValueError, match="same"):
        compare(_pass({1}), _pass({1})[:-1])
    with pytest.raises(ValueError):
        compare([], [])
