"""The LightningStore interface: the single source of truth between algorithms and runners."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import warnings
from typing import Any, Awaitable, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Type, TypedDict, Union

from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.store.requests import (
    QueryAttemptsRequest,
    QueryResourcesRequest,
    QueryRolloutsRequest,
    QuerySpansRequest,
    QueryWorkersRequest,
    RolloutRequest,
    request_from_arguments,
)
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    EnqueueRolloutRequest,
    MetricsRecord,
    NamedResources,
    PaginatedResult,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    TaskInput,
    Worker,
    WorkerStatus,
)
from agentbolt.utils.checks import check_choices, check_list_of_str

__all__ = [
    "UNSET",
    "Unset",
    "LightningStore",
    "LightningStoreCapabilities",
    "LightningStoreStatistics",
    "is_queuing",
    "is_running",
    "is_finished",
    "store_api_methods",
    "MAX_QUEUE_WAIT_SECONDS",
    "ADDRESSED_IDS",
    "ROUTE_WORDS",
    "check_addressable_id",
    "queue_wait_seconds",
    "rollout_wait_arguments",
    "forward_store_api",
    "page_json",
]


class _UnsetType:
    """Sentinel meaning "leave this field unchanged" (distinct from an explicit ``None``)."""

    __slots__ = ()
    _instance: _UnsetType | None = None

    def __new__(cls) -> _UnsetType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "UNSET"


UNSET = _UnsetType()
Unset = _UnsetType

QUEUING_STATUSES: Tuple[RolloutStatus, ...] = ("queuing", "requeuing")
RUNNING_STATUSES: Tuple[RolloutStatus, ...] = ("preparing", "running")
FINISHED_STATUSES: Tuple[RolloutStatus, ...] = ("failed", "succeeded", "cancelled")


def is_queuing(rollout: Rollout) -> bool:
    """Whether the rollout waits in the queue (``queuing`` or ``requeuing``)."""
    return rollout.status in QUEUING_STATUSES


def is_running(rollout: Rollout) -> bool:
    """Whether the rollout is being executed (``preparing`` or ``running``)."""
    return rollout.status in RUNNING_STATUSES


def is_finished(rollout: Rollout) -> bool:
    """Whether the rollout reached a terminal status."""
    return rollout.status in FINISHED_STATUSES


class LightningStoreCapabilities(TypedDict, total=False):
    """What a store implementation supports."""

    thread_safe: bool
    async_safe: bool
    zero_copy: bool
    otlp_traces: bool


class LightningStoreStatistics(TypedDict, total=False):
    """Counters reported by :meth:`LightningStore.statistics`."""

    name: str
    total_rollouts: int
    total_attempts: int
    total_spans: int
    total_resources: int
    total_workers: int
    uptime: float
    total_span_bytes: int
    eviction_threshold_bytes: int
    safe_threshold_bytes: int
    memory_capacity_bytes: int


MAX_QUEUE_WAIT_SECONDS = 300.0
"""Longest ``wait_for_queued_rollouts`` timeout: a runner waits about its poll interval, then asks again."""


def queue_wait_seconds(timeout: Any) -> float:
    """``timeout`` of ``wait_for_queued_rollouts`` as seconds.

    Raises:
        ValueError: Not a finite number of seconds between 0 and :data:`MAX_QUEUE_WAIT_SECONDS`.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
        raise ValueError(f"timeout must be a finite number of seconds, got {timeout!r}")
    if not 0 <= timeout <= MAX_QUEUE_WAIT_SECONDS:
        raise ValueError(f"timeout must be between 0 and {MAX_QUEUE_WAIT_SECONDS:g} seconds, got {timeout!r}")
    return float(timeout)


ROUTE_WORDS = frozenset({"latest", "search"})
"""Path words of the store's HTTP routes (``/resources/latest``, ``/workers/search``): never ids of their own."""

ADDRESSED_IDS = frozenset({"resources_id", "worker_id"})
"""The ids that users choose and the routes address beside those words (``attempt_id`` may be ``"latest"``)."""


def check_addressable_id(value: Any, what: str) -> None:
    """Refuse an id that the HTTP routes could not address: it would name a route (``/resources/latest``) instead.

    Raises:
        ValueError: ``value`` is one of :data:`ROUTE_WORDS`.
    """
    if value in ROUTE_WORDS:
        raise ValueError(f"{what} {value!r} cannot be used: it is a word of the store's routes (/{value})")


def rollout_wait_arguments(rollout_ids: Any, timeout: Any) -> Tuple[List[str], Optional[float]]:
    """``rollout_ids`` and ``timeout`` of ``wait_for_rollouts``, checked.

    Raises:
        TypeError: ``rollout_ids`` is a lone string or not a list of strings.
        ValueError: ``timeout`` is not None or a number, or is NaN (``math.inf`` waits like None).
    """
    ids = check_list_of_str(rollout_ids, "rollout_ids")
    if timeout is None:
        return ids, None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise ValueError(f"timeout must be None or a number of seconds, got {timeout!r}")
    return ids, float(timeout)


class LightningStore:
    """Stores rollouts, attempts, spans, resources and workers, and implements the rollout lifecycle.

    Every data method is a coroutine. Implementations: :class:`~agentbolt.store.memory.InMemoryLightningStore`,
    :class:`~agentbolt.store.sqlite.SqliteLightningStore` (durable), and
    :class:`~agentbolt.store.client_server.LightningStoreClient` (HTTP).
    """

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """Capabilities of this store; all False by default."""
        return LightningStoreCapabilities(thread_safe=False, async_safe=False, zero_copy=False, otlp_traces=False)

    async def statistics(self) -> LightningStoreStatistics:
        """Counters describing the store's content."""
        return LightningStoreStatistics(name=type(self).__name__)

    def otlp_traces_endpoint(self) -> str:
        """URL of the OTLP/HTTP traces endpoint accepting spans for this store."""
        raise NotImplementedError()

    async def start_rollout(
        self,
        input: TaskInput,
        mode: Optional[RolloutMode] = None,
        resources_id: Optional[str] = None,
        config: Optional[RolloutConfig] = None,
        metadata: Optional[Dict[str, Any]] = None,
        worker_id: Optional[str] = None,
    ) -> AttemptedRollout:
        """Create a rollout in ``preparing`` with its first attempt, without queuing it."""
        return await self._start_rollout(
            RolloutRequest(
                input=input, mode=mode, resources_id=resources_id, config=config, metadata=metadata, worker_id=worker_id
            )
        )

    async def _start_rollout(self, request: RolloutRequest) -> AttemptedRollout:
        """Implementation of :meth:`start_rollout`."""
        raise NotImplementedError()

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: Optional[RolloutMode] = None,
        resources_id: Optional[str] = None,
        config: Optional[RolloutConfig] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> Rollout:
        """Create a rollout in ``queuing`` and append it to the FIFO queue."""
        request = EnqueueRolloutRequest(
            input=input, mode=mode, resources_id=resources_id, config=config, metadata=metadata
        )
        return await self._enqueue_rollout(request)

    async def _enqueue_rollout(self, request: EnqueueRolloutRequest) -> Rollout:
        """Implementation of :meth:`enqueue_rollout`; by default one :meth:`enqueue_many_rollouts` call."""
        rollouts = await self.enqueue_many_rollouts([request])
        if len(rollouts) != 1:
            raise RuntimeError(f"enqueue_many_rollouts returned {len(rollouts)} rollouts for one request.")
        return rollouts[0]

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        """Enqueue several rollouts at once, in order."""
        raise NotImplementedError()

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        """Claim the next queued rollout (non-blocking); ``None`` when the queue is empty."""
        raise NotImplementedError()

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: Optional[str] = None
    ) -> Sequence[AttemptedRollout]:
        """Claim up to ``limit`` queued rollouts."""
        raise NotImplementedError()

    async def start_attempt(self, rollout_id: str, worker_id: Optional[str] = None) -> AttemptedRollout:
        """Create a new attempt for an existing rollout."""
        raise NotImplementedError()

    async def add_span(self, span: Span) -> Optional[Span]:
        """Store a span; ``None`` when a span with the same id already exists."""
        raise NotImplementedError()

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        """Store several spans; returns those actually inserted."""
        raise NotImplementedError()

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        """Issue a sequence id for each span (in order, per rollout attempt) and store the spans (extension).

        The sequence ids the given spans carry are replaced. Returns the spans actually inserted, with their issued
        ids. Stores reached over a network answer this in one round trip instead of two.
        """
        spans = list(spans)
        if not spans:
            return []
        sequence_ids = await self.get_many_span_sequence_ids([(span.rollout_id, span.attempt_id) for span in spans])
        numbered = [
            span.model_copy(update={"sequence_id": sequence_id})
            for span, sequence_id in zip(spans, sequence_ids, strict=True)
        ]
        return await self.add_many_spans(numbered)

    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: ReadableSpan,
        sequence_id: int | None = None,
    ) -> Optional[Span]:
        """Convert and store an OpenTelemetry span, allocating a sequence id when none is given."""
        raise NotImplementedError()

    async def query_rollouts(
        self,
        *,
        status_in: Optional[Sequence[RolloutStatus]] = None,
        rollout_id_in: Optional[Sequence[str]] = None,
        rollout_id_contains: Optional[str] = None,
        filter_logic: Literal["and", "or"] = "and",
        sort_by: Optional[str] = None,
        sort_order: Literal["asc", "desc"] = "asc",
        limit: int = -1,
        offset: int = 0,
        status: Optional[Sequence[RolloutStatus]] = None,
        rollout_ids: Optional[Sequence[str]] = None,
    ) -> Sequence[Union[Rollout, AttemptedRollout]]:
        """Rollouts matching the filters, each with its latest attempt attached when it has one.

        ``status`` and ``rollout_ids`` are deprecated aliases of ``status_in`` and ``rollout_id_in`` (the new names
        win when both are given).
        """
        if status is not None or rollout_ids is not None:
            warnings.warn(
                "query_rollouts(status=..., rollout_ids=...) is deprecated; use status_in and rollout_id_in",
                DeprecationWarning,
                stacklevel=2,
            )
        status_in = check_choices(status_in if status_in is not None else status, "status_in", RolloutStatus)
        rollout_id_in = check_choices(rollout_id_in if rollout_id_in is not None else rollout_ids, "rollout_id_in")
        return await self._query_rollouts(request_from_arguments(QueryRolloutsRequest, locals()))

    async def _query_rollouts(self, query: QueryRolloutsRequest) -> Sequence[Union[Rollout, AttemptedRollout]]:
        """Implementation of :meth:`query_rollouts` (the deprecated aliases already resolved)."""
        raise NotImplementedError()

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: Optional[str] = "sequence_id",
        sort_order: Literal["asc", "desc"] = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[Attempt]:
        """Attempts of one rollout (empty for an unknown rollout)."""
        return await self._query_attempts(rollout_id, request_from_arguments(QueryAttemptsRequest, locals()))

    async def _query_attempts(self, rollout_id: str, query: QueryAttemptsRequest) -> Sequence[Attempt]:
        """Implementation of :meth:`query_attempts`."""
        raise NotImplementedError()

    async def get_rollout_by_id(self, rollout_id: str) -> Optional[Union[Rollout, AttemptedRollout]]:
        """One rollout (with its latest attempt attached when it has one), or ``None``."""
        raise NotImplementedError()

    async def get_latest_attempt(self, rollout_id: str) -> Optional[Attempt]:
        """The attempt with the highest sequence id, or ``None``."""
        raise NotImplementedError()

    async def query_resources(
        self,
        *,
        resources_id: Optional[str] = None,
        resources_id_contains: Optional[str] = None,
        sort_by: Optional[str] = None,
        sort_order: Literal["asc", "desc"] = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[ResourcesUpdate]:
        """Resource snapshots matching both filters."""
        return await self._query_resources(request_from_arguments(QueryResourcesRequest, locals()))

    async def _query_resources(self, query: QueryResourcesRequest) -> Sequence[ResourcesUpdate]:
        """Implementation of :meth:`query_resources`."""
        raise NotImplementedError()

    async def get_resources_by_id(self, resources_id: str) -> Optional[ResourcesUpdate]:
        """One resource snapshot, or ``None``."""
        raise NotImplementedError()

    async def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        """The most recently added or updated resource snapshot."""
        raise NotImplementedError()

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        """Allocate the next span sequence id of a rollout."""
        raise NotImplementedError()

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> Sequence[int]:
        """Allocate one sequence id per ``(rollout_id, attempt_id)`` pair, in order."""
        raise NotImplementedError()

    async def wait_for_rollouts(self, *, rollout_ids: List[str], timeout: Optional[float] = None) -> List[Rollout]:
        """The rollouts among ``rollout_ids`` that are finished by the deadline, in input order."""
        raise NotImplementedError()

    async def wait_for_queued_rollouts(self, timeout: float) -> bool:
        """Wait until the queue holds a rollout to claim (True) or ``timeout`` seconds have passed (False).

        An agentbolt addition to the store API: a runner that found the queue empty waits here instead of sleeping
        its poll interval, so that a rollout queued meanwhile starts at once. True does not promise that the next
        dequeue gets the rollout (another runner may claim it first). This default, for stores that cannot tell,
        sleeps the whole timeout and returns False.
        """
        await asyncio.sleep(queue_wait_seconds(timeout))
        return False

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        *,
        trace_id: Optional[str] = None,
        trace_id_contains: Optional[str] = None,
        span_id: Optional[str] = None,
        span_id_contains: Optional[str] = None,
        parent_id: Optional[str] = None,
        parent_id_contains: Optional[str] = None,
        name: Optional[str] = None,
        name_contains: Optional[str] = None,
        filter_logic: Literal["and", "or"] = "and",
        limit: int = -1,
        offset: int = 0,
        sort_by: Optional[str] = "sequence_id",
        sort_order: Literal["asc", "desc"] = "asc",
    ) -> Sequence[Span]:
        """Spans of a rollout: all attempts (``None``), one attempt, or the ``"latest"`` one.

        The optional id/name filters combine with ``filter_logic``; an unknown rollout gives an empty result.
        """
        return await self._query_spans(request_from_arguments(QuerySpansRequest, locals()))

    async def _query_spans(self, query: QuerySpansRequest) -> Sequence[Span]:
        """Implementation of :meth:`query_spans`."""
        raise NotImplementedError()

    async def _query_spans_json(self, query: QuerySpansRequest) -> bytes:
        """The page of spans answering ``query`` as JSON (``{"items", "limit", "offset", "total"}``): what the HTTP
        server sends for a span search.

        Stores that keep spans as JSON override this to send them without building ``Span`` objects; the default
        runs :meth:`query_spans` (through the public method, so wrapping stores need not forward it).
        """
        fields = {name: getattr(query, name) for name in type(query).model_fields}
        page = await self.query_spans(**fields)
        total = page.total if isinstance(page, PaginatedResult) else len(page)
        return page_json([span.model_dump_json().encode() for span in page], query.limit, query.offset, total)

    async def query_spans_of_attempts(
        self, rollout_attempt_ids: Sequence[Tuple[str, str]], *, name: Optional[str] = None
    ) -> Sequence[Sequence[Span]]:
        """The spans of several attempts at once (extension): per ``(rollout_id, attempt_id)`` pair, in input order,
        what ``query_spans(rollout_id, attempt_id, name=name)`` gives (by sequence id; none for an unknown pair).

        This default makes one :meth:`query_spans` call per pair; collection-based stores read every pair in one
        query (per thousand pairs).
        """
        return [
            list(await self.query_spans(rollout_id, attempt_id, name=name))
            for rollout_id, attempt_id in rollout_attempt_ids
        ]

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        """Store a new resource snapshot (version 1) and make it the latest."""
        raise NotImplementedError()

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        """Replace a snapshot's resources (bumping its version) or create it; it becomes the latest."""
        raise NotImplementedError()

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput | Unset = UNSET,
        mode: Optional[RolloutMode] | Unset = UNSET,
        resources_id: Optional[str] | Unset = UNSET,
        status: RolloutStatus | Unset = UNSET,
        config: RolloutConfig | Unset = UNSET,
        metadata: Optional[Dict[str, Any]] | Unset = UNSET,
    ) -> Rollout:
        """Write the given fields of a rollout (``UNSET`` ones are left alone; ``None`` is written).

        A terminal status stamps ``end_time``; ``queuing``/``requeuing`` re-enqueue the rollout unless queued.

        Raises:
            ValueError: Unknown rollout or invalid field values (nothing is written).
        """
        fields = _given(
            input=input, mode=mode, resources_id=resources_id, status=status, config=config, metadata=metadata
        )
        return await self._update_rollout(rollout_id, fields)

    async def _update_rollout(self, rollout_id: str, fields: Dict[str, Any]) -> Rollout:
        """Implementation of :meth:`update_rollout`; ``fields`` holds only the given (not ``UNSET``) fields."""
        raise NotImplementedError()

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"],
        status: AttemptStatus | Unset = UNSET,
        worker_id: str | Unset = UNSET,
        last_heartbeat_time: float | Unset = UNSET,
        metadata: Optional[Dict[str, Any]] | Unset = UNSET,
    ) -> Attempt:
        """Write the given fields of an attempt (``"latest"`` targets the highest sequence id).

        A status change on the latest attempt drives the rollout (success, retry or failure per its config) and the
        worker.

        Raises:
            ValueError: Unknown rollout / attempt, or invalid field values (nothing is written).
        """
        fields = _given(status=status, worker_id=worker_id, last_heartbeat_time=last_heartbeat_time, metadata=metadata)
        return await self._update_attempt(rollout_id, attempt_id, fields)

    async def _update_attempt(self, rollout_id: str, attempt_id: str, fields: Dict[str, Any]) -> Attempt:
        """Implementation of :meth:`update_attempt`; ``fields`` holds only the given (not ``UNSET``) fields."""
        raise NotImplementedError()

    async def query_workers(
        self,
        *,
        status_in: Optional[Sequence[WorkerStatus]] = None,
        worker_id_contains: Optional[str] = None,
        filter_logic: Literal["and", "or"] = "and",
        sort_by: Optional[str] = None,
        sort_order: Literal["asc", "desc"] = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> Sequence[Worker]:
        """Workers matching the filters."""
        status_in = check_choices(status_in, "status_in", WorkerStatus)
        return await self._query_workers(request_from_arguments(QueryWorkersRequest, locals()))

    async def _query_workers(self, query: QueryWorkersRequest) -> Sequence[Worker]:
        """Implementation of :meth:`query_workers`."""
        raise NotImplementedError()

    async def get_worker_by_id(self, worker_id: str) -> Optional[Worker]:
        """One worker, or ``None``."""
        raise NotImplementedError()

    async def update_worker(self, worker_id: str, heartbeat_stats: Dict[str, Any] | Unset = UNSET) -> Worker:
        """Record a heartbeat from a worker (creating it when new)."""
        raise NotImplementedError()

    async def add_metrics(self, records: Sequence[MetricsRecord]) -> Sequence[MetricsRecord]:
        """Store training metrics (extension): one record per step of a run, replacing a stored record of the same
        ``(run_id, step)``.

        Raises:
            NotImplementedError: The store does not keep training metrics.
        """
        raise NotImplementedError(f"{type(self).__name__} does not keep training metrics")

    async def query_metrics(
        self, *, run_id: Optional[str] = None, limit: int = -1, offset: int = 0
    ) -> Sequence[MetricsRecord]:
        """Training metrics (extension), in the order they were first written, optionally of one run only.

        Raises:
            NotImplementedError: The store does not keep training metrics.
        """
        raise NotImplementedError(f"{type(self).__name__} does not keep training metrics")


def page_json(items: Sequence[bytes], limit: int, offset: int, total: int) -> bytes:
    """JSON of a page of items already serialized as JSON."""
    return b'{"items":[' + b",".join(items) + b'],"limit":%d,"offset":%d,"total":%d}' % (limit, offset, total)


def _given(**fields: Any) -> Dict[str, Any]:
    """The fields whose value is not ``UNSET``."""
    return {name: value for name, value in fields.items() if not isinstance(value, Unset)}


def store_api_methods() -> List[str]:
    """Names of the public coroutine methods of :class:`LightningStore`: the API a wrapping store forwards."""
    return [
        name
        for name, member in vars(LightningStore).items()
        if inspect.iscoroutinefunction(member) and not name.startswith("_")
    ]


StoreCall = Callable[..., Awaitable[Any]]
"""``forward(store, method_name, *args, **kwargs)``: how a wrapping store runs one API call."""


def _forwarding_method(name: str, forward: StoreCall) -> StoreCall:
    @functools.wraps(getattr(LightningStore, name))
    async def method(self: LightningStore, *args: Any, **kwargs: Any) -> Any:
        return await forward(self, name, *args, **kwargs)

    return method


def forward_store_api(cls: Type[LightningStore], forward: StoreCall) -> None:
    """Give ``cls`` every store API method it does not define itself, each passing its arguments unchanged to
    ``forward(self, name, *args, **kwargs)``.

    The generated methods carry the signature and docstring of the :class:`LightningStore` method they stand for.
    """
    for name in store_api_methods():
        if name not in vars(cls):
            setattr(cls, name, _forwarding_method(name, forward))
