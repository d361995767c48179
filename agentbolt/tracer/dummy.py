"""A tracer that records nothing anywhere: emitters with ``propagate=False`` use it to build span core fields."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, AsyncContextManager, Iterator, List, Optional, Tuple

from agentbolt.tracer.base import Tracer
from agentbolt.types.tracer import Attributes, Span, SpanCoreFields, StatusCode, TraceStatus
from agentbolt.utils.otel import format_exception_attributes

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = ["DummyTracer", "DummySpanRecordingContext"]


class DummySpanRecordingContext:
    """In-memory span recording used by :class:`DummyTracer`.

    Args:
        name: Span name.
        attributes: Initial attributes.
        start_time: Start in seconds (default: now).
    """

    def __init__(self, name: str, attributes: Optional[Attributes] = None, start_time: Optional[float] = None) -> None:
        self.name = name
        self.attributes: Attributes = dict(attributes or {})
        self.start_time = start_time if start_time is not None else time.time()
        self.end_time: Optional[float] = None
        self.status = TraceStatus(status_code="OK")

    def record_exception(self, exception: BaseException) -> None:
        """Mark the span failed and attach the exception's attributes."""
        self.record_status("ERROR", str(exception))
        self.record_attributes(format_exception_attributes(exception))

    def record_attributes(self, attributes: Attributes) -> None:
        """Add or overwrite attributes."""
        self.attributes.update(attributes)

    def record_status(self, status_code: StatusCode, description: Optional[str] = None) -> None:
        """Set the span status."""
        self.status = TraceStatus(status_code=status_code, description=description)

    def finalize(self, end_time: Optional[float] = None) -> None:
        """Close the span at ``end_time`` (default: now)."""
        self.end_time = end_time if end_time is not None else time.time()

    def get_recorded_span(self) -> SpanCoreFields:
        """The finished span's core fields.

        Raises:
            ValueError: The span is not finished yet.
        """
        if self.end_time is None:
            raise ValueError(f"Span {self.name!r} is not finished yet.")
        return SpanCoreFields(
            name=self.name,
            status=self.status,
            attributes=dict(self.attributes),
            start_time=self.start_time,
            end_time=self.end_time,
        )


_NO_TRACES = "DummyTracer does not collect traces; use OtelTracer or AgentOpsTracer."


class DummyTracer(Tracer):
    """Builds span core fields without exporting or storing anything.

    :meth:`create_span` returns the span at ``timestamp`` (default: now); :meth:`operation_context` records the
    span in memory (with the given start and end times, if any). Trace contexts are not supported: entering one
    raises ``NotImplementedError``.
    """

    def _trace(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> AsyncContextManager[Any]:
        raise NotImplementedError(_NO_TRACES)

    def get_last_trace(self) -> List[Span]:
        """Not supported: a dummy tracer collects no traces."""
        raise NotImplementedError(_NO_TRACES)

    def _record_instant_span(
        self, name: str, attributes: Attributes, timestamp: Optional[float], status: TraceStatus
    ) -> Tuple[float, Attributes]:
        return (timestamp if timestamp is not None else time.time()), attributes

    @contextmanager
    def _open_operation(
        self, name: str, attributes: Optional[Attributes], start_time: Optional[float], end_time: Optional[float]
    ) -> Iterator[DummySpanRecordingContext]:
        recording = DummySpanRecordingContext(name, attributes, start_time)
        try:
            yield recording
        finally:
            recording.finalize(end_time)
