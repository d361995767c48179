"""The tracer interface and the active tracer.

A tracer collects the spans of one rollout attempt while the agent runs inside ``async with
tracer.trace_context(...)``. During that block the tracer is the *active tracer*, which emitters
(:mod:`agentbolt.emitter`) use to record rewards, messages and operations.

The active tracer belongs to an execution context (a :mod:`contextvars` context): each thread, and each asyncio
task, that opens a trace context has its own, so several runner threads (or tasks) of one process can trace their
rollouts at the same time with one tracer. What a context starts inherits its active tracer: asyncio tasks,
``asyncio.to_thread`` and anything run with ``contextvars.copy_context().run(...)``. A plain thread the agent starts
itself inherits nothing; there :func:`get_active_tracer` falls back to the process: it returns the tracer of the
only trace context open in the process, and None while none or several are open (which of several rollouts such a
thread works for cannot be told; start it with ``asyncio.to_thread`` or ``copy_context().run`` instead).
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncContextManager,
    AsyncIterator,
    Awaitable,
    Callable,
    ClassVar,
    ContextManager,
    Iterator,
    List,
    Optional,
    Tuple,
    TypeVar,
)

from agentbolt.types import ParallelWorkerBase
from agentbolt.types.tracer import Attributes, Span, SpanCoreFields, SpanRecordingContext, TraceStatus

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = [
    "Tracer",
    "get_active_tracer",
    "set_active_tracer",
    "clear_active_tracer",
    "with_active_tracer_context",
    "with_active_tracer_context_sync",
    "untraced",
    "is_untraced",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
TracerT = TypeVar("TracerT", bound="Tracer")


class _OpenTraceContext:
    """One open trace context: its tracer, and whether it is still open."""

    __slots__ = ("open", "tracer")

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.open = True


_current: ContextVar[Optional[_OpenTraceContext]] = ContextVar("agentbolt_active_tracer", default=None)
"""The trace context open in (or inherited by) the current execution context."""

_open_contexts: List[_OpenTraceContext] = []
"""Every trace context open in the process, for code running in a context that has none."""

_open_lock = threading.Lock()

_untraced: ContextVar[bool] = ContextVar("agentbolt_untraced", default=False)
"""Set where no rollout runs (an algorithm beside runner threads): see :func:`untraced`."""


@contextmanager
def untraced() -> Iterator[None]:
    """Run the block as code that belongs to no rollout.

    Code without a trace context of its own (a plain thread an agent started) is attributed to the only trace
    context open in the process. Code in this block (and the tasks and threads it starts with a copy of its
    context) never is: the shared-memory strategy runs its algorithm so, and the algorithm's own LLM calls (APO's
    optimizer, say) are not recorded as calls of a rollout running beside it.
    """
    token = _untraced.set(True)
    try:
        yield
    finally:
        _untraced.reset(token)


def is_untraced() -> bool:
    """Whether the calling code runs in an :func:`untraced` block (and no trace context of its own)."""
    return _untraced.get()


def _own_context() -> Optional[_OpenTraceContext]:
    """The open trace context of the current execution context, if it has one."""
    entry = _current.get()
    return entry if entry is not None and entry.open else None


def _process_context() -> Optional[_OpenTraceContext]:
    """The only trace context open in the process; None while none or several are open, or in :func:`untraced`."""
    if is_untraced():
        return None
    with _open_lock:
        return _open_contexts[0] if len(_open_contexts) == 1 else None


def _activate(tracer: Tracer) -> _OpenTraceContext:
    """Open a trace context of ``tracer`` in the current execution context.

    Raises:
        ValueError: A trace context is already open in this execution context, or ``tracer`` does not support
            concurrent trace contexts and has one open elsewhere in the process.
    """
    active = _own_context()
    if active is not None:
        raise ValueError(
            f"An active tracer ({type(active.tracer).__name__}) is already set in this thread or task; "
            "trace contexts do not nest."
        )
    entry = _OpenTraceContext(tracer)
    with _open_lock:
        if not tracer.supports_concurrent_contexts and any(other.tracer is tracer for other in _open_contexts):
            raise ValueError(
                f"{type(tracer).__name__} is already tracing in another thread or task of this process and records "
                "one trace context at a time; run one runner per process (the client-server strategy)."
            )
        _open_contexts.append(entry)
    _current.set(entry)
    return entry


def _deactivate(entry: _OpenTraceContext) -> None:
    """Close ``entry`` (from whichever execution context: it is forgotten by the process and by its own)."""
    with _open_lock:
        entry.open = False
        _open_contexts[:] = [other for other in _open_contexts if other is not entry]
    if _current.get() is entry:
        _current.set(None)


def set_active_tracer(tracer: Tracer) -> None:
    """Make ``tracer`` the active tracer of the current thread or asyncio task (and of what it starts).

    Raises:
        ValueError: A tracer is already active in this thread or task (trace contexts do not nest), or ``tracer``
            records one trace context at a time and is active elsewhere in the process.
    """
    _activate(tracer)


def get_active_tracer() -> Optional[Tracer]:
    """The tracer whose trace context is open in the current thread or task, if any.

    In a thread or task that has none (a plain thread the agent started), the tracer of the only trace context
    open in the process; None while none or several are open.
    """
    entry = _own_context() or _process_context()
    return entry.tracer if entry is not None else None


def clear_active_tracer() -> None:
    """Forget the active tracer that :func:`get_active_tracer` returns here (nothing when there is none)."""
    entry = _own_context() or _process_context()
    if entry is not None:
        _deactivate(entry)


def with_active_tracer_context(
    func: Callable[..., AsyncContextManager[T]],
) -> Callable[..., AsyncContextManager[T]]:
    """Decorate a tracer method returning an async context manager so the tracer is active inside it.

    Entering sets the tracer active in the current thread or task (failing if one is already active there),
    leaving (or a failed enter) clears it.
    """

    @functools.wraps(func)
    @asynccontextmanager
    async def wrapper(self: Tracer, *args: Any, **kwargs: Any) -> AsyncIterator[T]:
        entry = _activate(self)
        try:
            async with func(self, *args, **kwargs) as value:
                yield value
        finally:
            _deactivate(entry)

    return wrapper


def with_active_tracer_context_sync(func: Callable[..., ContextManager[T]]) -> Callable[..., ContextManager[T]]:
    """Synchronous counterpart of :func:`with_active_tracer_context`."""

    @functools.wraps(func)
    @contextmanager
    def wrapper(self: Tracer, *args: Any, **kwargs: Any) -> Iterator[T]:
        entry = _activate(self)
        try:
            with func(self, *args, **kwargs) as value:
                yield value
        finally:
            _deactivate(entry)

    return wrapper


class Tracer(ParallelWorkerBase):
    """Base class of tracers.

    Lifecycle: ``init()`` once, ``init_worker(worker_id, store)`` in each worker, then any number of
    ``trace_context(...)`` blocks, then ``teardown_worker`` / ``teardown``.

    Attributes:
        supports_concurrent_contexts: Whether trace contexts of one tracer may be open in several threads or tasks
            of the process at once (each recording its own rollout). A tracer that keeps one trace's state for the
            whole process leaves it False: opening a second context then raises ``ValueError``.
    """

    supports_concurrent_contexts: ClassVar[bool] = False
    _store: Optional[LightningStore] = None

    def init_worker(self, worker_id: int, store: Optional[LightningStore] = None) -> None:
        """Prepare the tracer in a worker.

        Args:
            worker_id: The worker's index.
            store: Store that receives spans of traced rollouts.
        """
        super().init_worker(worker_id)
        self._store = store

    def _effective_store(self, store: Optional[LightningStore]) -> Optional[LightningStore]:
        """The store of a trace context: ``store`` when given (deprecated, warned), else the worker's store."""
        if store is not None:
            warnings.warn(
                "Passing store to trace_context() is deprecated; pass it to init_worker() instead.",
                DeprecationWarning,
                stacklevel=4,
            )
            return store
        return self._store

    @staticmethod
    def _check_ids(rollout_id: Optional[str], attempt_id: Optional[str]) -> None:
        """Reject a trace context given only one of the rollout and attempt ids."""
        if (rollout_id is None) != (attempt_id is None):
            raise ValueError("rollout_id and attempt_id must be either all provided or all None")

    def _resolve_store(
        self, store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> Optional[LightningStore]:
        """The store of a trace context (see :meth:`_effective_store`); subclasses add their own checks."""
        return self._effective_store(store)

    @with_active_tracer_context
    @asynccontextmanager
    async def trace_context(
        self,
        name: Optional[str] = None,
        *,
        store: Optional[LightningStore] = None,
        rollout_id: Optional[str] = None,
        attempt_id: Optional[str] = None,
    ) -> AsyncIterator[Any]:
        """Async context in which spans are collected (and stored when rollout/attempt ids are given).

        The tracer is the active tracer inside the block.

        Args:
            name: Name of the trace (often the rollout id).
            store: Deprecated; the store given to :meth:`init_worker` is used by default.
            rollout_id: Rollout the spans belong to.
            attempt_id: Attempt the spans belong to.

        Yields:
            What the tracer offers for recording by hand (an OpenTelemetry tracer, a Weave client...).

        Raises:
            RuntimeError: ``init_worker`` was not called.
            ValueError: Only one of the ids is given, or ids without a store.
        """
        effective = self._resolve_store(store, rollout_id, attempt_id)
        async with self._trace(name, effective, rollout_id, attempt_id) as value:
            yield value

    @with_active_tracer_context_sync
    @contextmanager
    def _trace_context_sync(
        self,
        name: Optional[str] = None,
        *,
        store: Optional[LightningStore] = None,
        rollout_id: Optional[str] = None,
        attempt_id: Optional[str] = None,
    ) -> Iterator[Any]:
        """Synchronous trace context (legacy API)."""
        effective = self._resolve_store(store, rollout_id, attempt_id)
        with self._trace_sync(name, effective, rollout_id, attempt_id) as value:
            yield value

    def _trace(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> AsyncContextManager[Any]:
        """The tracer's own work in :meth:`trace_context` (the store is resolved, the tracer is active)."""
        raise NotImplementedError()

    def _trace_sync(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> ContextManager[Any]:
        """The tracer's own work in :meth:`_trace_context_sync`."""
        raise NotImplementedError()

    def get_last_trace(self) -> List[Span]:
        """Spans collected by the most recent trace context."""
        raise NotImplementedError()

    def trace_run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``func`` inside a synchronous trace context named after it."""
        with self._trace_context_sync(name=func.__name__):
            return func(*args, **kwargs)

    async def trace_run_async(self, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await ``func`` inside a trace context named after it."""
        async with self.trace_context(name=func.__name__):
            return await func(*args, **kwargs)

    def create_span(
        self,
        name: str,
        attributes: Optional[Attributes] = None,
        timestamp: Optional[float] = None,
        status: Optional[TraceStatus] = None,
    ) -> SpanCoreFields:
        """Record an instantaneous span (fire and forget).

        Args:
            name: Span name.
            attributes: Span attributes (already flat and sanitised).
            timestamp: Time of the span in seconds since the epoch (default: now; a tracer that timestamps spans
                itself ignores it).
            status: Span status (default OK).

        Returns:
            The recorded core fields: the span starts and ends at the same moment.

        Raises:
            RuntimeError: The tracer needs ``init_worker`` and it was not called.
        """
        status = status or TraceStatus(status_code="OK")
        moment, recorded = self._record_instant_span(name, dict(attributes or {}), timestamp, status)
        return SpanCoreFields(name=name, status=status, attributes=recorded, start_time=moment, end_time=moment)

    def _record_instant_span(
        self, name: str, attributes: Attributes, timestamp: Optional[float], status: TraceStatus
    ) -> Tuple[float, Attributes]:
        """The tracer's own work in :meth:`create_span`: record the span, return its time and attributes as recorded."""
        raise NotImplementedError()

    def operation_context(
        self,
        name: str,
        attributes: Optional[Attributes] = None,
        start_time: Optional[float] = None,
        end_time: Optional[float] = None,
    ) -> ContextManager[SpanRecordingContext]:
        """Context manager recording a span around a block of code.

        An exception raised in the block is recorded on the span (which is then failed) and re-raised.

        Args:
            name: Span name.
            attributes: Initial attributes.
            start_time: Explicit start time in seconds (default: now; a tracer that times spans itself ignores it).
            end_time: Explicit end time in seconds (default: when the block exits; a tracer that times spans itself
                ignores it).
        """
        return self._recording_operation(name, attributes, start_time, end_time)

    @contextmanager
    def _recording_operation(
        self, name: str, attributes: Optional[Attributes], start_time: Optional[float], end_time: Optional[float]
    ) -> Iterator[SpanRecordingContext]:
        with self._open_operation(name, attributes, start_time, end_time) as recording:
            try:
                yield recording
            except BaseException as exc:
                recording.record_exception(exc)
                raise

    def _open_operation(
        self, name: str, attributes: Optional[Attributes], start_time: Optional[float], end_time: Optional[float]
    ) -> ContextManager[SpanRecordingContext]:
        """The tracer's own work in :meth:`operation_context`: open the span and yield its recording; close it on exit.

        An exception of the block is already recorded on the recording when it reaches this context manager.
        """
        raise NotImplementedError()

    def get_langchain_handler(self) -> Any:
        """A LangChain callback handler feeding this tracer, or None when the tracer has none."""
        logger.warning("%s does not provide a LangChain callback handler.", type(self).__name__)
        return None

    @contextmanager
    def lifespan(self: TracerT, store: Optional[LightningStore] = None) -> Iterator[TracerT]:
        """Run ``init`` and ``init_worker(0, store)``, undoing whichever succeeded on exit.

        Args:
            store: Store passed to :meth:`init_worker`.
        """
        initialized = worker_initialized = False
        try:
            self.init()
            initialized = True
            self.init_worker(0, store)
            worker_initialized = True
            yield self
        finally:
            try:
                if worker_initialized:
                    self.teardown_worker(0)
            finally:  # a failed worker teardown still tears the tracer down, then raises
                if initialized:
                    self.teardown()
