"""Which store methods are running in the current context, for the labels of store and collection metrics.

The variables are task-local (:mod:`contextvars`): ``tracked`` store methods set them, and the collections below
the store read them when labelling their own metrics. This module imports nothing of agentbolt's, so both layers
can use it.
"""

from __future__ import annotations

import contextvars
from typing import Dict, Optional, Tuple

__all__ = [
    "current_public_method",
    "current_private_method",
    "get_current_store_methods",
    "current_store_method_labels",
]

current_public_method: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "agentbolt_store_public_method", default=None
)
"""Name of the public store method running in this context, if any."""

current_private_method: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "agentbolt_store_private_method", default=None
)
"""Name of the private (``_``-prefixed) store method running in this context, if any."""


def get_current_store_methods() -> Tuple[Optional[str], Optional[str]]:
    """``(public, private)`` names of the store methods currently executing in this context."""
    return current_public_method.get(), current_private_method.get()


def current_store_method_labels() -> Dict[str, str]:
    """Metric labels naming the store methods currently executing (``"unknown"`` outside a store method)."""
    public, private = get_current_store_methods()
    return {"store_pubmeth": public or "unknown", "store_privmeth": private or "unknown"}
