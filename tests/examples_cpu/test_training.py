"""Each trained example's ``train.py`` end to end on a tiny random model (seconds), and the held-out statistics.

The tiny model answers nonsense, so the rewards are 0: the run checks the plumbing (GRPO under the Trainer, runner
processes, the MCP servers, LangGraph, the held-out passes read back from the store), not learning. Learning runs
on the embedded model are the ``train.py`` commands of each README.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.common.heldout import TaskScore, compare, format_table, wilson_interval

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
    assert rows[5].change == pytest.approx(0.25) and rows[5].change_low == pytest.approx(0.25)
    table = format_table(rows)
    assert "| all | accuracy | 20 | 25.0 [" in table and "+50.0" in table
    assert compare(_pass({1}), _pass({1})) == compare(_pass({1}), _pass({1}))  # seeded: reproducible


def test_compare_refuses_passes_over_different_tasks() -> None:
    with pytest.raises(ValueError, match="same"):
        compare(_pass({1}), _pass({1})[:-1])
    with pytest.raises(ValueError):
        compare([], [])
