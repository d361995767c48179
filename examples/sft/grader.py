"""The reward of the example's math agent: 1.0 for the right number in the required format, else 0.0.

The final message must end with exactly one answer line ``### <number> ###`` (the format the reference example's
agent is told to use) and contain no other ``###`` marker; the number (commas between thousands allowed, a whole
decimal such as ``42.0`` allowed) must equal the gold answer. Everything that hedges scores 0: several markers,
several numbers inside the marker, a marker followed by more text, no marker at all (the question copied back, an
empty reply, a long reply listing candidates). ``tests/examples/test_sft_example.py`` attacks it with such answers.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Optional

__all__ = ["ANSWER_LINE", "compute_reward", "parse_answer"]

ANSWER_LINE = re.compile(r"###[ \t]*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)[ \t]*###")
"""The answer line, matched in full: ``### <number> ###``."""


def parse_answer(text: Optional[str]) -> Optional[Decimal]:
    """The number the reply commits to, or None when it does not commit to exactly one."""
    if not text or text.count("###") != 2:
        return None
    last_line = text.strip().splitlines()[-1].strip()
    match = ANSWER_LINE.fullmatch(last_line)
    if match is None:
        return None
    try:
        return Decimal(match.group(1).replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the pattern only matches valid numbers
        return None


def compute_reward(text: Optional[str], target: int) -> float:
    """1.0 when the reply's single answer line holds ``target``, else 0.0."""
    value = parse_answer(text)
    return 1.0 if value is not None and value == Decimal(target) else 0.0
