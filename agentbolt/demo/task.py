"""The demo task: arithmetic questions the agent answers with a calculator tool.

Tasks are plain JSON-able dicts (they travel through the store as rollout inputs). They are generated from a fixed
seed, and the training and held-out validation splits never share a question.
"""

from __future__ import annotations

import random
import re
from typing import Dict, List, Optional, Tuple, TypedDict

__all__ = [
    "ArithmeticTask",
    "ANSWER_PATTERN",
    "answer_instruction",
    "make_splits",
    "make_task",
    "parse_answer",
]

ANSWER_PATTERN = re.compile(r"ANSWER:\s*(-?\d+)")
"""The required final-answer format: ``ANSWER: <integer>``."""

_OPERATORS: Dict[str, str] = {"+": "plus", "-": "minus", "*": "times"}


class ArithmeticTask(TypedDict):
    """One question.

    Attributes:
        id: Stable identifier (``"train-17"``, ``"val-3"``).
        question: The user message.
        expression: The expression a calculator call should evaluate (``"37 * 12"``).
        answer: The correct integer result.
    """

    id: str
    question: str
    expression: str
    answer: int


def answer_instruction() -> str:
    """The sentence telling the model how to answer (part of every question)."""
    return "Use the calculator tool, then reply with 'ANSWER: <number>'."


def make_task(rng: random.Random, task_id: str) -> ArithmeticTask:
    """Draw one question: two 2- or 3-digit operands and ``+``, ``-`` or ``*`` (results up to 6 digits).

    Multiplication dominates: it is what a 135M model cannot do in its head, so the calculator matters.
    """
    operator = rng.choice(["*", "*", "+", "-"])
    if operator == "*":
        a, b = rng.randint(12, 99), rng.randint(12, 99)
    else:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
    expression = f"{a} {operator} {b}"
    answer = a * b if operator == "*" else a + b if operator == "+" else a - b
    question = f"What is {expression}? {answer_instruction()}"
    return ArithmeticTask(id=task_id, question=question, expression=expression, answer=answer)


def make_splits(n_train: int, n_val: int, seed: int = 0) -> Tuple[List[ArithmeticTask], List[ArithmeticTask]]:
    """Generate ``n_train`` training and ``n_val`` held-out questions from ``seed``.

    The same arguments always give the same tasks. No expression appears twice, so no validation question is
    ever seen in training.

    Raises:
        ValueError: A size is negative.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be non-negative, got n_train={n_train}, n_val={n_val}")
    rng = random.Random(seed)
    seen: set[str] = set()
    tasks: List[ArithmeticTask] = []
    while len(tasks) < n_train + n_val:
        split, index = ("val", len(tasks)) if len(tasks) < n_val else ("train", len(tasks) - n_val)
        task = make_task(rng, f"{split}-{index}")
        if task["expression"] in seen:
            continue
        seen.add(task["expression"])
        tasks.append(task)
    return tasks[n_val:], tasks[:n_val]


def parse_answer(text: Optional[str]) -> Optional[int]:
    """The integer of the last ``ANSWER: <n>`` in ``text`` (None when there is none)."""
    if not text:
        return None
    found = ANSWER_PATTERN.findall(text)
    return int(found[-1]) if found else None
