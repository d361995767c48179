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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple, TypedDict

from agentbolt.demo.agent import calculate

__all__ = ["DATA_DIR", "GsmProblem", "family_of", "load_split", "make_splits"]

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
class Family:
    """An arithmetic shape: how its numbers are drawn and what they compute."""

    draw: Callable[[random.Random], Dict[str, int]]
    expression: str
    """The expression over the drawn numbers, e.g. ``"{a} * {b}"``; its value is the answer."""


def _product(rng: random.Random) -> Dict[str, int]:
    return {"a": rng.randint(12, 60), "b": rng.randint(4, 25)}


def _sum(rng: random.Random) -> Dict[str, int]:
    return {"a": rng.randint(120, 900), "b": rng.randint(120, 900)}


def _difference(rng: random.Random) -> Dict[str, int]:
    a = rng.randint(300, 990)
    return {"a": a, "b": rng.randint(110, a - 20)}


def _quotient(rng: random.Random) -> Dict[str, int]:
    b, q = rng.randint(3, 12), rng.randint(12, 60)
    return {"a": b * q, "b": b}


def _two_steps(rng: random.Random) -> Dict[str, int]:
    return {"a": rng.randint(5, 30), "b": rng.randint(4, 15), "c": rng.randint(3, 40)}


FAMILIES: Dict[str, Family] = {
    "product": Family(_product, "{a} * {b}"),
    "sum": Family(_sum, "{a} + {b}"),
    "difference": Family(_difference, "{a} - {b}"),
    "quotient": Family(_quotient, "{a} / {b}"),
    "product minus": Family(_two_steps, "{a} * {b} - {c}"),
    "product plus": Family(_two_steps, "{a} * {b} + {c}"),
}

_FAMILY_OF_SHAPE: Dict[str, str] = {
    re.sub(r"\{\w\}", "#", family.expression): name for name, family in FAMILIES.items()
}


def family_of(problem: GsmProblem) -> str:
    """The arithmetic shape of a problem (``"product"``, ``"product plus"``...), read from its expression.

    Raises:
        ValueError: The expression has none of the shapes of :data:`FAMILIES`.
    """
    shape = re.sub(r"\d+", "#", problem["expression"])
    try:
        return _FAMILY_OF_SHAPE[shape]
    except KeyError:
        raise ValueError(f"{problem['expression']!r} has no known arithmetic shape") from None


TRAIN_TEMPLATES: Sequence[Tuple[str, str]] = (
    ("product", "{name} buys {a} packs of stickers. Each pack holds {b} stickers. How many stickers does {name} buy?"),
    ("product", "A bakery fills {a} trays with {b} muffins on each tray. How many muffins are on the trays?"),
    ("product", "{name} reads {b} pages every day for {a} days. How many pages does {name} read in total?"),
    ("sum", "{name} has {a} marbles and wins {b} more at school. How many marbles does {name} have now?"),
    ("sum", "A farm picks {a} apples in the morning and {b} apples in the afternoon. How many apples does the farm pick that day?"),
    ("difference", "{name} had {a} dollars and spent {b} dollars on a bike. How many dollars does {name} have left?"),
    ("difference", "A library owns {a} books and lends out {b} of them. How many books are still on the shelves?"),
    ("quotient", "{name} shares {a} candies equally among {b} friends. How many candies does each friend get?"),
    ("product minus", "{name} buys {a} boxes of pencils with {b} pencils in each box, then gives away {c} pencils. How many pencils does {name} keep?"),
    ("product plus", "A school orders {a} crates of {b} bottles of juice and {c} loose bottles. How many bottles does the school order?"),
)  # fmt: skip
"""Stories of the training split: ``(family, question)``."""

VAL_TEMPLATES: Sequence[Tuple[str, str]] = (
    ("product", "A cinema has {a} rows with {b} seats in every row. How many seats does the cinema have?"),
    ("product", "{name} earns {b} coins for each chore and finishes {a} chores. How many coins does {name} earn?"),
    ("sum", "On Monday {a} people visit the museum, and on Tuesday {b} people visit. How many visitors come over the two days?"),
    ("difference", "A tank holds {a} liters of water and {b} liters leak out. How many liters remain in the tank?"),
    ("quotient", "{name} packs {a} eggs into cartons that hold {b} eggs each. How many cartons does {name} fill?"),
    ("product plus", "A gardener plants {a} rows of {b} tulips and then {c} more tulips by the gate. How many tulips are planted?"),
)  # fmt: skip
"""Stories of the held-out split: other situations, verbs and objects."""


def _draw(
    rng: random.Random, templates: Sequence[Tuple[str, str]], count: int, split: str, seen: set
) -> List[GsmProblem]:
    """``count`` problems cycling through ``templates``, skipping number sets already used (``seen``)."""
    problems: List[GsmProblem] = []
    while len(problems) < count:
        family_name, story = templates[len(problems) % len(templates)]
        family = FAMILIES[family_name]
        numbers = family.draw(rng)
        key = tuple(sorted(numbers.values()))
        if key in seen:
            continue
        seen.add(key)
        expression = family.expression.format(**numbers)
        question = story.format(name=rng.choice(NAMES), **numbers)
        problem = GsmProblem(
            id=f"{split}-{len(problems)}", question=question, expression=expression, answer=int(calculate(expression))
        )
        problems.append(problem)
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
