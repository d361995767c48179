"""Stop signals shared between the algorithm and the runners."""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.context import BaseContext
from typing import Optional, Protocol

__all__ = ["ExecutionEvent", "ThreadingEvent", "MultiprocessingEvent"]


class ExecutionEvent(Protocol):
    """A settable flag that every bundle polls to know when to stop."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: Optional[float] = None) -> bool: ...


class ThreadingEvent:
    """Event shared by threads of one process."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        """Raise the flag."""
        self._event.set()

    def clear(self) -> None:
        """Lower the flag."""
        self._event.clear()

    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the flag is raised or ``timeout`` passes; returns the flag."""
        return self._event.wait(timeout)


class MultiprocessingEvent:
    """Event shared by processes (pass it to children at spawn time)."""

    __slots__ = ("_event",)

    def __init__(self, *, ctx: Optional[BaseContext] = None) -> None:
        self._event = (ctx or multiprocessing).Event()  # type: ignore[attr-defined]

    def set(self) -> None:
        """Raise the flag."""
        self._event.set()

    def clear(self) -> None:
        """Lower the flag."""
        self._event.clear()

    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the flag is raised or ``timeout`` passes; returns the flag."""
        return self._event.wait(timeout)
