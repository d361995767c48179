"""Adapter base classes: callables that reshape traces into what an algorithm consumes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, List, Sequence, TypeVar

from agentbolt.types import Span, Triplet

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["Adapter", "OtelTraceAdapter", "TraceAdapter", "TraceToTripletBase"]

T_from = TypeVar("T_from")
T_to = TypeVar("T_to")


class Adapter(Generic[T_from, T_to]):
    """Converts data of one shape into another; calling the adapter calls :meth:`adapt`."""

    def __call__(self, source: T_from, /) -> T_to:
        """Adapt ``source`` (same as :meth:`adapt`)."""
        return self.adapt(source)

    def adapt(self, source: T_from, /) -> T_to:
        """Convert ``source``.

        Args:
            source: The input data.

        Returns:
            The converted data.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement adapt().")


class OtelTraceAdapter(Adapter[Sequence["ReadableSpan"], T_to], Generic[T_to]):
    """An adapter reading raw OpenTelemetry spans."""


class TraceAdapter(Adapter[Sequence[Span], T_to], Generic[T_to]):
    """An adapter reading spans as stored by the LightningStore."""


class TraceToTripletBase(TraceAdapter[List[Triplet]]):
    """An adapter producing (prompt, response, reward) triplets for reinforcement learning."""
