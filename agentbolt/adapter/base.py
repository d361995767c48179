"""Adapter base classes: callables that reshape traces into what an algorithm consumes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, List, Sequence, TypeVar

from agentbolt.types import Span, Triplet
from agentbolt.utils.checks import check_list_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = ["Adapter", "OtelTraceAdapter", "TraceAdapter", "TraceToTripletBase", "span_list"]

T_from = TypeVar("T_from")
T_to = TypeVar("T_to")


def span_list(source: Any) -> List[Any]:
    """The spans of ``source``, one rollout's sequence of spans, as a list (None gives none).

    Raises:
        TypeError: ``source`` is one span, or not a sequence of spans.
    """
    if source is None:
        return []
    return check_list_of(source, "an adapter's source", lambda item: hasattr(item, "attributes"), "spans")


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
