"""The example's GSM-style word problems, generated from a fixed seed.

Each problem is a short story with one or two arithmetic steps and an integer answer (``{"id", "question",
"expression", "answer"}``). The training and held-out splits are written from **different story templates** (the
held-out stories use other situations, verbs and objects), and no two problems of either split use the same multiset
of numbers, so a held-out question is never a training question reworded or with its numbers reordered
(``tests/examples/test_sft_example.py`` checks this with the project's paraphrase detector).

Regenerate the shipped files (the same seed always gives the same files)::

    python -m examples.sft.data
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple, TypedDict

__all__ = ["DATA_DIR", "GsmProblem", "load_split", "make_splits"]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Where the shipped ``train.jsonl`` and ``val.jsonl`` live."""

SEED = 2024
N_TRAIN = 400
N_VAL = 200


class GsmProblem(TypedDict):
    """One word problem.

    Attributes:
        id: ``"train-17"``, ``"val-3"``.
        question: The story and its question.
        expression: An arithmetic expression whose value is the answer (what a calculator call should compute).
        answer: The integer answer.
    """

    id: str
    question: str
    expression: str
    answer: int


NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jamal", "Kira", "Leo", "Maya",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tara"]  # fmt: skip


@dataclass(frozen=True)
class Template:
    """A story with number slots: ``make(rng)`` draws the numbers and returns (question, expression, answer)."""

    family: str
    make: Callable[[random.Random, str], Tuple[str, str, int]]


def _mul_train_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(12, 60), rng.randint(4, 25)
    return (
        f"{name} buys {a} packs of stickers. Each pack holds {b} stickers. How many stickers does {name} buy?",
        f"{a} * {b}",
        a * b,
    )


def _mul_train_2(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(12, 60), rng.randint(4, 25)
    return (
        f"A bakery fills {a} trays with {b} muffins on each tray. How many muffins are on the trays?",
        f"{a} * {b}",
        a * b,
    )


def _mul_train_3(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(12, 60), rng.randint(4, 25)
    return (
        f"{name} reads {b} pages every day for {a} days. How many pages does {name} read in total?",
        f"{b} * {a}",
        a * b,
    )


def _add_train_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(120, 900), rng.randint(120, 900)
    return (
        f"{name} has {a} marbles and wins {b} more at school. How many marbles does {name} have now?",
        f"{a} + {b}",
        a + b,
    )


def _add_train_2(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(120, 900), rng.randint(120, 900)
    return (
        f"A farm picks {a} apples in the morning and {b} apples in the afternoon. How many apples does the farm pick that day?",
        f"{a} + {b}",
        a + b,
    )


def _sub_train_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a = rng.randint(300, 990)
    b = rng.randint(110, a - 20)
    return (
        f"{name} had {a} dollars and spent {b} dollars on a bike. How many dollars does {name} have left?",
        f"{a} - {b}",
        a - b,
    )


def _sub_train_2(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a = rng.randint(300, 990)
    b = rng.randint(110, a - 20)
    return (
        f"A library owns {a} books and lends out {b} of them. How many books are still on the shelves?",
        f"{a} - {b}",
        a - b,
    )


def _div_train_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    b, q = rng.randint(3, 12), rng.randint(12, 60)
    return (
        f"{name} shares {b * q} candies equally among {b} friends. How many candies does each friend get?",
        f"{b * q} / {b}",
        q,
    )


def _two_train_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b, c = rng.randint(5, 30), rng.randint(4, 15), rng.randint(3, 40)
    return (
        f"{name} buys {a} boxes of pencils with {b} pencils in each box, then gives away {c} pencils. How many pencils does {name} keep?",
        f"{a} * {b} - {c}",
        a * b - c,
    )


def _two_train_2(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b, c = rng.randint(5, 30), rng.randint(4, 15), rng.randint(3, 40)
    return (
        f"A school orders {a} crates of {b} bottles of juice and {c} loose bottles. How many bottles does the school order?",
        f"{a} * {b} + {c}",
        a * b + c,
    )


def _mul_val_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(12, 60), rng.randint(4, 25)
    return (
        f"A cinema has {a} rows with {b} seats in every row. How many seats does the cinema have?",
        f"{a} * {b}",
        a * b,
    )


def _mul_val_2(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(12, 60), rng.randint(4, 25)
    return (
        f"{name} earns {b} coins for each chore and finishes {a} chores. How many coins does {name} earn?",
        f"{b} * {a}",
        a * b,
    )


def _add_val_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b = rng.randint(120, 900), rng.randint(120, 900)
    return (
        f"On Monday {a} people visit the museum, and on Tuesday {b} people visit. How many visitors come over the two days?",
        f"{a} + {b}",
        a + b,
    )


def _sub_val_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a = rng.randint(300, 990)
    b = rng.randint(110, a - 20)
    return (
        f"A tank holds {a} liters of water and {b} liters leak out. How many liters remain in the tank?",
        f"{a} - {b}",
        a - b,
    )


def _div_val_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    b, q = rng.randint(3, 12), rng.randint(12, 60)
    return (
        f"{name} packs {b * q} eggs into cartons that hold {b} eggs each. How many cartons does {name} fill?",
        f"{b * q} / {b}",
        q,
    )


def _two_val_1(rng: random.Random, name: str) -> Tuple[str, str, int]:
    a, b, c = rng.randint(5, 30), rng.randint(4, 15), rng.randint(3, 40)
    return (
        f"A gardener plants {a} rows of {b} tulips and then {c} more tulips by the gate. How many tulips are planted?",
        f"{a} * {b} + {c}",
        a * b + c,
    )


TRAIN_TEMPLATES: Sequence[Callable[[random.Random, str], Tuple[str, str, int]]] = (
    _mul_train_1, _mul_train_2, _mul_train_3, _add_train_1, _add_train_2, _sub_train_1, _sub_train_2, _div_train_1,
    _two_train_1, _two_train_2,
)  # fmt: skip
VAL_TEMPLATES: Sequence[Callable[[random.Random, str], Tuple[str, str, int]]] = (
    _mul_val_1, _mul_val_2, _add_val_1, _sub_val_1, _div_val_1, _two_val_1,
)  # fmt: skip


def _numbers_key(expression: str) -> Tuple[int, ...]:
    return tuple(
        sorted(
            int(token)
            for token in expression.replace("*", " ").replace("/", " ").replace("+", " ").replace("-", " ").split()
        )
    )


def _draw(
    rng: random.Random,
    templates: Sequence[Callable[[random.Random, str], Tuple[str, str, int]]],
    count: int,
    split: str,
    seen: set,
) -> List[GsmProblem]:
    problems: List[GsmProblem] = []
    while len(problems) < count:
        template = templates[len(problems) % len(templates)]
        question, expression, answer = template(rng, rng.choice(NAMES))
        key = _numbers_key(expression)
        if key in seen:
            continue
        seen.add(key)
        problems.append(
            GsmProblem(id=f"{split}-{len(problems)}", question=question, expression=expression, answer=answer)
        )
    rng.shuffle(problems)
    return problems


def make_splits(
    n_train: int = N_TRAIN, n_val: int = N_VAL, seed: int = SEED
) -> Tuple[List[GsmProblem], List[GsmProblem]]:
    """Generate the training and held-out problems (held-out first, so its problems do not depend on ``n_train``).

    Raises:
        ValueError: A negative size.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError(f"split sizes must be non-negative, got n_train={n_train}, n_val={n_val}")
    rng = random.Random(seed)
    seen: set = set()
    val = _draw(rng, VAL_TEMPLATES, n_val, "val", seen)
    train = _draw(rng, TRAIN_TEMPLATES, n_train, "train", seen)
    return train, val


def load_split(name: str) -> List[GsmProblem]:
    """The shipped ``train`` or ``val`` split.

    Raises:
        ValueError: An unknown split name.
    """
    if name not in ("train", "val"):
        raise ValueError(f"unknown split {name!r}; expected 'train' or 'val'")
    path = DATA_DIR / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_splits(directory: Path = DATA_DIR) -> Dict[str, int]:
    """Write ``train.jsonl`` and ``val.jsonl`` under ``directory``; returns the sizes."""
    directory.mkdir(parents=True, exist_ok=True)
    train, val = make_splits()
    for name, problems in (("train", train), ("val", val)):
        text = "".join(json.dumps(problem) + "\n" for problem in problems)
        (directory / f"{name}.jsonl").write_text(text, encoding="utf-8")
    return {"train": len(train), "val": len(val)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="Directory to write train.jsonl and val.jsonl to.")
    print(json.dumps(write_splits(parser.parse_args().out)))
