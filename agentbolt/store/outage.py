"""How long store calls made in the current context keep retrying while the store server is unreachable.

By default a :class:`~agentbolt.store.http.client.LightningStoreClient` follows the reference's retry contract: a
few retries, and none once the server's health endpoint stops answering; some reads then return ``None``. That
suits callers that poll. A caller that cannot afford to give up, such as a runner in the middle of a rollout, opens
a :func:`ride_out_outages` block instead: inside it, each retryable call keeps retrying with backoff for up to the
given number of seconds in total, whether or not the health endpoint answers, and a call that still fails raises
:class:`StoreUnreachableError` (reads included) instead of returning ``None``. A process that was asked to stop
makes its last writes inside :func:`without_retries`: each call is sent once, and a store that is gone fails it at
once instead of holding the process up.

The setting is task-local (:mod:`contextvars`): it follows the code that opened the block into the coroutines it
awaits and the threads it starts with :func:`asyncio.to_thread`, and does not leak into other tasks. Stores that
are not reached over a network ignore it. This module imports nothing of agentbolt's.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

__all__ = [
    "DEFAULT_STORE_OUTAGE_TIMEOUT",
    "StoreUnreachableError",
    "outage_tolerance",
    "ride_out_outages",
    "without_retries",
]

DEFAULT_STORE_OUTAGE_TIMEOUT = 30.0
"""Seconds a runner's store calls keep retrying during a store outage before the rollout fails."""


class StoreUnreachableError(ConnectionError):
    """A store call made inside :func:`ride_out_outages` gave up: the store stayed unreachable all the time allowed.

    Its ``__cause__`` is the last failure (a connection error, a timeout, a 5xx answer).
    """


_tolerance: contextvars.ContextVar[Optional[float]] = contextvars.ContextVar(
    "agentbolt_store_outage_tolerance", default=None
)


def outage_tolerance() -> Optional[float]:
    """Seconds each store call in this context may spend retrying an unreachable store.

    None: the client's own policy; 0: no retries at all (see :func:`without_retries`).
    """
    return _tolerance.get()


@contextlib.contextmanager
def ride_out_outages(seconds: Optional[float]) -> Iterator[None]:
    """Within the block, store calls retry for up to ``seconds`` each while the store server is unreachable.

    Args:
        seconds: Total time one call may spend retrying (its backoff follows the client's ``retry_delays``, the
            last delay repeated). ``None`` or ``0`` restores the client's own retry policy inside the block.

    Raises:
        ValueError: ``seconds`` is negative.
    """
    if seconds is not None and seconds < 0:
        raise ValueError(f"seconds must be None or at least 0, got {seconds!r}")
    token = _tolerance.set(seconds or None)
    try:
        yield
    finally:
        _tolerance.reset(token)


@contextlib.contextmanager
def without_retries() -> Iterator[None]:
    """Within the block, store calls are sent once: no retry, no health probe, no riding out an outage.

    A retryable call that fails (the store unreachable, a timeout, a 5xx answer) raises
    :class:`StoreUnreachableError` at once, reads included, as inside :func:`ride_out_outages`. This is for the last
    writes of a process that was asked to stop (Ctrl-C): they still reach a store that answers, and a store that is
    gone does not hold the process up. Calls already waiting for a retry when the block opens keep their own policy.
    """
    token = _tolerance.set(0.0)
    try:
        yield
    finally:
        _tolerance.reset(token)
