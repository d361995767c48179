"""The demo's held-out split shares no question with training, not even reordered."""

from __future__ import annotations

import pytest
from support.split_overlap import describe, find_overlaps

from agentbolt.demo.task import ArithmeticTask, answer_instruction, make_splits, question_key


def _asked(task: ArithmeticTask) -> str:
    """The question without the answer-format sentence every question ends with (it says nothing about the task)."""
    return task["question"].replace(answer_instruction(), "").strip()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_no_held_out_question_repeats_a_training_question(seed: int) -> None:
    train, val = make_splits(256, 48, seed=seed)  # the demo's sizes
    overlaps = find_overlaps([_asked(t) for t in train], [_asked(t) for t in val])
    assert overlaps == [], describe(overlaps)


def test_reorderings_and_the_same_numbers_share_a_key() -> None:
    def task(expression: str) -> ArithmeticTask:
        return ArithmeticTask(id="t", question=f"What is {expression}?", expression=expression, answer=0)

    assert question_key(task("37 * 12")) == question_key(task("12 * 37")) == (12, 37)
    assert len({question_key(task(e)) for e in ("512 + 300", "300 + 512", "512 - 300", "300 - 512")}) == 1
    assert question_key(task("37 * 12")) != question_key(task("37 * 13"))


def test_the_held_out_split_does_not_depend_on_the_training_size() -> None:
    assert make_splits(10, 48, seed=0)[1] == make_splits(256, 48, seed=0)[1]
