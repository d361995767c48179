"""Signal handling shared by long-running CLI commands (``store``, ``proxy``, ...)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any, AsyncIterator

__all__ = ["shutdown_signals", "wait_for_shutdown", "stop_when_asked"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.asynccontextmanager
async def shutdown_signals() -> AsyncIterator[asyncio.Event]:
    """Yield an event set by the first SIGINT/SIGTERM; later signals are logged and ignored until the block ends.

    Keep the block open over the whole shutdown so a repeated signal cannot interrupt in-flight requests or the
    closing of a store.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            logger.warning("Received %s while shutting down; still finishing.", signal.Signals(signum).name)
        stop.set()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield stop
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)


async def wait_until_stopped(stop: asyncio.Event, server: Any, poll_seconds: float = 0.5) -> None:
    """Return once ``stop`` is set or ``server.is_running()`` turns false."""
    while not stop.is_set() and server.is_running():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=poll_seconds)


async def stop_when_asked(command: str, stop: asyncio.Event, server: Any) -> None:
    """Wait as :func:`wait_until_stopped` does, then stop ``server``, printing that ``agentbolt COMMAND`` shuts down."""
    await wait_until_stopped(stop, server)
    print(f"agentbolt {command}: shutting down", flush=True)
    await server.stop()


async def wait_for_shutdown(server: Any) -> None:
    """Block until SIGINT/SIGTERM arrives or ``server`` stops on its own."""
    async with shutdown_signals() as stop:
        await wait_until_stopped(stop, server)
