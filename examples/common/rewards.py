"""Rules the examples' rewards share: how large a training-only format credit may be, and what an uncommitted
answer looks like (a negation, a hedge), compared on accent-folded text.

A reward that pays a listed or hedged answer teaches the model to list candidates; a format credit as large as
a right answer's reward teaches it that being wrong is as good as being right. These are the checks against both.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["FORMAT_CREDIT_LIMIT", "HEDGE", "NEGATION", "check_format_credit", "fold_accents", "join_digit_groups"]

FORMAT_CREDIT_LIMIT = 0.5
"""A format credit must be below this. A wrong answer earns it at most twice (calc: once for a calculator call
that worked, once for a well-formed answer; the other examples pay it once), and must earn less than a right
answer's 1.0."""


def check_format_credit(value: float) -> float:
    """``value`` when it is a valid training-only format credit: at least 0 and below :data:`FORMAT_CREDIT_LIMIT`.

    Raises:
        ValueError: It is out of that range (the message names the value and the range).
    """
    if not 0.0 <= value < FORMAT_CREDIT_LIMIT:  # also refuses NaN
        raise ValueError(
            f"format credit must be at least 0 and below {FORMAT_CREDIT_LIMIT:g} (a wrong answer can earn it twice "
            f"and must earn less than a right answer's 1.0), got {value:g}"
        )
    return value


def fold_accents(text: str) -> str:
    """``text`` with compatibility forms unfolded (NFKD) and combining marks dropped (``Brasília`` -> ``Brasilia``);
    typographic apostrophes become ``'``."""
    decomposed = unicodedata.normalize("NFKD", text).replace("\u2019", "'").replace("\u02bc", "'")
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


NEGATION = re.compile(
    r"\b(?:not|no|never|none|neither|nor|nobody|nowhere|cannot|unavailable|except|avoid)\b|n't\b", re.IGNORECASE
)
"""A word that denies what it is near: an answer holding one may be naming the candidate it rules out."""

HEDGE = re.compile(r"\b(?:maybe|perhaps|possibly|probably|unsure|uncertain|either)\b", re.IGNORECASE)
"""A word that leaves the answer open."""


_DIGIT_GROUPS = re.compile(r"(?<![\d,])\d{1,3}(?:,\d{3})+(?![\d,])")


def join_digit_groups(text: str) -> str:
    """``text`` with the digit-group commas of its numbers removed (``1,262`` -> ``1262``): one number, not a list.
    Commas between other numbers (``1262,1263``, ``12,3``) stay, to be read as a list."""
    return _DIGIT_GROUPS.sub(lambda number: number.group().replace(",", ""), text)
