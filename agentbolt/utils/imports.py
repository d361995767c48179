"""Importing what is not always installed: optional dependencies, and objects named by ``"module:attribute"`` references.

:func:`import_extra` is the one place that words the error for a missing optional dependency (which package, which
``agentbolt[extra]`` installs it); :func:`import_reference` resolves the references config files use to name agents,
datasets and functions. :func:`peft_wrapping` quiets a notice that peft's model wrapper makes transformers print.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from types import ModuleType
from typing import Any, Iterator, Optional

__all__ = ["ImportReferenceError", "import_extra", "import_reference", "peft_wrapping"]


def import_extra(module: str, *, feature: str, extra: str, package: Optional[str] = None, note: str = "") -> ModuleType:
    """Import the optional dependency ``module``, or say which ``agentbolt`` extra installs it.

    Args:
        module: The module to import (``"pyarrow.parquet"``; a submodule imports its package too).
        feature: What needs it, to start the error message (``"Parquet files"``).
        extra: The ``agentbolt[...]`` extra that installs it.
        package: The distribution's name when it differs from the module's top-level name (``"prometheus-client"``).
        note: Appended to the message in parentheses (``"CUDA machines only"``).

    Raises:
        ImportError: The module (or a module it imports) is missing; chained to the original error.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        name = package or module.partition(".")[0]
        message = f"{feature} needs the '{name}' package: pip install 'agentbolt[{extra}]'"
        raise ImportError(f"{message} ({note})" if note else message) from exc


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


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Within the block, wrap models with peft without transformers' ``is_gradient_checkpointing`` deprecation notice.

    peft's model wrapper reads that deprecated property of transformers models, so every LoRA model built printed a
    ``FutureWarning`` addressed to peft's authors, not to the user. Only that notice is silenced.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield
