"""The local corpus of the rag and search_r1 examples, its questions, and BM25 retrieval over it.

The corpus describes fictional towns and the engineers born in them, so a model cannot answer from memory: every
answer must be read from a retrieved passage. ``python -m examples.rag.corpus`` rewrites ``data/corpus.jsonl``,
``data/train.jsonl`` and ``data/test.jsonl`` byte for byte from the seed.

Towns, with the engineers born in them, are dealt into the training or the held-out split as a unit, so no
held-out question is about an entity (or a fact) that a training question asks about: the splits share no
paraphrase and no answer-bearing fact. The corpus holds the passages of both splits, as a search index would.

Questions (``kind``):

* one hop, one passage: ``year`` (when was the town founded), ``founder``, ``river``, ``product`` (what the town
  is known for), ``invention`` (what the engineer built), ``birthplace``;
* two hops (search_r1 only): ``founder_of_birthplace`` (who founded the town where the engineer was born), which
  needs the engineer's passage, then the town's.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypedDict

from examples.common.tasks import read_tasks

__all__ = [
    "DATA_DIR",
    "Passage",
    "QATask",
    "Retriever",
    "exact_match",
    "f1_score",
    "load_corpus",
    "load_questions",
    "make_dataset",
    "normalize_answer",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 20251121
ONE_HOP_KINDS = ("year", "founder", "river", "product", "invention", "birthplace")
TWO_HOP_KINDS = ("founder_of_birthplace",)


class Passage(TypedDict):
    """One corpus passage: ``{"id": "town-3", "title": "Kelvar", "text": "..."}``."""

    id: str
    title: str
    text: str


class QATask(TypedDict):
    """One question.

    Attributes:
        id: ``train-5`` / ``test-12``.
        question: The question.
        answers: Accepted answers (the first is canonical).
        kind: The question kind (the slice).
        hops: Passages needed (1 or 2).
        passages: Ids of the passages that hold the answer (the gold evidence, never shown to the agent).
    """

    id: str
    question: str
    answers: List[str]
    kind: str
    hops: int
    passages: List[str]


_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "v", "z"]  # fmt: skip
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "m", "nd", "rk"]
_TOWN_ENDINGS = ["ford", "mere", "holt", "wick", "vale", "stead", "burg", "haven"]
_FIRST_NAMES = [
    "Ada", "Bram", "Cora", "Dov", "Elin", "Fenn", "Greta", "Hale", "Ines", "Joss", "Kaia", "Lorn", "Mira", "Nils",
    "Oona", "Pell", "Runa", "Soren", "Tova", "Ulf", "Vera", "Wynn", "Yara", "Zev",
]  # fmt: skip
_PRODUCTS = [
    "glass bells", "copper kettles", "wool blankets", "paper lanterns", "clay pipes", "silver spoons",
    "cedar boats", "linen sails", "iron hinges", "honey cakes", "salt cod", "slate roofs", "felt hats",
    "brass clocks", "rope ladders", "tin whistles",
]  # fmt: skip
_INVENTIONS = [
    "steam loom", "tide clock", "wind pump", "rope bridge", "ice saw", "grain elevator", "signal lamp",
    "canal lock", "water wheel", "hand crane", "brick kiln", "chain ferry", "pedal lathe", "sail cart",
    "fog horn", "paper press",
]  # fmt: skip


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


@dataclass
class _Town:
    name: str
    river: str
    year: int
    founder: str
    product: str


@dataclass
class _Engineer:
    name: str
    town: str
    invention: str
    year: int


def _unique(rng: random.Random, make: Any, taken: set) -> str:
    while True:
        value = make(rng)
        if value.lower() not in taken:
            taken.add(value.lower())
            return value


def _world(rng: random.Random, n_towns: int) -> Tuple[List[_Town], List[_Engineer]]:
    taken: set = set()
    towns, engineers = [], []
    for _ in range(n_towns):
        name = _unique(rng, lambda r: (_word(r, 1) + r.choice(_TOWN_ENDINGS)).capitalize(), taken)
        river = _unique(rng, lambda r: _word(r, 2).capitalize(), taken)
        founder = _unique(rng, lambda r: f"{r.choice(_FIRST_NAMES)} {_word(r, 2).capitalize()}", taken)
        towns.append(_Town(name, river, rng.randint(1100, 1899), founder, rng.choice(_PRODUCTS)))
    for town in towns:
        for _ in range(2):
            name = _unique(rng, lambda r: f"{r.choice(_FIRST_NAMES)} {_word(r, 2).capitalize()}", taken)
            engineers.append(_Engineer(name, town.name, rng.choice(_INVENTIONS), rng.randint(1700, 1950)))
    return towns, engineers


def _passages(towns: Sequence[_Town], engineers: Sequence[_Engineer]) -> List[Passage]:
    passages: List[Passage] = []
    for i, t in enumerate(towns):
        text = (
            f"{t.name} is a town on the {t.river} river. It was founded in {t.year} by {t.founder}. "
            f"{t.name} is known for its {t.product}."
        )
        passages.append(Passage(id=f"town-{i}", title=t.name, text=text))
    for i, e in enumerate(engineers):
        text = f"{e.name} was an engineer born in {e.town}. In {e.year}, {e.name} built the first {e.invention}."
        passages.append(Passage(id=f"engineer-{i}", title=e.name, text=text))
    return passages


def _questions(
    towns: Sequence[_Town], engineers: Sequence[_Engineer], town_ids: Dict[str, str], engineer_ids: Dict[str, str]
) -> List[QATask]:
    by_name = {t.name: t for t in towns}
    out: List[QATask] = []

    def add(question: str, answer: str, kind: str, passages: List[str]) -> None:
        out.append(QATask(id="", question=question, answers=[answer], kind=kind, hops=len(passages), passages=passages))

    for t in towns:
        pid = [town_ids[t.name]]
        add(f"In what year was {t.name} founded?", str(t.year), "year", pid)
        add(f"Who founded {t.name}?", t.founder, "founder", pid)
        add(f"Which river is {t.name} on?", t.river, "river", pid)
        add(f"What is {t.name} known for?", t.product, "product", pid)
    for e in engineers:
        pid = [engineer_ids[e.name]]
        add(f"What did {e.name} build first?", e.invention, "invention", pid)
        add(f"In which town was {e.name} born?", e.town, "birthplace", pid)
        founder = by_name[e.town].founder
        add(f"Who founded the town where {e.name} was born?", founder, "founder_of_birthplace",
            [*pid, town_ids[e.town]])  # fmt: skip
    return out


def make_dataset(n_towns: int = 64, test_fraction: float = 0.25, seed: int = SEED) -> Dict[str, List[Any]]:
    """The corpus and the training and held-out questions, the same for the same arguments.

    Returns:
        ``{"corpus": [Passage...], "train": [QATask...], "test": [QATask...]}``.
    """
    rng = random.Random(seed)
    towns, engineers = _world(rng, n_towns)
    passages = _passages(towns, engineers)
    town_ids = {p["title"]: p["id"] for p in passages if p["id"].startswith("town-")}
    engineer_ids = {p["title"]: p["id"] for p in passages if p["id"].startswith("engineer-")}
    held_out = set(rng.sample([t.name for t in towns], round(n_towns * test_fraction)))
    splits: Dict[str, List[QATask]] = {"train": [], "test": []}
    for split in ("train", "test"):
        chosen = [t for t in towns if (t.name in held_out) == (split == "test")]
        names = {t.name for t in chosen}
        questions = _questions(chosen, [e for e in engineers if e.town in names], town_ids, engineer_ids)
        rng.shuffle(questions)
        for i, question in enumerate(questions):
            question["id"] = f"{split}-{i}"
        splits[split] = questions
    return {"corpus": passages, **splits}


def load_corpus(data_dir: Path = DATA_DIR) -> List[Passage]:
    """The shipped passages.

    Raises:
        examples.common.tasks.TaskFileError: The file is missing or not a file of passages.
    """
    return read_tasks(data_dir / "corpus.jsonl", Passage)  # type: ignore[return-value]


def load_questions(split: str, kinds: Optional[Sequence[str]] = None, data_dir: Path = DATA_DIR) -> List[QATask]:
    """The shipped ``train`` or ``test`` questions, optionally only some kinds.

    Raises:
        ValueError: Unknown split or kind.
        examples.common.tasks.TaskFileError: The file is missing or not a file of questions.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    unknown = set(kinds or ()) - set(ONE_HOP_KINDS + TWO_HOP_KINDS)
    if unknown:
        raise ValueError(f"unknown question kinds {sorted(unknown)}; known: {ONE_HOP_KINDS + TWO_HOP_KINDS}")
    questions: List[QATask] = read_tasks(data_dir / f"{split}.jsonl", QATask)  # type: ignore[assignment]
    return [q for q in questions if kinds is None or q["kind"] in kinds]


# ------------------------------------------------------------------------------------------------------ retrieval
_TOKEN = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset({
    "a", "an", "and", "the", "of", "in", "on", "at", "to", "for", "by", "is", "was", "were", "what", "which", "who",
    "whom", "when", "where", "how", "did", "does", "do", "it", "its", "from",
})  # fmt: skip


def _tokens(text: str) -> List[str]:
    return [token for token in _TOKEN.findall(text.lower()) if token not in _STOPWORDS]


class Retriever:
    """BM25 (``rank_bm25.BM25Okapi``) over the corpus passages.

    Args:
        passages: The corpus (default: the shipped one).
    """

    def __init__(self, passages: Optional[Sequence[Passage]] = None) -> None:
        from rank_bm25 import BM25Okapi

        self.passages = list(passages if passages is not None else load_corpus())
        if not self.passages:
            raise ValueError("the corpus is empty")
        self._index = BM25Okapi([_tokens(f"{p['title']} {p['text']}") for p in self.passages])

    def search(self, query: str, top_k: int = 1) -> List[Passage]:
        """The ``top_k`` best passages for ``query`` (none for a query without searchable words).

        Raises:
            ValueError: ``top_k`` is below 1.
        """
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        tokens = _tokens(query)
        if not tokens:
            return []
        scores = self._index.get_scores(tokens)
        ranked = sorted(range(len(self.passages)), key=lambda i: (-scores[i], i))
        return [self.passages[i] for i in ranked[:top_k] if scores[i] > 0]


# ------------------------------------------------------------------------------------------------------ scoring
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: Optional[str], answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised answer; an empty prediction scores 0."""
    if not prediction or not normalize_answer(prediction):
        return 0.0
    return float(any(normalize_answer(prediction) == normalize_answer(answer) for answer in answers))


def f1_score(prediction: Optional[str], answers: Sequence[str]) -> float:
    """The best token-level F1 (SQuAD) of the prediction against any answer; an empty prediction scores 0."""
    predicted = normalize_answer(prediction or "").split()
    if not predicted:
        return 0.0
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(predicted) & Counter(gold)).values())
        if common:
            precision, recall = common / len(predicted), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Rewrite the shipped corpus and questions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in make_dataset().items():
        text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        (args.data_dir / f"{name}.jsonl").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
