"""Random identifiers."""

from __future__ import annotations

import secrets

__all__ = ["generate_id"]


def generate_id(length: int) -> str:
    """Random lowercase hex string of exactly ``length`` characters (1..40)."""
    if length <= 0:
        raise ValueError("length must be positive")
    if length > 40:
        raise ValueError("length must be at most 40")
    return secrets.token_hex((length + 1) // 2)[:length]
