"""Weak back-references between components (agent -> trainer/runner, algorithm -> trainer/adapter/proxy)."""

from __future__ import annotations

import weakref
from typing import Optional, TypeVar

__all__ = ["deref"]

T = TypeVar("T")


def deref(ref: Optional[weakref.ReferenceType[T]], label: str, owner: str) -> T:
    """The object behind ``ref``.

    Raises:
        ValueError: ``"<label> has not been set for this <owner>."`` when ``ref`` is None, or a message saying the
            object was garbage-collected.
    """
    if ref is None:
        raise ValueError(f"{label} has not been set for this {owner}.")
    obj = ref()
    if obj is None:
        noun = label.split()[-1].lower()
        raise ValueError(f"{label} reference is no longer valid (the {noun} was garbage-collected).")
    return obj
