"""The name formatter's grader against adversarial answers, its splits, and a whole few-shot run on a tiny model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples.apo.name_formatter import (
    SPLIT_SIZES,
    grade_name,
    make_name_tasks,
    name_task_slices,
    prompt_template_names_baseline,
)

TASK = next(task for task in make_name_tasks("val") if task["shape"] == "first-middle-last")
GOLD = TASK["expected"]
OTHER = next(task["expected"] for task in make_name_tasks("val") if task["expected"] != GOLD)


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        (GOLD, 1.0),
        (f"  {GOLD}\n", 1.0),
        (f'"{GOLD}"', 1.0),
        (f"`{GOLD}`", 1.0),
        (f"Answer: {GOLD}", 1.0),
        (f"name:{GOLD}", 1.0),
        (None, 0.0),
        ("", 0.0),
        ("   ", 0.0),
        (TASK["name"], 0.0),  # the request copied back
        (prompt_template_names_baseline().format(name=TASK["name"]), 0.0),  # the whole prompt copied back
        (GOLD.upper(), 0.0),
        (f"{GOLD} or {OTHER}", 0.0),  # several candidates
        (f"{GOLD}\n{OTHER}", 0.0),  # several candidates, one per line
        (f"{OTHER}, {GOLD}", 0.0),  # the gold among distractors
        (GOLD + " " + "x" * 100_000, 0.0),  # very long
        ("x" * 100_000 + GOLD, 0.0),
        (" ".join(GOLD.split()[::2]), 0.0),  # the middle name dropped
        (f"{GOLD}.", 0.0),
        (f"The name is {GOLD}.", 0.0),  # a sentence around it
        (f"'{GOLD}\"", 0.0),  # unmatched quotes
    ],
)
def test_grader_against_adversarial_answers(answer: Any, reward: float) -> None:
    assert grade_name(answer, GOLD) == reward


def test_a_request_is_the_lowercase_name_and_its_shape_is_its_slice() -> None:
    assert TASK["name"] == GOLD.lower() and TASK["name"] != GOLD and len(GOLD.split()) == 3
    assert name_task_slices(TASK) == ["first-middle-last"]


def test_splits_are_deterministic_and_share_no_name_part_or_answer() -> None:
    splits = {split: make_name_tasks(split) for split in SPLIT_SIZES}
    assert splits == {split: make_name_tasks(split) for split in SPLIT_SIZES}
    assert {split: len(tasks) for split, tasks in splits.items()} == SPLIT_SIZES
    parts = {split: {part for task in tasks for part in task["expected"].split()} for split, tasks in splits.items()}
    answers = {split: {task["expected"] for task in tasks} for split, tasks in splits.items()}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not parts[a] & parts[b] and not answers[a] & answers[b], (a, b)
    for tasks in splits.values():
        assert len({task["name"] for task in tasks}) == len(tasks)
        assert {task["shape"] for task in tasks} == {"first-last", "first-middle-last"}
        most_common = Counter(task["expected"] for task in tasks).most_common(1)[0][1]
        assert most_common / len(tasks) <= 0.05  # no constant answer scores more than a few percent
    with pytest.raises(ValueError, match="split must be"):
        make_name_tasks("dev")


def test_the_seed_prompt_only_states_the_rule() -> None:
    seed = prompt_template_names_baseline()
    assert not seed.examples and seed.format(name="ada lovelace").endswith("\nName: ada lovelace")
    assert "Ada" not in seed.template and "Lovelace" not in seed.template


def test_a_whole_run_on_a_tiny_model_through_the_runners_and_a_sqlite_store(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.models import serving

    from examples.apo.fewshot_names import main

    with serving(tiny_model_dir) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "local")
        store = tmp_path / "names.sqlite"
        output = tmp_path / "result.json"
        options = ["--limit", "4", "--val-batch-size", "2", "--runners", "2", "--bootstrap-repeats", "1"]
        report = main(["--hosted", "--agent-model", "tiny", *options, "--store", str(store), "--output", str(output)])
    assert output.exists() and store.exists()
    search = report["search"]
    # seed on the 4 val requests, then 4 bootstrap runs; a random model earns no demonstration, so the seed stays
    assert search["rollouts"] >= 8 and search["rollouts_failed"] == 0 and search["rollouts_timed_out"] == 0
    assert report["best_prompt"] == prompt_template_names_baseline().template
    for key in ("test_seed", "test_best"):
        assert report[key]["all"]["total"] == 4 and set(report[key]) >= {"all", "first-last"}
        assert all(0.0 <= slice_["ci95"][0] <= slice_["ci95"][1] <= 1.0 for slice_ in report[key].values())
    assert report["test_constant_answer"]["score"] == 0.25  # four requests, four different answers
    assert "echo_checks" in search and report["agent_model"] == "tiny"
