"""The calc example's task: GSM-style word problems, their shipped splits and the reward.

Each problem is one short story with two numbers and one operation (multiply, add, subtract, divide); the agent
must turn it into a calculator expression and answer with the result. The stories come from *frames*, and the
training and held-out splits use disjoint frames and disjoint operand pairs: no held-out problem is a training
problem reworded or recomputed with the same numbers (:func:`make_splits` checks both).

``python -m examples.calc.task`` rewrites ``data/train.jsonl`` and ``data/test.jsonl`` byte for byte from the seed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, TypedDict

from examples.common.rewards import check_format_credit
from examples.common.tasks import read_tasks

__all__ = [
    "DATA_DIR",
    "FRAMES",
    "OPERATIONS",
    "CalcTask",
    "answer_instruction",
    "load_split",
    "make_splits",
    "parse_answer",
    "reward",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20251120
OPERATIONS = ("multiply", "add", "subtract", "divide")


class CalcTask(TypedDict):
    """One word problem.

    Attributes:
        id: ``train-17`` / ``test-3``.
        question: The story and the question, with the answer instruction.
        operation: The slice: ``multiply``, ``add``, ``subtract`` or ``divide``.
        frame: Which story frame it was written from (training and held-out frames are disjoint).
        expression: What a calculator call should evaluate (``"24 * 36"``).
        answer: The integer result.
    """

    id: str
    question: str
    operation: str
    frame: str
    expression: str
    answer: int


# {a} and {b} are the operands in the order the expression uses them; for "divide", {a} is the total.
FRAMES: Dict[str, List[str]] = {
    "multiply": [
        "A baker fills {a} trays with {b} cookies on each tray. How many cookies are there in all?",
        "A theater has {a} rows with {b} seats in each row. How many seats does the theater have?",
        "Maya reads {b} pages every day for {a} days. How many pages does she read?",
        "A farmer plants {a} rows of corn with {b} plants in each row. How many corn plants are there?",
        "Each of the {a} buses carries {b} students. How many students ride the buses?",
        "A box holds {b} pencils. How many pencils are in {a} boxes?",
        "A parking garage has {a} levels with {b} spaces on each level. How many parking spaces are there?",
        "Leo saves {b} dollars a week for {a} weeks. How many dollars does he save?",
    ],
    "add": [
        "A library had {a} books and bought {b} more. How many books does it have now?",
        "On Monday {a} people visited the museum and on Tuesday {b} people visited. How many visitors came in total?",
        "Sam scored {a} points in the first game and {b} points in the second. How many points did he score?",
        "A train carried {a} passengers in the morning and {b} in the evening. How many passengers did it carry?",
        "A shop sold {a} apples and {b} pears. How many pieces of fruit did it sell?",
        "A school has {a} girls and {b} boys. How many students does the school have?",
        "A hiker walked {a} meters before lunch and {b} meters after lunch. How far did the hiker walk?",
        "A farm has {a} chickens and {b} ducks. How many birds live on the farm?",
    ],
    "subtract": [
        "A store had {a} shirts and sold {b} of them. How many shirts are left?",
        "A tank holds {a} liters of water and {b} liters leak out. How many liters remain?",
        "Nora had {a} stickers and gave away {b}. How many stickers does she have left?",
        "A stadium has {a} seats and {b} are taken. How many seats are empty?",
        "A truck carried {a} boxes and delivered {b} of them. How many boxes are still on the truck?",
        "A road is {a} meters long and {b} meters are paved. How many meters are not paved?",
        "A warehouse stored {a} tires and shipped {b}. How many tires are left in the warehouse?",
        "A book has {a} pages and Ravi has read {b}. How many pages does he still have to read?",
    ],
    "divide": [
        "{a} candies are shared equally among {b} children. How many candies does each child get?",
        "A rope {a} centimeters long is cut into {b} equal pieces. How long is each piece in centimeters?",
        "{a} eggs are packed into cartons of {b}. How many cartons are filled?",
        "A class of {a} students splits into {b} equal teams. How many students are on each team?",
        "A farmer puts {a} apples into {b} baskets with the same number in each. How many apples go in each basket?",
        "A company pays {a} dollars equally to {b} workers. How many dollars does each worker get?",
        "{a} chairs are set out in {b} equal rows. How many chairs are in each row?",
        "A recipe uses {a} grams of flour for {b} equal loaves. How many grams of flour go into each loaf?",
    ],
}
"""Story frames per operation. The last two of each list are held out: only the test split uses them."""

HELD_OUT_FRAMES = 2
_SYMBOLS = {"multiply": "*", "add": "+", "subtract": "-", "divide": "/"}


def answer_instruction() -> str:
    """The sentence telling the model how to answer, appended to every question."""
    return "Use the calculator tool, then reply with 'ANSWER: <number>'."


def _operands(rng: random.Random, operation: str) -> Tuple[int, int, int]:
    """``(a, b, answer)``: two-digit factors, three-digit sums and differences, exact divisions."""
    if operation == "multiply":
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        return a, b, a * b
    if operation == "add":
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        return a, b, a + b
    if operation == "subtract":
        a = rng.randint(300, 999)
        b = rng.randint(100, a - 50)
        return a, b, a - b
    b, quotient = rng.randint(3, 19), rng.randint(12, 79)
    return b * quotient, b, quotient


def _frames(operation: str, split: str) -> List[Tuple[str, str]]:
    frames = FRAMES[operation]
    chosen = frames[-HELD_OUT_FRAMES:] if split == "test" else frames[:-HELD_OUT_FRAMES]
    offset = len(frames) - HELD_OUT_FRAMES if split == "test" else 0
    return [(f"{operation}-{offset + i}", text) for i, text in enumerate(chosen)]


def make_splits(n_train: int = 240, n_test_per_operation: int = 16, seed: int = SEED) -> Dict[str, List[CalcTask]]:
    """The training and held-out problems, the same for the same arguments.

    Operations are dealt in turn, so each split is balanced across them. No two problems share an operand pair
    (in either order), and the frames of the two splits are disjoint.
    """
    rng = random.Random(seed)
    seen: set = set()
    splits: Dict[str, List[CalcTask]] = {}
    for split, count in (("test", n_test_per_operation * len(OPERATIONS)), ("train", n_train)):
        tasks: List[CalcTask] = []
        while len(tasks) < count:
            operation = OPERATIONS[len(tasks) % len(OPERATIONS)]
            a, b, answer = _operands(rng, operation)
            key = (operation, *sorted((a, b)))
            if key in seen:
                continue
            seen.add(key)
            frame_id, text = rng.choice(_frames(operation, split))
            question = f"{text.format(a=a, b=b)} {answer_instruction()}"
            expression = f"{a} {_SYMBOLS[operation]} {b}"
            tasks.append(
                CalcTask(
                    id=f"{split}-{len(tasks)}",
                    question=question,
                    operation=operation,
                    frame=frame_id,
                    expression=expression,
                    answer=answer,
                )
            )
        splits[split] = tasks
    train_frames = {t["frame"] for t in splits["train"]}
    if any(t["frame"] in train_frames for t in splits["test"]):
        raise AssertionError("a held-out frame was used for training")
    return {"train": splits["train"], "test": splits["test"]}


def load_split(name: str, data_dir: Path = DATA_DIR) -> List[CalcTask]:
    """The shipped ``train`` or ``test`` split.

    Raises:
        ValueError: ``name`` is not a split.
        examples.common.tasks.TaskFileError: The file is missing or not a file of calc tasks.
    """
    if name not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {name!r}")
    return read_tasks(data_dir / f"{name}.jsonl", CalcTask)  # type: ignore[return-value]


_ANSWER_LINE = re.compile(r"ANSWER:[ \t]*(-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+))[ \t]*\.?")


def parse_answer(text: Optional[str]) -> Optional[int]:
    """The integer the reply commits to: its last non-empty line must be ``ANSWER: <n>`` and nothing else.

    No answer (None) when ``ANSWER:`` appears more than once in any letter case (several candidates are a hedge),
    when there is no such line, or when the line holds an expression, several numbers or a decimal.
    """
    if not text or text.upper().count("ANSWER:") != 1:
        return None
    match = _ANSWER_LINE.fullmatch(text.strip().splitlines()[-1].strip())
    return int(match.group(1).replace(",", "")) if match else None


def reward(reply: Optional[str], task: CalcTask, *, called_tool: bool = False, format_credit: float = 0.0) -> float:
    """1.0 for the correct integer in the required format; else ``format_credit`` for each step done right.

    Args:
        reply: The model's final message.
        task: The problem.
        called_tool: Whether the calculator ran without error during the episode.
        format_credit: Training-only credit for a successful calculator call and for a well-formed ``ANSWER:``
            line when the answer is wrong; validation uses 0, so held-out accuracy is strict. It must be below 0.5,
            so that a wrong answer (at most twice the credit) earns less than a right one.

    Raises:
        ValueError: ``format_credit`` is negative or not below 0.5.
    """
    check_format_credit(format_credit)
    answer = parse_answer(reply)
    if answer is not None and answer == task["answer"]:
        return 1.0
    return format_credit * (int(called_tool) + int(answer is not None))


def _write(splits: Dict[str, List[CalcTask]], data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, tasks in splits.items():
        text = "".join(json.dumps(task, sort_keys=True) + "\n" for task in tasks)
        (data_dir / f"{name}.jsonl").write_text(text, encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Rewrite the shipped splits."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    _write(make_splits(), args.data_dir)


if __name__ == "__main__":
    main()
