"""Find held-out questions that repeat a training question in other words.

A held-out split only measures generalisation if none of its questions is a training question in disguise. This
module flags a pair of questions (one from each split) when any of these holds:

* **same words**: the normalised word multisets are equal (a reordering, or a change of case or punctuation);
* **same numbers**: both questions contain at least ``min_numbers`` numbers and their number multisets are equal
  (an arithmetic question reworded: "What is 12 * 40?" and "Multiply 40 by 12.");
* **similar content words**: the Jaccard similarity of the two content-word sets (stop words removed) is at least
  ``jaccard_threshold`` (a paraphrase that keeps the key words);
* **same chain**: the caller gave each question a key for what it asks about (for example the tuple of
  ``(entity, relation)`` hops a multi-hop question follows) and the two keys are equal.

The checks are deliberately plain so a flagged pair is easy to read; :func:`find_overlaps` works on any two lists
of question strings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

# fmt: off
STOP_WORDS = frozenset({
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "from", "by", "with", "and", "or", "is", "are", "was",
    "were", "be", "been", "being", "do", "does", "did", "what", "which", "who", "whom", "whose", "when", "where",
    "why", "how", "that", "this", "these", "those", "it", "its", "as", "into", "than", "then", "there", "their",
    "they", "he", "she", "his", "her", "him", "we", "you", "your", "our", "i", "me", "my", "please", "give", "tell",
    "find", "compute", "calculate", "answer", "question",
})
# fmt: on

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[a-z]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


@dataclass(frozen=True)
class Overlap:
    """One flagged pair: ``val[val_index]`` looks like ``train[train_index]``.

    Attributes:
        train_index: Index of the question in the training list.
        val_index: Index of the question in the held-out list.
        reason: Which check flagged the pair (``"same words"``, ``"same numbers"``, ``"jaccard 0.83"``,
            ``"same chain"``).
        train_question: The training question's text.
        val_question: The held-out question's text.
    """

    train_index: int
    val_index: int
    reason: str
    train_question: str
    val_question: str


def words(text: str) -> list[str]:
    """Lower-case word and number tokens of ``text``, punctuation dropped, in order."""
    return _TOKEN.findall(text.lower())


def content_words(text: str) -> frozenset[str]:
    """The distinct words of ``text`` that are not stop words (numbers included)."""
    return frozenset(w for w in words(text) if w not in STOP_WORDS)


def numbers(text: str) -> Counter[Decimal]:
    """The multiset of numbers written in ``text`` (``1,000`` and ``1000.0`` are both ``1000``)."""
    found: Counter[Decimal] = Counter()
    for raw in _NUMBER.findall(text):
        try:
            found[Decimal(raw.replace(",", "")).normalize()] += 1
        except InvalidOperation:  # pragma: no cover - the pattern only matches valid decimals
            continue
    return found


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two sets; two empty sets count as identical (1.0)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass(frozen=True)
class _Features:
    word_bag: Counter[str]
    content: frozenset[str]
    number_bag: Counter[Decimal]


def _features(question: str) -> _Features:
    return _Features(Counter(words(question)), content_words(question), numbers(question))


def find_overlaps(
    train: Sequence[str],
    val: Sequence[str],
    *,
    train_chains: Sequence[Hashable] | None = None,
    val_chains: Sequence[Hashable] | None = None,
    jaccard_threshold: float = 0.7,
    min_numbers: int = 1,
) -> list[Overlap]:
    """Every (train, val) question pair that one of the module's checks flags.

    Args:
        train: Training questions.
        val: Held-out questions.
        train_chains: Optional key per training question naming what it asks about (e.g. its tuple of
            ``(entity, relation)`` hops); ``None`` entries are never compared.
        val_chains: The same for the held-out questions; give both or neither.
        jaccard_threshold: Content-word Jaccard similarity at or above which a pair is flagged.
        min_numbers: Number-multiset equality flags a pair only when the questions hold at least this many numbers.

    Returns:
        The flagged pairs, at most one per pair (the first check that fires), ordered by ``(val_index,
        train_index)``. An empty list means the splits are disjoint under every check.

    Raises:
        ValueError: If only one of the chain lists is given, or a chain list's length differs from its questions'.
    """
    if (train_chains is None) != (val_chains is None):
        raise ValueError("give both train_chains and val_chains, or neither")
    if train_chains is not None and len(train_chains) != len(train):
        raise ValueError(f"train_chains has {len(train_chains)} keys for {len(train)} questions")
    if val_chains is not None and len(val_chains) != len(val):
        raise ValueError(f"val_chains has {len(val_chains)} keys for {len(val)} questions")
    if not 0.0 < jaccard_threshold <= 1.0:
        raise ValueError(f"jaccard_threshold must be in (0, 1], got {jaccard_threshold}")

    train_features = [_features(q) for q in train]
    found: list[Overlap] = []
    for vi, val_question in enumerate(val):
        vf = _features(val_question)
        for ti, tf in enumerate(train_features):
            reason = _first_reason(tf, vf, jaccard_threshold, min_numbers)
            if reason is None and train_chains is not None and val_chains is not None:
                t_key, v_key = train_chains[ti], val_chains[vi]
                if t_key is not None and v_key is not None and t_key == v_key:
                    reason = "same chain"
            if reason is not None:
                found.append(Overlap(ti, vi, reason, train[ti], val_question))
    return found


def _first_reason(a: _Features, b: _Features, threshold: float, min_numbers: int) -> str | None:
    if a.word_bag == b.word_bag:
        return "same words"
    if a.number_bag == b.number_bag and a.number_bag.total() >= max(min_numbers, 1):
        return "same numbers"
    similarity = jaccard(a.content, b.content)
    if similarity >= threshold:
        return f"jaccard {similarity:.2f}"
    return None


def describe(overlaps: Sequence[Overlap], limit: int = 10) -> str:
    """A readable list of flagged pairs for an assertion message (at most ``limit`` lines)."""
    lines = [
        f"{o.reason}: val[{o.val_index}] {o.val_question!r} ~ train[{o.train_index}] {o.train_question!r}"
        for o in overlaps[:limit]
    ]
    if len(overlaps) > limit:
        lines.append(f"... and {len(overlaps) - limit} more")
    return "\n".join(lines)
