"""A Fenwick tree of minimums: the adapters' time-range queries over the spans of a trace in ``O(log n)`` each."""

from __future__ import annotations

from typing import Any, Generic, List, Optional, Protocol, TypeVar

__all__ = ["MinimumTree"]


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


V = TypeVar("V", bound=_Ordered)


class MinimumTree(Generic[V]):
    """Slots numbered ``1..size``, each holding the smallest value put in it (or nothing).

    Putting a value in a slot and reading the smallest value of slots ``1..slot`` each take ``O(log size)``.

    Args:
        size: The number of slots.
    """

    def __init__(self, size: int) -> None:
        self._tree: List[Optional[V]] = [None] * (size + 1)

    def lower(self, slot: int, value: V) -> None:
        """Put ``value`` in ``slot`` (``1..size``): the slot keeps the smaller of it and what it held.

        Raises:
            IndexError: ``slot`` is not in ``1..size``.
        """
        if not 0 < slot < len(self._tree):
            raise IndexError(f"Slot {slot} is not in 1..{len(self._tree) - 1}.")
        while slot < len(self._tree):
            current = self._tree[slot]
            if current is None or value < current:
                self._tree[slot] = value
            slot += slot & -slot

    def minimum(self, slot: int) -> Optional[V]:
        """The smallest value in slots ``1..slot`` (``0..size``), None when they hold none."""
        found: Optional[V] = None
        while slot > 0:
            current = self._tree[slot]
            if current is not None and (found is None or current < found):
                found = current
            slot -= slot & -slot
        return found
