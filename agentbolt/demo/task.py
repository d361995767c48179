"""The demo task: arithmetic questions the agent answers with a calculator tool.

Tasks are plain JSON-able dicts (they travel through the store as rollout inputs). They are generated from a fixed
seed, and the training and held-out validation splits never share a question, not even reordered
(:func:`question_key`).
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
    "question_key",
]

ANSWER_PATTERN = re.compile(r"ANSWER:[ \t]*(-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+))[ \t]*\.?[ \t]*")
"""The required final-answer line, matched in full: ``ANSWER: <integer>`` (commas between groups of three digits
allowed, one trailing period tolerated) and nothing else."""

_OPERATORS: Dict[str, str] = {"+": "plus", "-": "minus", "*": "times"}
_OPERANDS = re.compile(r"\d+")


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


def question_key(task: ArithmeticTask) -> Tuple[int, ...]:
    """What a question is about, whatever the order or operator it is written with: its operands, sorted.

    ``37 * 12`` and ``12 * 37`` are the same question (the operator commutes); ``512 + 300``, ``300 + 512``,
    ``512 - 300`` and ``300 - 512`` are the same two numbers, and a model that has trained on one has seen the
    other's numbers in the same place. All of them share one key.
    """
    return tuple(sorted(int(operand) for operand in _OPERANDS.findall(task["expression"])))


def make_splits(n_train: int, n_val: int, seed: int = 0) -> Tuple[List[ArithmeticTask], List[ArithmeticTask]]:
    """Generate ``n_train`` training and ``n_val`` held-out questions from ``seed``.

    The same arguments always give the same tasks. No two questions share a :func:`question_key`, so no
    validation question is a training question reordered (``12 * 37`` / ``37 * 12``) or over the same numbers.

    Raises:
        ValueError: A size is negative.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be non-negative, got n_train={n_train}, n_val={n_val}")
    rng = random.Random(seed)
    seen: set[Tuple[int, ...]] = set()
    tasks: List[ArithmeticTask] = []
    while len(tasks) < n_train + n_val:
        split, index = ("val", len(tasks)) if len(tasks) < n_val else ("train", len(tasks) - n_val)
        task = make_task(rng, f"{split}-{index}")
        key = question_key(task)
        if key in seen:
            continue
        seen.add(key)
        tasks.append(task)
    return tasks[n_val:], tasks[:n_val]


def parse_answer(text: Optional[str]) -> Optional[int]:
    """The integer the message commits to: its last non-empty line must be ``ANSWER: <n>`` and nothing else.

    Returns None (no answer, so no reward) when there is no such line, when ``ANSWER:`` appears more than once in
    any letter case (several answers are a hedge), or when the line holds anything but one integer: an expression
    (``37 * 12``), several numbers (``443 or 444``), a decimal, a percentage or a question mark. Text before the line
    (reasoning) is allowed; text after it is not.
    """
    if not text or text.upper().count("ANSWER:") != 1:
        return None
    match = ANSWER_PATTERN.fullmatch(text.strip().splitlines()[-1].strip())
    return int(match.group(1).replace(",", "")) if match else None
