"""The reward on every task of the shipped Flow-GRPO dataset, whatever the data files hold when the test runs.

For each task: its gold answers score 1, and neither the question copied back nor the arithmetic written in it does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from examples.flow_grpo.reward import RuleReward, gold_answers
from examples.flow_grpo.tools.calculator import extract_expression

DATA_DIR = Path(__file__).resolve().parents[2] / "examples" / "flow_grpo" / "data"


def _tasks() -> List[Dict[str, Any]]:
    tasks = []
    for path in sorted(DATA_DIR.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "question" in record:  # the corpus file holds passages, not tasks
                tasks.append(record)
    return tasks


TASKS = _tasks()


def test_the_shipped_files_hold_tasks() -> None:
    assert len(TASKS) > 100


@pytest.mark.parametrize("task", TASKS, ids=lambda task: f"{task.get('source')}-{task.get('id')}")
def test_gold_scores_1_and_copies_of_the_question_score_0(task: Dict[str, Any]) -> None:
    reward = RuleReward()
    golds = gold_answers(task)
    assert golds
    for gold in golds:
        assert reward(task, gold) == 1.0, gold
    question = task["question"]
    assert reward(task, question) == 0.0
    assert reward(task, question.rstrip("?.!")) == 0.0
    expression = extract_expression(question)
    if expression is not None:
        assert reward(task, expression) == 0.0, expression
        assert reward(task, f"The answer is {expression}.") == 0.0, expression
