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
    "DEMONSTRATIONS",
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
_PRODUCT_OPERANDS = range(12, 100)
_SUM_OPERANDS = range(100, 1000)


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


def _task(task_id: str, a: int, operator: str, b: int) -> ArithmeticTask:
    expression = f"{a} {operator} {b}"
    answer = a * b if operator == "*" else a + b if operator == "+" else a - b
    question = f"What is {expression}? {answer_instruction()}"
    return ArithmeticTask(id=task_id, question=question, expression=expression, answer=answer)


DEMONSTRATIONS: Tuple[ArithmeticTask, ...] = (_task("demo-1", 11, "*", 13), _task("demo-2", 250, "+", 375))
"""The questions of the worked conversations shown before every question (``agentbolt.demo.agent.FEW_SHOT``).

:func:`make_splits` never generates a question over their numbers: the prompt shows their answers."""


def make_task(rng: random.Random, task_id: str) -> ArithmeticTask:
    """Draw one question: two 2- or 3-digit operands and ``+``, ``-`` or ``*`` (results up to 6 digits).

    Multiplication dominates: it is what a 135M model cannot do in its head, so the calculator matters.
    """
    operator = rng.choice(["*", "*", "+", "-"])
    operands = _PRODUCT_OPERANDS if operator == "*" else _SUM_OPERANDS
    a, b = rng.randint(operands.start, operands.stop - 1), rng.randint(operands.start, operands.stop - 1)
    return _task(task_id, a, operator, b)


def question_key(task: ArithmeticTask) -> Tuple[int, ...]:
    """What a question is about, whatever the order or operator it is written with: its operands, sorted.

    ``37 * 12`` and ``12 * 37`` are the same question (the operator commutes); ``512 + 300``, ``300 + 512``,
    ``512 - 300`` and ``300 - 512`` are the same two numbers, and a model that has trained on one has seen the
    other's numbers in the same place. All of them share one key.
    """
    return tuple(sorted(int(operand) for operand in _OPERANDS.findall(task["expression"])))


def _distinct_questions(excluded: set[Tuple[int, ...]]) -> int:
    """How many questions :func:`make_task` can draw that differ by :func:`question_key`, ``excluded`` keys aside."""
    drawable = 0
    for operands in (_PRODUCT_OPERANDS, _SUM_OPERANDS):
        n = len(operands)
        taken = sum(1 for key in excluded if all(operand in operands for operand in key))
        drawable += n * (n + 1) // 2 - taken  # unordered pairs, a number with itself included
    return drawable


def make_splits(n_train: int, n_val: int, seed: int = 0) -> Tuple[List[ArithmeticTask], List[ArithmeticTask]]:
    """Generate ``n_train`` training and ``n_val`` held-out questions from ``seed``.

    The same arguments always give the same tasks. No two questions share a :func:`question_key`, so no
    validation question is a training question reordered (``12 * 37`` / ``37 * 12``) or over the same numbers;
    nor is any question over the numbers of a worked example (:data:`DEMONSTRATIONS`).

    Raises:
        ValueError: A size is negative, or the sizes ask for more distinct questions than there are.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be non-negative, got n_train={n_train}, n_val={n_val}")
    seen: set[Tuple[int, ...]] = {question_key(task) for task in DEMONSTRATIONS}
    available = _distinct_questions(seen)
    if n_train + n_val > available:
        raise ValueError(f"n_train + n_val = {n_train + n_val}, but only {available} distinct questions exist")
    rng = random.Random(seed)
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
    (reasoning) is allowed; text after it is not. A number of thousands of digits gives None too.
    """
    if not text or text.upper().count("ANSWER:") != 1:
        return None
    match = ANSWER_PATTERN.fullmatch(text.strip().splitlines()[-1].strip())
    if match is None:
        return None
    try:
        return int(match.group(1).replace(",", ""))
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits): no task's answer
        return None
