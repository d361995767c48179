"""OpenTelemetry-based tracer and the span processor that writes finished spans to the LightningStore.

Delivery guarantee of :class:`LightningSpanProcessor`: a span that starts in a rollout context (see the class for
which context a span belongs to) is written to the store, which issues its sequence id (ids follow the order in
which spans ended). Writing is the job of the
store's :class:`~agentbolt.store.span_writer.SpanWriter` (the writer the LLM gateway uses too), on a background
thread, so the agent never waits for the store while it runs. Spans are written in batches: a span is written at
the latest ``write_delay`` seconds after it ended (sooner when a batch fills up), and leaving the trace context
writes what is left at once and waits (up to ``write_timeout``) until the attempt's spans are stored. A short rollout
thus costs one batched write instead of two store calls per span. If the store is unreachable, spans stay in a
bounded in-memory buffer and are retried, in order, until the store is back. Spans are only given up when the
buffer is full, when the store rejects them as invalid (a 4xx-style error), or when the process exits before the
store came back; each case is logged as a warning with counts.

Stores that accept OpenTelemetry's own protocol (``capabilities["otlp_traces"]``: the store server and its HTTP
client) receive the spans over OTLP/HTTP instead: the processor's :class:`LightningStoreOTLPExporter` sends them to
``store.otlp_traces_endpoint()`` with ``agentlightning.rollout_id`` / ``agentlightning.attempt_id`` merged into each
span's resource, and the store issues sequence ids as the spans arrive. The exporter is driven by the same writer,
so the batching, bounded buffer and retries above apply unchanged: an export that fails while the store does not
answer is retried until it does; an export the store answered with an error is given up like a rejected write.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import Status
from opentelemetry.trace import StatusCode as OtelStatusCode
from pydantic import PrivateAttr

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.semconv import AGL_ANNOTATION
from agentbolt.store.base import LightningStore, LightningStoreCapabilities
from agentbolt.store.span_writer import DEFAULT_MAX_BUFFERED, PendingSpan, SpanWriter
from agentbolt.tracer.base import Tracer, is_untraced
from agentbolt.types.tracer import Attributes, Span, SpanCoreFields, StatusCode, TraceStatus, convert_timestamp
from agentbolt.utils.otel import format_exception_attributes, record_exception_event

if TYPE_CHECKING:
    from agentbolt.utils.otlp import LightningStoreOTLPExporter

__all__ = [
    "OtelTracer",
    "LightningSpanProcessor",
    "OtelSpanRecordingContext",
    "to_otel_status_code",
    "STORE_WRITE_TIMEOUT_SECONDS",
]

logger = logging.getLogger(__name__)

STORE_WRITE_TIMEOUT_SECONDS = 10.0
"""How long leaving a trace context waits for the context's spans to reach the store (they are retried after)."""

STORE_WRITE_DELAY_SECONDS = 1.0
"""Longest time a finished span waits to be batched with later ones before it is written."""

ANNOTATION_WRITE_TIMEOUT_SECONDS = 5.0
"""How long ending an annotation span (a reward) waits for it to be stored, with the spans that ended before it."""

_MAX_TRACKED_STARTS = 100_000
"""Most spans whose start context is remembered until they end (the oldest are forgotten beyond that)."""

DEFAULT_MAX_BUFFERED_SPANS = DEFAULT_MAX_BUFFERED

DEFAULT_IGNORED_SCOPES: Tuple[str, ...] = ("fastapi",)
"""Instrumentation scopes whose spans are not part of an agent's trace.

FastAPI traces every request it serves into the global tracer provider. Servers that run in the agent's process
(the store server in shared-memory mode, the LLM gateway, local inference servers) would otherwise add their
request spans to the rollout, and the store server would trace its own span writes in a feedback loop.
"""
_TRACER_NAME = "agentbolt"

_provider_lock = threading.Lock()
"""Serialises installing tracer providers (the global provider is the process's; a tracer must stay picklable)."""


def to_otel_status_code(status_code: StatusCode) -> OtelStatusCode:
    """OpenTelemetry status code for ``"UNSET"`` / ``"OK"`` / ``"ERROR"``."""
    return OtelStatusCode[status_code]


_warned_store_types: set[type] = set()


class _ExportedSpan(Span):
    """A span bound for an OTLP endpoint: it keeps the OpenTelemetry span that goes on the wire."""

    _otel_span: Optional[ReadableSpan] = PrivateAttr(default=None)


_OTEL_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
)
"""The loggers OpenTelemetry's OTLP/HTTP span exporter reports its retries, timeouts and shutdown on."""


class _HeldExporterRecords(logging.Filter):
    """Holds back the records OpenTelemetry's exporter logs while the current thread runs one of our exports.

    Installed once on :data:`_OTEL_EXPORTER_LOGGERS`; records of other threads (other exporters of the process)
    pass unchanged. See :meth:`_OtlpStoreTarget.export`.
    """

    _local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep ``record`` aside (and drop it here) while this thread holds records."""
        held: Optional[List[logging.LogRecord]] = getattr(self._local, "held", None)
        if held is None:
            return True
        held.append(record)
        return False

    @classmethod
    @contextmanager
    def holding(cls) -> Iterator[List[logging.LogRecord]]:
        """Hold the exporter's records of this thread for the duration; yields the list they are put in."""
        held: List[logging.LogRecord] = []
        cls._local.held = held
        try:
            yield held
        finally:
            cls._local.held = None


_held_exporter_records = _HeldExporterRecords()


def _install_held_exporter_records() -> None:
    for name in _OTEL_EXPORTER_LOGGERS:
        otel_logger = logging.getLogger(name)
        if _held_exporter_records not in otel_logger.filters:
            otel_logger.addFilter(_held_exporter_records)


class _OtlpStoreTarget(LightningStore):
    """Write-only store that delivers spans to a store's OTLP/HTTP endpoint through a LightningStoreOTLPExporter.

    The span writer hands it the spans it built; each one carries the OpenTelemetry span it came from, which the
    exporter encodes. The exporter retries briefly on its own; when it still fails, a store that does not answer
    at all is reported as unreachable (the writer keeps the spans and retries) and a store that answered as having
    rejected them (the writer gives them up one by one).
    """

    def __init__(self, exporter: LightningStoreOTLPExporter) -> None:
        self.exporter = exporter
        self.stopped = False
        """Set once the exporter was shut down because the process is stopping: exports fail without being sent."""
        self.closing = False
        """Set once the processor is stopping (shut down, or asked to stop retrying): see :meth:`export`."""
        _install_held_exporter_records()

    def export(self, spans: Sequence[ReadableSpan], rollout_id: str, attempt_id: str) -> SpanExportResult:
        """Export ``spans`` bound to the attempt (on a worker thread).

        OpenTelemetry's exporter logs each retry, timeout and its shutdown cutting a retry short. Those records are
        held until the export ends: they are logged then, unless the export failed while the processor is stopping,
        when the writer reports the spans it gives up in one line of its own and the exporter's lines would only
        repeat it.
        """
        with _HeldExporterRecords.holding() as held:
            result = self.exporter.export_bound(spans, rollout_id, attempt_id)
        if result is not SpanExportResult.SUCCESS and (self.closing or self.stopped):
            if held:
                logger.debug("Dropped %d OpenTelemetry exporter record(s) of a failed export at shutdown", len(held))
            return result
        for record in held:
            logging.getLogger(record.name).handle(record)
        return result

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """Safe to write from the writer's thread."""
        return LightningStoreCapabilities(thread_safe=True, async_safe=True, zero_copy=False, otlp_traces=True)

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        """Export the spans (the store issues their sequence ids on arrival); nothing is returned."""
        if self.stopped:
            raise ConnectionError(f"the store at {self.exporter.endpoint} does not answer")
        for (rollout_id, attempt_id), group in groupby(spans, key=lambda span: (span.rollout_id, span.attempt_id)):
            otel_spans = [span._otel_span for span in group if isinstance(span, _ExportedSpan)]
            exported = [otel_span for otel_span in otel_spans if otel_span is not None]
            result = await asyncio.to_thread(self.export, exported, rollout_id, attempt_id)
            if result is SpanExportResult.SUCCESS:
                continue
            endpoint = self.exporter.endpoint
            if await asyncio.to_thread(self.exporter.store_reachable):
                raise ValueError(f"The store at {endpoint} refused an OTLP export of {len(exported)} span(s)")
            raise ConnectionError(f"Cannot reach the store's OTLP endpoint {endpoint}")
        return []


@dataclass(eq=False, slots=True)
class _PendingWrite(PendingSpan):
    """A finished span waiting to be written, with the ids it belongs to.

    ``exported`` spans are bound for an :class:`_OtlpStoreTarget`: they carry their OpenTelemetry span. The store is
    not kept: a trace kept for :meth:`LightningSpanProcessor.spans` must not keep its store alive.
    """

    rollout_id: str
    attempt_id: str
    span: ReadableSpan
    local_sequence_id: int
    exported: bool = False
    stored: Optional[Span] = field(default=None, init=False)
    done: bool = field(default=False, init=False)

    def to_span(self, sequence_id: int) -> Span:
        """The span to store (the store issues its sequence id)."""
        if not self.exported:
            return Span.from_opentelemetry(self.span, self.rollout_id, self.attempt_id, sequence_id)
        exported = _ExportedSpan.from_opentelemetry(self.span, self.rollout_id, self.attempt_id, sequence_id)
        assert isinstance(exported, _ExportedSpan)  # from_opentelemetry builds the class it is called on
        exported._otel_span = self.span
        return exported

    def describe(self) -> str:
        """How log messages name this span."""
        return f"span {self.span.name!r} of rollout {self.rollout_id}"

    def completed(self, stored: Optional[Span]) -> None:
        """Keep the stored span (with its store-issued sequence id) for :meth:`LightningSpanProcessor.spans`."""
        self.stored = stored
        self.done = True

    def result(self) -> Span:
        """The stored span, or a local conversion while (or if) it is not stored (or was exported over OTLP)."""
        if self.stored is not None:
            return self.stored
        return Span.from_opentelemetry(self.span, self.rollout_id, self.attempt_id, self.local_sequence_id)


@dataclass(eq=False)
class _Binding:
    """One trace context of a :class:`LightningSpanProcessor`: where its spans go, and the spans it collected.

    ``target`` is where its spans are written: the store, the OTLP destination of the store, or None (spans are
    only collected locally). A binding stays reachable after its context closed, from the spans that started in
    it and from work the context left running, so that those spans still go to its rollout; it then lets go of
    its collected spans (``spans`` is None), which only :meth:`LightningSpanProcessor.spans` still holds.
    """

    store: Optional[LightningStore]
    rollout_id: Optional[str]
    attempt_id: Optional[str]
    target: Optional[LightningStore]
    spans: Optional[List[Union[Span, _PendingWrite]]]  # None once the context closed
    previous: Optional[_Binding] = None  # what the opening thread or task was bound to before
    next_local_sequence_id: int = 0

    @property
    def open(self) -> bool:
        """Whether the context is still open."""
        return self.spans is not None


class LightningSpanProcessor(SpanProcessor):
    """Collects finished spans and writes those of the current rollout attempt to the store.

    Each context (:meth:`with_context`, or the processor used as a context manager) binds the execution context
    that opens it (a :mod:`contextvars` context: a thread, an asyncio task, and what they start with a copy of it)
    to its store, rollout and attempt, and collects its own spans. Several contexts may be open at once in
    different threads or tasks: a span belongs to the context open where it *started*, and goes to that context's
    rollout even if it ends elsewhere or later. A span started where no context is open or inherited (a plain
    thread the agent started itself) belongs to the only context open in the process, and to none while several
    are open. :meth:`spans` returns the spans of the context the calling thread or task opened last.

    Args:
        disable_store_submission: Only collect spans locally (used when spans reach the store another way).
        max_buffered_spans: Spans kept while the store is unreachable; beyond that new spans are given up.
        write_timeout: Seconds leaving a store-bound context waits for its spans to be written (writes go on after).
        retry_initial_delay: First delay between retries of a failing write (doubles up to ``retry_max_delay``).
        retry_max_delay: Longest delay between retries.
        ignored_scopes: Instrumentation scopes whose spans are dropped (see :data:`DEFAULT_IGNORED_SCOPES`).
        max_batch_size: Most spans written in one batch; a full batch is written without waiting.
        write_delay: Longest time a finished span waits to be batched with later spans before it is written;
            flushing (leaving a trace context, :meth:`force_flush`) writes at once. 0 writes every span at once.
        otlp_exporter: Exporter that sends the spans of a rollout context over OTLP/HTTP while it is bound to a
            rollout attempt (see :meth:`LightningStoreOTLPExporter.enable_store_otlp`); set
            ``disable_store_submission`` meanwhile so spans are not also written directly.
    """

    def __init__(
        self,
        disable_store_submission: bool = False,
        *,
        max_buffered_spans: int = DEFAULT_MAX_BUFFERED_SPANS,
        write_timeout: float = STORE_WRITE_TIMEOUT_SECONDS,
        retry_initial_delay: float = 0.2,
        retry_max_delay: float = 5.0,
        ignored_scopes: Sequence[str] = DEFAULT_IGNORED_SCOPES,
        max_batch_size: int = 256,
        write_delay: float = STORE_WRITE_DELAY_SECONDS,
        otlp_exporter: Optional[LightningStoreOTLPExporter] = None,
    ) -> None:
        if max_buffered_spans < 1:
            raise ValueError("max_buffered_spans must be at least 1")
        if write_delay < 0:
            raise ValueError("write_delay must not be negative")
        self._disable_store_submission = disable_store_submission
        self._write_timeout = write_timeout
        self._ignored_scopes = frozenset(ignored_scopes)
        # One writer per store, each with the processor's buffering and retry settings.
        self._new_writer = functools.partial(
            SpanWriter,
            max_buffered=max_buffered_spans,
            max_batch=max(1, max_batch_size),
            write_delay=write_delay,
            retry_initial_delay=retry_initial_delay,
            retry_max_delay=retry_max_delay,
            logger=logger,
        )
        self._otlp_exporter = otlp_exporter
        self._otlp_target: Optional[_OtlpStoreTarget] = None

        # The context open in (or inherited by) each execution context, and the spans of the one it opened last.
        self._binding: ContextVar[Optional[_Binding]] = ContextVar(f"agentbolt_span_binding_{id(self)}", default=None)
        self._last_trace: ContextVar[Optional[List[Union[Span, _PendingWrite]]]] = ContextVar(
            f"agentbolt_last_trace_{id(self)}", default=None
        )
        self._open: List[_Binding] = []  # every open context, in the order they opened
        self._latest_trace: List[Union[Span, _PendingWrite]] = []  # spans of the context opened last in the process
        self._started: Dict[int, _Binding] = {}  # span id -> the context the span started in
        self._lock = threading.Lock()

        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[threading.Thread] = None
        self._loop_pid: Optional[int] = None
        self._writers: Dict[int, SpanWriter] = {}  # one per store, by identity
        self._given_up_by_stopped_writers = 0  # writers dropped by shutdown()

    # ---- properties ----

    @property
    def store(self) -> Optional[LightningStore]:
        """Store of the context open in the calling thread or task (see the class docstring)."""
        binding = self._open_binding()
        return binding.store if binding is not None else None

    @property
    def rollout_id(self) -> Optional[str]:
        """Rollout of the context open in the calling thread or task."""
        binding = self._open_binding()
        return binding.rollout_id if binding is not None else None

    @property
    def attempt_id(self) -> Optional[str]:
        """Attempt of the context open in the calling thread or task."""
        binding = self._open_binding()
        return binding.attempt_id if binding is not None else None

    @property
    def disable_store_submission(self) -> bool:
        """Whether spans are only collected locally."""
        return self._disable_store_submission

    @disable_store_submission.setter
    def disable_store_submission(self, value: bool) -> None:
        self._disable_store_submission = value

    @property
    def otlp_exporter(self) -> Optional[LightningStoreOTLPExporter]:
        """Exporter used while it is bound to a rollout attempt (None: spans are only written directly)."""
        return self._otlp_exporter

    @otlp_exporter.setter
    def otlp_exporter(self, exporter: Optional[LightningStoreOTLPExporter]) -> None:
        with self._lock:
            self._otlp_exporter = exporter
            self._otlp_target = None

    @property
    def pending_count(self) -> int:
        """Spans buffered and not yet written to the store."""
        return sum(writer.queued for writer in self._current_writers())

    @property
    def given_up_count(self) -> int:
        """Spans that could not be written and were given up (see the module docstring)."""
        return self._given_up_by_stopped_writers + sum(_given_up(writer) for writer in self._current_writers())

    def _current_writers(self) -> List[SpanWriter]:
        with self._lock:
            return list(self._writers.values())

    # ---- contexts ----

    def _only_open_binding(self) -> Optional[_Binding]:
        """The only context open in the process; None while none or several are open, or in ``untraced()``."""
        if is_untraced():
            return None
        with self._lock:
            return self._open[0] if len(self._open) == 1 else None

    def _current_binding(self) -> Optional[_Binding]:
        """The context that spans starting in the calling thread or task belong to.

        Its own context, or the one it inherited, even if that closed since (work a rollout left running stays
        with that rollout); without one, :meth:`_only_open_binding`.
        """
        binding = self._binding.get()
        return binding if binding is not None else self._only_open_binding()

    def _open_binding(self) -> Optional[_Binding]:
        """The open context of the calling thread or task; without one, :meth:`_only_open_binding`."""
        binding = self._binding.get()
        return binding if binding is not None and binding.open else self._only_open_binding()

    def _bind(self, store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]) -> _Binding:
        """Open a context in the calling thread or task.

        Where its spans are written is decided now: over OTLP while the exporter is bound to a rollout attempt,
        else directly to ``store`` unless store submission is disabled.
        """
        target: Optional[LightningStore] = None
        if store is not None and rollout_id is not None and attempt_id is not None:
            target = self._bound_otlp_target()
            if target is None and not self._disable_store_submission:
                target = store
        spans: List[Union[Span, _PendingWrite]] = []
        binding = _Binding(store, rollout_id, attempt_id, target, spans, previous=self._binding.get())
        with self._lock:
            self._open.append(binding)
            self._latest_trace = spans
        self._binding.set(binding)
        self._last_trace.set(spans)
        return binding

    def _unbind(self, binding: _Binding) -> None:
        """Close ``binding``; the thread or task that opened it is bound again to what it was bound to before."""
        with self._lock:
            binding.spans = None
            self._open = [other for other in self._open if other is not binding]
        if self._binding.get() is binding:
            self._binding.set(binding.previous)

    def __enter__(self) -> LightningSpanProcessor:
        """Open a context collecting spans locally (not bound to a rollout) in the calling thread or task."""
        self._bind(None, None, None)
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close the context the calling thread or task opened with ``with processor:`` (see :meth:`_open_binding`)."""
        binding = self._open_binding()
        if binding is not None:
            self._unbind(binding)

    @contextmanager
    def with_context(
        self,
        store: LightningStore,
        rollout_id: str,
        attempt_id: str,
        *,
        flush_timeout: Optional[float] = None,
    ) -> Iterator[LightningSpanProcessor]:
        """Collect spans and write them to ``store`` for the given attempt while the context is open.

        The context is bound to the calling thread or task (see the class docstring). On exit, waits (up to
        ``flush_timeout``, default ``write_timeout``) for the spans still queued to reach the store (not when the
        context is left by a cancellation or a ``KeyboardInterrupt``: a stopped rollout does not wait); what is left
        stays buffered and is retried. Spans are written from a background thread, so the store must be
        thread-safe (``LightningStoreThreaded``, ``InMemoryLightningStore(thread_safe=True)``, the SQLite store or
        the HTTP client); a warning is logged otherwise.
        """
        if not store.capabilities.get("thread_safe", False) and type(store) not in _warned_store_types:
            _warned_store_types.add(type(store))
            logger.warning(
                "%s is not thread-safe but spans are written to it from a background thread; wrap it in "
                "LightningStoreThreaded (or create it thread-safe).",
                type(store).__name__,
            )
        timeout = self._write_timeout if flush_timeout is None else flush_timeout
        binding = self._bind(store, rollout_id, attempt_id)
        stopped = False
        try:
            yield self
        except (asyncio.CancelledError, KeyboardInterrupt):
            stopped = True  # the rollout was stopped (Ctrl-C): its spans are written in the background, or given up
            raise
        finally:
            collected = binding.spans or []
            self._unbind(binding)
            # Only this context's spans are waited for and reported: other threads' rollouts write theirs meanwhile.
            if not stopped and _unwritten(collected) and not self.force_flush(int(timeout * 1000)):
                left = _unwritten(collected)
                if left:
                    logger.warning(
                        "Rollout %s attempt %s ended with %d span(s) not yet in the store; they stay buffered "
                        "and are retried in the background.",
                        rollout_id,
                        attempt_id,
                        left,
                    )

    async def flush_async(self, timeout: Optional[float] = None) -> bool:
        """:meth:`force_flush` without blocking the event loop (waits in a worker thread).

        Args:
            timeout: Seconds to wait (default ``write_timeout``).
        """
        seconds = self._write_timeout if timeout is None else timeout
        if not self.pending_count:
            return True
        return await asyncio.to_thread(self.force_flush, int(seconds * 1000))

    # ---- span processing ----

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Remember the context the span starts in: it belongs to that context's rollout wherever it ends."""
        context = span.context
        if context is None:
            return
        binding = self._current_binding()
        if binding is None:
            return
        with self._lock:
            if len(self._started) >= _MAX_TRACKED_STARTS:
                del self._started[next(iter(self._started))]
            self._started[context.span_id] = binding

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a finished span for writing (or collect it locally); never blocks on the store, never raises."""
        try:
            self._on_end(span)
        except Exception:
            logger.exception("Failed to process span %r", getattr(span, "name", span))

    def _on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None:
            return
        with self._lock:
            started_in = self._started.pop(context.span_id, None)
        # A span goes to the rollout of the context it started in: work a rollout left running (a task it did not
        # await) must not be stored, and rewarded, as the rollout running when it ends. Spans not seen starting
        # (started where no context was open) go to the context they end in.
        binding = started_in or self._current_binding()
        if binding is None or not context.trace_flags.sampled:
            return
        scope = span.instrumentation_scope
        if scope is not None and scope.name in self._ignored_scopes:
            return
        with self._lock:
            sequence_id = binding.next_local_sequence_id
            binding.next_local_sequence_id += 1
        rollout_id, attempt_id, target = binding.rollout_id, binding.attempt_id, binding.target
        if target is None or rollout_id is None or attempt_id is None:
            local = Span.from_opentelemetry(
                span, rollout_id or "rollout-dummy", attempt_id or "attempt-dummy", sequence_id
            )
            self._add_to_trace(binding, local)
            return
        item = _PendingWrite(rollout_id, attempt_id, span, sequence_id, exported=isinstance(target, _OtlpStoreTarget))
        self._add_to_trace(binding, item)
        self._submit(target, item)

    def _add_to_trace(self, binding: _Binding, entry: Union[Span, _PendingWrite]) -> None:
        """Add ``entry`` to the spans of ``binding`` while its context is open (a closed context's trace is final)."""
        with self._lock:
            if binding.spans is not None:
                binding.spans.append(entry)

    def _submit(self, store: LightningStore, item: _PendingWrite) -> None:
        """Queue ``item`` for ``store``; an annotation (a reward) is stored before the agent goes on.

        Sequence ids order the spans of a rollout, and an adapter gives each reward to the LLM call before it in
        that order. The store issues a span's id when it is written, up to ``write_delay`` after it ended, while
        the gateway takes the id of a call when the call arrives: a reward written late would sort after the next
        call. So ending an annotation span writes it, with every span that ended before it, at once.
        """
        writer = self._hand_over(store, item)
        if item.span.name != AGL_ANNOTATION or writer.unreachable:
            return
        if threading.current_thread() is self._loop_thread:
            return  # ended by the writer's own loop: it cannot wait for itself
        if not writer.flush_threadsafe(ANNOTATION_WRITE_TIMEOUT_SECONDS):
            logger.warning(
                "An annotation of rollout %s is not stored %g s after it ended; it stays buffered and may sort after "
                "LLM calls made meanwhile.",
                item.rollout_id,
                ANNOTATION_WRITE_TIMEOUT_SECONDS,
            )

    def _bound_otlp_target(self) -> Optional[_OtlpStoreTarget]:
        """The OTLP destination while the exporter is bound to a rollout attempt, else None."""
        exporter = self._otlp_exporter
        if exporter is None or exporter.rollout_id is None:
            return None
        with self._lock:
            if self._otlp_target is None or self._otlp_target.exporter is not exporter:
                self._otlp_target = _OtlpStoreTarget(exporter)
            return self._otlp_target

    # ---- background writer ----

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        """The writers' event loop, running on the ``otel-loop`` thread (a new one after a fork)."""
        with self._lock:
            alive = self._loop_thread is not None and self._loop_thread.is_alive()
            if self._loop is not None and alive and self._loop_pid == os.getpid():
                return self._loop
            # Writers of another process (before a fork) or of a dead loop cannot write from here.
            self._writers = {}
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                ready.set()
                loop.run_forever()

            thread = threading.Thread(target=run, name="otel-loop", daemon=True)
            self._loop, self._loop_thread, self._loop_pid = loop, thread, os.getpid()
            thread.start()
        ready.wait()
        return loop

    def _hand_over(self, store: LightningStore, item: _PendingWrite) -> SpanWriter:
        """Queue ``item`` with the writer of ``store`` on the running loop; returns that writer.

        A full buffer drops the span (counted and logged by the writer). The span is queued under the lock that
        :meth:`shutdown` takes the writers and the loop under, so it never lands in a writer being shut down (whose
        loop stops with it): a span ending while the last worker tears down starts a new loop and writer instead.
        """
        while True:
            loop = self._ensure_loop()
            with self._lock:
                if self._loop is not loop:
                    continue  # shut down since: start a new loop
                writer = self._writers.get(id(store))
                if writer is None or writer.store is not store:
                    writer = self._new_writer(store)
                    writer.start(loop)
                    self._writers[id(store)] = writer
                writer.submit(item)
                return writer

    # ---- results and lifecycle ----

    def spans(self) -> List[Span]:
        """Spans collected in the current (or last) context of the calling thread or task, in the order they ended.

        A thread or task that never opened a context (nor inherited one) gets those of the context opened last in
        the process. Spans already written are returned as stored (with their store-issued sequence ids); spans
        still waiting for the store are converted locally.
        """
        trace = self._last_trace.get()
        with self._lock:
            entries = list(trace if trace is not None else self._latest_trace)
        return [entry if isinstance(entry, Span) else entry.result() for entry in entries]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every buffered span is written (or given up).

        Returns:
            True when nothing is left in the buffer, False on timeout.
        """
        if threading.current_thread() is self._loop_thread:
            return self.pending_count == 0
        deadline = time.monotonic() + timeout_millis / 1000
        flushed = True
        for writer in self._current_writers():
            flushed = writer.flush_threadsafe(max(0.0, deadline - time.monotonic())) and flushed
        return flushed

    def stop_retrying(self) -> None:
        """Give up the spans the store cannot take instead of retrying them: the process is stopping (Ctrl-C).

        Spans are still written while their store takes them; those waiting for a store that does not answer are
        given up, and counted in one warning per store (see :meth:`SpanWriter.stop_retrying`). When spans wait for
        an OTLP store that does not answer (asked once, for at most a second), the exporter is shut down, which cuts
        its own retries short: the shutdown does not wait them out.
        """
        writers = self._current_writers()
        for writer in writers:
            writer.stop_retrying()
        with self._lock:
            exporter, target = self._otlp_exporter, self._otlp_target
        if exporter is None or target is None:
            return
        target.closing = True
        otlp_writers = [writer for writer in writers if writer.store is target]
        # A first export to a store that just went away is not known to fail yet: asking the store tells.
        if any(writer.unreachable for writer in otlp_writers) or (
            any(writer.queued for writer in otlp_writers) and not exporter.store_reachable(timeout=1.0)
        ):
            target.stopped = True
            exporter.shutdown()

    def resume_retrying(self) -> bool:
        """Undo :meth:`stop_retrying` for a new run of the process: writes ride out store outages again.

        Returns:
            Whether :meth:`stop_retrying` shut the OTLP exporter down: its spans stay given up, and OTLP export needs a
            new exporter (:attr:`otlp_exporter`).
        """
        with self._lock:
            target = self._otlp_target
        if target is not None:
            target.closing = False
        exporter_shut_down = target is not None and target.stopped
        for writer in self._current_writers():
            if not (exporter_shut_down and writer.store is target):
                writer.resume_retrying()
        return exporter_shut_down

    def shutdown(self) -> None:
        """Flush (bounded by ``write_timeout``), report what could not be written, and stop the writer thread."""
        if self._loop is None:
            return
        with self._lock:
            if self._otlp_target is not None:
                self._otlp_target.closing = True
            # Stopped writers are dropped: they hold their stores, which the caller may close and drop. The loop is
            # taken with them, so a span ending from now on goes to a new loop and writer (see _hand_over).
            writers, self._writers = list(self._writers.values()), {}
            loop, thread, self._loop = self._loop, self._loop_thread, None
        deadline = time.monotonic() + self._write_timeout
        for writer in writers:
            writer.stop_threadsafe(max(0.0, deadline - time.monotonic()))
            self._given_up_by_stopped_writers += _given_up(writer)
        if loop is None or thread is None or not thread.is_alive():
            return
        # Tasks still running on the loop (a writer that did not stop in time) are cancelled and awaited: a loop
        # closed with pending tasks makes asyncio report each one as destroyed.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()


def _unwritten(collected: Sequence[Union[Span, _PendingWrite]]) -> int:
    """How many of a context's collected spans its writer has neither written nor given up yet."""
    return sum(1 for entry in collected if isinstance(entry, _PendingWrite) and not entry.done)


def _given_up(writer: SpanWriter) -> int:
    """Spans ``writer`` could not write and gave up."""
    return writer.dropped + writer.failed + writer.lost


async def _cancel_other_tasks() -> None:
    """Cancel every task of the running loop but the current one, and wait (briefly) until they end."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=2.0)


class OtelSpanRecordingContext:
    """Handle on an OpenTelemetry span opened by :meth:`OtelTracer.operation_context`."""

    def __init__(self, span: trace_api.Span) -> None:
        self._span = span

    def record_exception(self, exception: BaseException) -> None:
        """Record the exception and mark the span failed."""
        message = record_exception_event(self._span, exception)
        self._span.set_status(Status(OtelStatusCode.ERROR, message))

    def record_attributes(self, attributes: Attributes) -> None:
        """Add or overwrite attributes."""
        self._span.set_attributes(attributes)

    def record_status(self, status_code: StatusCode, description: Optional[str] = None) -> None:
        """Set the span status (the description is kept for errors only, as OpenTelemetry does)."""
        self._span.set_status(Status(to_otel_status_code(status_code), description if status_code == "ERROR" else None))

    def get_otel_span(self) -> trace_api.Span:
        """The underlying OpenTelemetry span."""
        return self._span

    def get_recorded_span(self) -> SpanCoreFields:
        """The span's core fields (``end_time`` is None while it is open)."""
        span: Any = self._span
        status = span.status
        return SpanCoreFields(
            name=span.name,
            status=TraceStatus(status_code=status.status_code.name, description=status.description),
            attributes=dict(span.attributes or {}),
            start_time=convert_timestamp(span.start_time),
            end_time=convert_timestamp(span.end_time),
        )


def _set_global_tracer_provider(provider: TracerProvider) -> None:
    existing = getattr(trace_api, "_TRACER_PROVIDER", None)
    if existing is not None and existing is not provider:
        logger.warning("Replacing the global OpenTelemetry tracer provider %r with the tracer's own.", existing)
    # set_tracer_provider() refuses to replace a provider; tracers own the global provider of their worker.
    trace_api._TRACER_PROVIDER = provider  # type: ignore[attr-defined]


class OtelTracer(Tracer):
    """Tracer built on the OpenTelemetry SDK: spans of the process are collected and written to the store.

    ``init_worker`` installs a fresh SDK ``TracerProvider`` as the global provider, with a
    :class:`LightningSpanProcessor`. Spans created by any OpenTelemetry instrumentation while a trace context
    is open belong to that context's rollout attempt.

    Trace contexts opened in different threads or asyncio tasks may be open at once (several runner threads of one
    process sharing the tracer): each records its own rollout (see :class:`LightningSpanProcessor`).

    Args:
        max_buffered_spans: See :class:`LightningSpanProcessor`.
        write_timeout: See :class:`LightningSpanProcessor`.
    """

    supports_concurrent_contexts = True

    def __init__(
        self,
        *,
        max_buffered_spans: int = DEFAULT_MAX_BUFFERED_SPANS,
        write_timeout: float = STORE_WRITE_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__()
        self._max_buffered_spans = max_buffered_spans
        self._write_timeout = write_timeout
        self._tracer_provider: Optional[TracerProvider] = None
        self._lightning_span_processor: Optional[LightningSpanProcessor] = None
        self._workers: Set[int] = set()  # workers initialized and not yet torn down

    def init_worker(self, worker_id: int, store: Optional[LightningStore] = None) -> None:
        """Install the tracer provider and span processor (once per tracer) and remember the store.

        A tracer started again after :meth:`stop_retrying` (a second run in the same process) retries through store
        outages again.
        """
        super().init_worker(worker_id, store)
        with _provider_lock:  # runner threads sharing the tracer start their workers at the same time
            self._workers.add(worker_id)
            if self._tracer_provider is None:
                self._initialize_tracer_provider()
            elif self._lightning_span_processor is not None and self._lightning_span_processor.resume_retrying():
                from agentbolt.utils.otlp import LightningStoreOTLPExporter

                self._lightning_span_processor.otlp_exporter = LightningStoreOTLPExporter()

    def _initialize_tracer_provider(self) -> None:
        # A chat span carries several attributes per message: OpenTelemetry's default limit (128 attributes per
        # span) would silently drop the end of long conversations. Unlimited unless configured by env var.
        limits = (
            SpanLimits()
            if "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in os.environ
            else SpanLimits(max_span_attributes=SpanLimits.UNSET)
        )
        from agentbolt.utils.otlp import LightningStoreOTLPExporter

        provider = TracerProvider(span_limits=limits)
        processor = LightningSpanProcessor(
            max_buffered_spans=self._max_buffered_spans,
            write_timeout=self._write_timeout,
            otlp_exporter=LightningStoreOTLPExporter(),
        )
        provider.add_span_processor(processor)
        _set_global_tracer_provider(provider)
        self._tracer_provider = provider
        self._lightning_span_processor = processor

    def teardown_worker(self, worker_id: int) -> None:
        """Flush buffered spans (bounded); the provider stays installed.

        Once no worker of this tracer runs (runner threads of one process share it), the span processor's writer
        thread stops as well, so that a process running one training after another keeps no thread per run. The
        collected spans stay readable, and spans that end later start the thread again.
        """
        super().teardown_worker(worker_id)
        processor = self._lightning_span_processor
        if processor is None:
            return
        with _provider_lock:  # a worker starting meanwhile waits, and finds the processor stopped and restartable
            self._workers.discard(worker_id)
            if not self._workers:
                processor.shutdown()
                return
        processor.force_flush(int(self._write_timeout * 1000))

    def stop_retrying(self) -> None:
        """The process is stopping (Ctrl-C): spans the store cannot take are given up, not retried.

        See :meth:`LightningSpanProcessor.stop_retrying`; does nothing before :meth:`init_worker`, and lasts until
        the next :meth:`init_worker`.
        """
        if self._lightning_span_processor is not None:
            self._lightning_span_processor.stop_retrying()

    def _require_initialized(self) -> tuple[TracerProvider, LightningSpanProcessor]:
        if self._tracer_provider is None or self._lightning_span_processor is None:
            raise RuntimeError(f"{type(self).__name__} is not initialized: call init_worker() first.")
        return self._tracer_provider, self._lightning_span_processor

    def get_otel_tracer(self) -> trace_api.Tracer:
        """The OpenTelemetry tracer of this tracer's provider.

        Raises:
            RuntimeError: ``init_worker`` was not called.
        """
        provider, _ = self._require_initialized()
        return provider.get_tracer(_TRACER_NAME)

    @contextmanager
    def _collect(
        self,
        store: Optional[LightningStore],
        rollout_id: Optional[str],
        attempt_id: Optional[str],
        flush_timeout: Optional[float] = None,
    ) -> Iterator[trace_api.Tracer]:
        """Open the span processor's context (store-bound when ids are given) and yield an OTel tracer.

        ``flush_timeout`` bounds the blocking wait for queued spans on exit; async callers pass 0 after awaiting
        :meth:`LightningSpanProcessor.flush_async` themselves.
        """
        _, processor = self._require_initialized()
        self._check_ids(rollout_id, attempt_id)
        if rollout_id is not None and attempt_id is not None:
            if store is None:
                raise ValueError("A store is required to trace a rollout: pass it to init_worker().")
            self._select_store_path(processor, store, rollout_id, attempt_id)
            with processor.with_context(store, rollout_id, attempt_id, flush_timeout=flush_timeout):
                yield self.get_otel_tracer()
        else:
            with processor:
                yield self.get_otel_tracer()

    @staticmethod
    def _select_store_path(
        processor: LightningSpanProcessor, store: LightningStore, rollout_id: str, attempt_id: str
    ) -> None:
        """Send the next context's spans over OTLP/HTTP when the store accepts it, else write them directly.

        The exporter stays bound after the context (spans still buffered keep their endpoint while they are
        retried); the next context binds it again or unbinds it. The choice and the endpoint belong to the
        processor, so contexts open at once must use the same store (the worker's store does).

        Raises:
            RuntimeError: The store accepts OTLP but the processor has no exporter.
        """
        exporter = processor.otlp_exporter
        if not store.capabilities.get("otlp_traces", False):
            if exporter is not None:
                exporter.disable_store_otlp()
            processor.disable_store_submission = False
            return
        if exporter is None:
            raise RuntimeError(
                f"{type(store).__name__} accepts OTLP traces but the span processor has no LightningStoreOTLPExporter."
            )
        # Stores reached over HTTP know their bearer token; $AGENTBOLT_API_KEY is the exporter's default.
        api_key = getattr(store, "_api_key", None) or os.environ.get(API_KEY_ENV_VAR)
        exporter.enable_store_otlp(store.otlp_traces_endpoint(), rollout_id, attempt_id, api_key=api_key)
        processor.disable_store_submission = True

    @asynccontextmanager
    async def _trace(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> AsyncIterator[trace_api.Tracer]:
        """Collect spans (written to the store when both ids are given); yields an OpenTelemetry tracer."""
        _, processor = self._require_initialized()
        with self._collect(store, rollout_id, attempt_id, flush_timeout=0) as tracer:
            cancelled = False
            try:
                with self._root_span(tracer, name, rollout_id, attempt_id):
                    yield tracer
            except asyncio.CancelledError:
                cancelled = True
                raise
            finally:
                # A cancelled context (a runner asked to stop) does not wait for its spans: they stay buffered and
                # are written in the background, or given up by stop_retrying() when the store is gone.
                if not cancelled:
                    await processor.flush_async()

    @contextmanager
    def _trace_sync(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> Iterator[trace_api.Tracer]:
        with (
            self._collect(store, rollout_id, attempt_id) as tracer,
            self._root_span(tracer, name, rollout_id, attempt_id),
        ):
            yield tracer

    @contextmanager
    def _root_span(
        self, tracer: trace_api.Tracer, name: Optional[str], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> Iterator[None]:
        """What encloses the spans of a trace context: nothing here; subclasses open a root span."""
        yield

    def get_last_trace(self) -> List[Span]:
        """Spans collected by the current or most recent trace context of the calling thread or task."""
        _, processor = self._require_initialized()
        return processor.spans()

    def _record_instant_span(
        self, name: str, attributes: Attributes, timestamp: Optional[float], status: TraceStatus
    ) -> Tuple[float, Attributes]:
        """Record the span as a child of the current span, if any (``init_worker`` must have been called)."""
        tracer = self.get_otel_tracer()
        moment = timestamp if timestamp is not None else time.time()
        nanos = int(moment * 1e9)
        span = tracer.start_span(name, attributes=attributes, start_time=nanos)
        OtelSpanRecordingContext(span).record_status(status.status_code, status.description)
        span.end(end_time=nanos)
        return moment, dict(getattr(span, "attributes", None) or attributes)

    @contextmanager
    def _open_operation(
        self, name: str, attributes: Optional[Attributes], start_time: Optional[float], end_time: Optional[float]
    ) -> Iterator[OtelSpanRecordingContext]:
        """Record the span as the current span; ``end_time`` is ignored: the span ends when the block exits."""
        if end_time is not None:
            logger.warning("OtelTracer.operation_context ignores end_time; the span ends when the block exits.")
        tracer = self.get_otel_tracer()
        with tracer.start_as_current_span(
            name,
            attributes=attributes,
            start_time=int(start_time * 1e9) if start_time is not None else None,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            recording = OtelSpanRecordingContext(span)
            try:
                yield recording
            except BaseException as exc:
                recording.record_attributes(format_exception_attributes(exc))
                raise
