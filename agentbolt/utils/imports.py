"""Objects named by ``"module:attribute"`` references (config files name agents, datasets and functions this way)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["ImportReferenceError", "import_reference"]


class ImportReferenceError(ValueError):
    """A ``"module:attribute"`` reference is malformed or names nothing importable; the message says which part."""


def import_reference(reference: str, what: str) -> Any:
    """The object ``reference`` (``"package.module:attribute"``) names, imported with the current directory on the path.

    Args:
        reference: ``"module:attribute"``; the attribute may be dotted (``"module:Class.method"``).
        what: What the reference is for, to name in errors (``"agent"``, ``"student_prompt"``).

    Raises:
        ImportReferenceError: The reference is not ``module:attribute``, the module cannot be imported, or it has no such
            attribute.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ImportReferenceError(f"{what} {reference!r} must be 'module:attribute'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportReferenceError(f"{what} {reference!r}: cannot import {module_name} ({exc})") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ImportReferenceError(f"{what} {reference!r}: {module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found
