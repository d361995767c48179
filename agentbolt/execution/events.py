"""Stop signals shared between the algorithm and the runners."""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.context import BaseContext
from typing import Any, Optional, Protocol

__all__ = ["ExecutionEvent", "ThreadingEvent", "MultiprocessingEvent"]


class ExecutionEvent(Protocol):
    """A settable flag that every bundle polls to know when to stop."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: Optional[float] = None) -> bool: ...


class _DelegatingEvent:
    """Forwards the event protocol to a wrapped ``threading`` or ``multiprocessing`` event."""

    __slots__ = ("_event",)

    _event: Any

    def set(self) -> None:
        """Raise the flag."""
        self._event.set()

    def clear(self) -> None:
        """Lower the flag."""
        self._event.clear()

    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return bool(self._event.is_set())

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the flag is raised or ``timeout`` passes; returns the flag."""
        return bool(self._event.wait(timeout))


class ThreadingEvent(_DelegatingEvent):
    """Event shared by threads of one process."""

    __slots__ = ()

    def __init__(self) -> None:
        self._event = threading.Event()


class MultiprocessingEvent(_DelegatingEvent):
    """Event shared by processes (pass it to children at spawn time)."""

    __slots__ = ()

    def __init__(self, *, ctx: Optional[BaseContext] = None) -> None:
        self._event = (ctx or multiprocessing).Event()  # type: ignore[attr-defined]
