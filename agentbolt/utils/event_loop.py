"""The event loop agentbolt's servers run on: uvloop where it is installed, asyncio's own loop otherwise.

A store call over HTTP spends much of its server-side time in the event loop itself (parsing and answering the
request, and for PostgreSQL one wait per statement), and uvloop does that work in C. The SQLite store's writer
and reader threads run their loops of the same kind: each store operation is handed to them from another thread,
and uvloop wakes a loop from another thread faster. ``AGENTBOLT_EVENT_LOOP=asyncio``
keeps the standard loop (to compare, or to rule uvloop out when debugging); ``uvloop`` requires it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Coroutine, TypeVar

__all__ = ["EVENT_LOOP_ENV_VAR", "event_loop_name", "new_event_loop", "run"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

EVENT_LOOP_ENV_VAR = "AGENTBOLT_EVENT_LOOP"
_CHOICES = ("auto", "uvloop", "asyncio")


def event_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`run` uses, per ``$AGENTBOLT_EVENT_LOOP`` (default ``auto``).

    Raises:
        ValueError: The variable names no known loop, or asks for uvloop where it is not installed.
    """
    choice = os.environ.get(EVENT_LOOP_ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{EVENT_LOOP_ENV_VAR}={choice!r} is not one of {', '.join(_CHOICES)}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError(f"{EVENT_LOOP_ENV_VAR}=uvloop but uvloop is not installed (pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new event loop of the kind :func:`event_loop_name` chooses, like
    :func:`asyncio.run`."""
    try:
        name = event_loop_name()
    except ValueError:
        main.close()
        raise
    logger.debug("Running on the %s event loop", name)
    if name == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the kind :func:`event_loop_name` chooses, for a thread of its own to run."""
    if event_loop_name() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
