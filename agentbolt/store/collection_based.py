"""The rollout lifecycle, written once over the collections interface.

:class:`CollectionBasedLightningStore` implements every :class:`~agentbolt.store.base.LightningStore` method on top
of a :class:`~agentbolt.store.collection.base.LightningCollections`. Backends (memory, SQLite, ...) only provide
storage. Each multi-step mutation runs inside one ``collections.atomic(mode="rw")`` section, so a durable backend
commits it as one transaction; all lifecycle state (queue, counters, latest resources) lives in the collections,
so a store rebuilt over existing data resumes where it stopped, watchdog included.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections import Counter
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.store.base import (
    FINISHED_STATUSES,
    QUEUING_STATUSES,
    UNSET,
    LightningStore,
    LightningStoreCapabilities,
    LightningStoreStatistics,
    Unset,
    check_addressable_id,
    is_finished,
    is_queuing,
    page_json,
    queue_wait_seconds,
    rollout_wait_arguments,
)
from agentbolt.store.collection.base import LightningCollections, record_outcome
from agentbolt.store.collection.memory import missing_item_message
from agentbolt.store.method_context import (
    current_private_method,
    current_public_method,
    current_store_method_labels,
    get_current_store_methods,
)
from agentbolt.store.requests import (
    QueryAttemptsRequest,
    QueryResourcesRequest,
    QueryRolloutsRequest,
    QuerySpansRequest,
    QueryWorkersRequest,
    RolloutRequest,
)
from agentbolt.store.utils import LATENCY_BUCKETS, rollout_status_from_attempt, scan_unhealthy_rollouts
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    EnqueueRolloutRequest,
    FilterOptions,
    MetricsRecord,
    NamedResources,
    PaginatedResult,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    SortOptions,
    Span,
    TaskInput,
    Worker,
)
from agentbolt.utils.checks import check_finite
from agentbolt.utils.id import generate_id

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "CollectionBasedLightningStore",
    "tracked",
    "healthcheck_before",
    "healthcheck_suppressed",
    "get_current_store_methods",
    "current_store_method_labels",
]

logger = logging.getLogger("agentbolt.store.collection_based")

T_collections = TypeVar("T_collections", bound=LightningCollections)
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

_in_healthcheck: contextvars.ContextVar[bool] = contextvars.ContextVar("agentbolt_store_in_healthcheck", default=False)

_ACTIVE_ATTEMPT_STATUSES: Tuple[AttemptStatus, ...] = ("preparing", "running")
_HEALTH_CHECKED_ROLLOUT_STATUSES: List[RolloutStatus] = ["preparing", "running"]
_LATEST_FIRST: SortOptions = {"name": "sequence_id", "order": "desc"}
_SEQUENCE_ORDER: SortOptions = {"name": "sequence_id", "order": "asc"}
_PAIRS_PER_SPAN_READ = 1000
"""Most attempts whose spans :meth:`CollectionBasedLightningStore.query_spans_of_attempts` reads in one query: each
query is one read section, so that writers get their turn between two on a large batch."""

RolloutChanges = List[Tuple[Rollout, Sequence[str]]]
"""Rollouts written in an atomic section with the fields that changed, handed to ``_post_update_rollout``."""


def tracked(name: str) -> Callable[[F], F]:
    """Mark a store method: names it for metric labels and, with a tracker, records its latency and outcome.

    Names starting with ``_`` are private methods (label ``store_privmeth``), others public (``store_pubmeth``).
    """
    variable = current_private_method if name.startswith("_") else current_public_method

    def decorator(func: F) -> F:
        @functools.wraps(func)
        async def wrapper(self: CollectionBasedLightningStore[Any], *args: Any, **kwargs: Any) -> Any:
            token = variable.set(name)
            try:
                tracker = self._tracker
                if tracker is None:
                    return await func(self, *args, **kwargs)
                labels = {"method": name, "store_pubmeth": current_public_method.get() or "unknown"}
                async with record_outcome(tracker, labels, counter="agl.store.total", histogram="agl.store.latency"):
                    return await func(self, *args, **kwargs)
            finally:
                variable.reset(token)

        return wrapper  # type: ignore[return-value]

    return decorator


@contextlib.contextmanager
def healthcheck_suppressed() -> Iterator[None]:
    """Within this context (task-local), store calls skip the watchdog scan.

    Used by facades that run the scan themselves under their own lock before an unlocked call.
    """
    token = _in_healthcheck.set(True)
    try:
        yield
    finally:
        _in_healthcheck.reset(token)


def healthcheck_before(func: F) -> F:
    """Run the watchdog (debounced, not re-entrant) before the decorated store method."""

    @functools.wraps(func)
    async def wrapper(self: CollectionBasedLightningStore[Any], *args: Any, **kwargs: Any) -> Any:
        await self._healthcheck()
        return await func(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _filter_with(logic: Literal["and", "or"], **fields: Dict[str, Any]) -> FilterOptions:
    filter_options: Dict[str, Any] = {name: ops for name, ops in fields.items() if ops}
    filter_options["_aggregate"] = logic
    return filter_options


def _sort_with(sort_by: Optional[str], sort_order: Literal["asc", "desc"]) -> Optional[SortOptions]:
    if sort_order not in ("asc", "desc"):
        raise ValueError(f"Invalid sort order {sort_order!r}; use 'asc' or 'desc'")
    return None if sort_by is None else {"name": sort_by, "order": sort_order}


def _page_options(query: Any) -> Dict[str, Any]:
    """Sort, limit and offset of a list request, as the collections take them."""
    return {"sort": _sort_with(query.sort_by, query.sort_order), "limit": query.limit, "offset": query.offset}


def _key(**fields: str) -> FilterOptions:
    """The filter of the items whose fields equal ``fields`` (a whole primary key: the one item)."""
    return {"_must": {name: {"exact": value} for name, value in fields.items()}}


def _validated_copy(model: Any, updates: Dict[str, Any]) -> Any:
    """A copy of ``model`` with ``updates`` applied and validated (clear errors for bad user input)."""
    if not updates:
        return model
    return type(model).model_validate({**dict(model), **updates})


def _check_worker_id(worker_id: Optional[str]) -> None:
    """Reject a bad worker id before any write (a dequeue must not pop rollouts it then cannot claim)."""
    if worker_id is not None and not isinstance(worker_id, str):
        raise TypeError(f"worker_id must be a string, got {type(worker_id).__name__}")
    check_addressable_id(worker_id, "worker_id")


IDLE_WATCHDOG_SECONDS = 1.0
"""Period of a server's background watchdog over a store that scans before every call (``scan_debounce_seconds``
``<= 0``)."""

MAX_DEQUEUE_LIMIT = 2**31
"""Largest number of rollouts one dequeue claims; larger limits claim this many (the SQL stores' integers are 64-bit)."""


def _checked_config(config: Any) -> RolloutConfig:
    """A copy of ``config`` (a ``RolloutConfig`` or its fields) whose time limits the watchdog can apply.

    Raises:
        ValueError: A time limit is NaN, infinite or negative (NaN would never fire, a negative one at once).
    """
    checked = RolloutConfig.model_validate(config).model_copy(deep=True)
    check_finite(checked.timeout_seconds, "config.timeout_seconds", minimum=0, optional=True)
    check_finite(checked.unresponsive_seconds, "config.unresponsive_seconds", minimum=0, optional=True)
    return checked


def _attach(rollout: Rollout, attempt: Optional[Attempt]) -> Union[Rollout, AttemptedRollout]:
    if attempt is None:
        return rollout
    return AttemptedRollout(**dict(rollout), attempt=attempt)


class _Waiter:
    """One coroutine waiting for rollouts to finish, or for the queue to fill; woken from any thread."""

    __slots__ = ("event", "loop")

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the waiter's loop is closed
            self.loop.call_soon_threadsafe(self.event.set)


class CollectionBasedLightningStore(LightningStore, Generic[T_collections]):
    """A :class:`LightningStore` whose lifecycle rules run over a set of collections.

    Args:
        collections: Storage backend.
        read_snapshot: Run read-only queries in snapshot sections (consistent multi-collection reads).
        tracker: Optional metrics backend recording per-method latency and rollout outcomes.
        scan_debounce_seconds: Minimum interval between two watchdog scans; ``<= 0`` scans before every
            health-checked call.

    Raises:
        TypeError: ``scan_debounce_seconds`` is not a number.
        ValueError: ``scan_debounce_seconds`` is NaN or infinite.

    Note:
        ``cancelled`` is final with respect to attempts: a late attempt update does not change a cancelled
        rollout's status (an explicit ``update_rollout`` still can).
    """

    _wait_poll_interval: float = 1.0
    """Longest sleep of ``wait_for_rollouts`` between two checks (notifications usually wake it earlier)."""

    _cache_latest_resources: bool = False
    """Whether the latest resources id is cached in-process (only for stores that own their data exclusively)."""

    def __init__(
        self,
        collections: T_collections,
        *,
        read_snapshot: bool = False,
        tracker: Optional[MetricsBackend] = None,
        scan_debounce_seconds: float = 10.0,
    ) -> None:
        super().__init__()
        self.collections: T_collections = collections
        self._read_snapshot = read_snapshot
        self._tracker = tracker
        self._scan_debounce_seconds = float(check_finite(scan_debounce_seconds, "scan_debounce_seconds"))  # type: ignore[arg-type]
        self._last_scan_entry: Optional[float] = None
        self._scan_lock = threading.Lock()
        self._start_time = time.time()
        self._latest_resources_id: Optional[str] | Unset = UNSET
        self._latest_resources_lock = threading.Lock()
        self._waiters: Dict[str, Set[_Waiter]] = {}
        self._queue_waiters: Set[_Waiter] = set()
        self._waiters_lock = threading.Lock()
        if tracker is not None:
            store_labels = ["method", "store_pubmeth", "status"]
            tracker.register_histogram("agl.store.latency", store_labels, buckets=LATENCY_BUCKETS, group_level=1)
            tracker.register_counter("agl.store.total", store_labels, group_level=1)
            tracker.register_counter("agl.rollouts.total", ["status", "mode"], group_level=1)
            tracker.register_histogram("agl.rollouts.duration", ["status", "mode"], group_level=1)

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """No capability is claimed by the generic implementation."""
        return LightningStoreCapabilities()

    def _reading(self) -> contextlib.AbstractAsyncContextManager[T_collections]:
        """A read-only section of the collections: the last committed state, one snapshot with ``read_snapshot``."""
        return self.collections.atomic(mode="r", snapshot=self._read_snapshot)

    # =================================================================================================================
    # Watchdog
    # =================================================================================================================

    @property
    def watchdog_period(self) -> float:
        """Seconds between two calls of :meth:`run_watchdog` by a server: ``scan_debounce_seconds``, or
        :data:`IDLE_WATCHDOG_SECONDS` when that is ``<= 0`` (a scan before every call)."""
        return self._scan_debounce_seconds if self._scan_debounce_seconds > 0 else IDLE_WATCHDOG_SECONDS

    async def run_watchdog(self) -> None:
        """Run the watchdog scan if one is due, exactly as before a store call: debounced, and over storage shared
        by several processes done by one of them per debounce period; a read-only store never scans.

        A server calls it every :attr:`watchdog_period`, so that time limits apply while no request comes in.
        """
        await self._healthcheck()

    async def _healthcheck(self) -> None:
        if _in_healthcheck.get():
            return
        with healthcheck_suppressed():
            if await self._should_scan_for_unhealthy_rollouts():
                await self._scan_for_unhealthy_rollouts()

    async def _should_scan_for_unhealthy_rollouts(self) -> bool:
        """Whether a scan may start now (debounced); records the entry time when it returns True.

        After the first scan of this store object, storage shared by several processes lets one of them scan per
        debounce period (:meth:`~agentbolt.store.collection.base.LightningCollections.claim_periodic_run`).
        """
        now = time.time()
        with self._scan_lock:
            first = self._last_scan_entry is None
            if (
                self._scan_debounce_seconds > 0
                and not first
                and now - self._last_scan_entry < self._scan_debounce_seconds  # type: ignore[operator]
            ):
                return False
            self._last_scan_entry = now
        if first or self._scan_debounce_seconds <= 0:
            return True
        return await self.collections.claim_periodic_run("watchdog", self._scan_debounce_seconds, now)

    async def _health_checked_rollouts(
        self, collections: LightningCollections, rollout_ids: Optional[Sequence[str]] = None
    ) -> Dict[str, Tuple[Rollout, Attempt]]:
        """Active rollouts with a health policy whose latest attempt is active, by rollout id."""
        filter_options: Dict[str, Any] = {"status": {"within": _HEALTH_CHECKED_ROLLOUT_STATUSES}}
        if rollout_ids is not None:
            filter_options["rollout_id"] = {"within": list(rollout_ids)}
        rollouts = [
            rollout
            for rollout in await collections.rollouts.query(filter=filter_options)
            if rollout.config.timeout_seconds is not None or rollout.config.unresponsive_seconds is not None
        ]
        latest = await self._latest_attempts(collections, [r.rollout_id for r in rollouts])
        return {
            rollout.rollout_id: (rollout, latest[rollout.rollout_id])
            for rollout in rollouts
            if rollout.rollout_id in latest and latest[rollout.rollout_id].status in _ACTIVE_ATTEMPT_STATUSES
        }

    @staticmethod
    async def _judge(candidates: Dict[str, Tuple[Rollout, Attempt]]) -> Dict[Tuple[str, str], AttemptStatus]:
        attempted = [AttemptedRollout(**dict(rollout), attempt=attempt) for rollout, attempt in candidates.values()]
        return dict(await scan_unhealthy_rollouts(attempted))

    @tracked("_scan_for_unhealthy_rollouts")
    async def _scan_for_unhealthy_rollouts(self) -> None:
        """Mark attempts that timed out or went silent, exactly as ``update_attempt(status=...)`` would."""
        async with self._reading() as collections:
            verdicts = await self._judge(await self._health_checked_rollouts(collections))
        if not verdicts:
            return
        changes: RolloutChanges = []
        async with self.collections.atomic(
            mode="rw", labels=["rollouts", "attempts", "workers", "rollout_queue"]
        ) as collections:
            # Re-judge on fresh data: a span may have arrived since the read above.
            fresh = await self._health_checked_rollouts(collections, [rollout_id for rollout_id, _ in verdicts])
            for (rollout_id, attempt_id), status in (await self._judge(fresh)).items():
                rollout, attempt = fresh[rollout_id]
                logger.info("Attempt %s of rollout %s is %s", attempt_id, rollout_id, status)
                await self._apply_attempt_update(
                    collections, rollout, attempt, {"status": status}, time.time(), changes
                )
        await self._post_update_rollout(changes)

    # =================================================================================================================
    # Lifecycle rules (run inside an atomic section; each rule is written once)
    # =================================================================================================================

    async def _latest_resources_id_in(self, collections: LightningCollections) -> Optional[str]:
        cached = self._latest_resources_id
        if self._cache_latest_resources and not isinstance(cached, Unset):
            return cached
        latest = await collections.resources.get(sort={"name": "update_time", "order": "desc"})
        latest_id = None if latest is None else latest.resources_id
        if self._cache_latest_resources:
            with self._latest_resources_lock:  # a concurrent write may have set a newer id meanwhile
                if isinstance(self._latest_resources_id, Unset):
                    self._latest_resources_id = latest_id
        return latest_id

    async def _new_rollouts(
        self,
        collections: LightningCollections,
        requests: Sequence[Union[EnqueueRolloutRequest, RolloutRequest]],
        status: RolloutStatus,
        now: float,
    ) -> List[Rollout]:
        """Rollouts from requests; a missing ``resources_id`` means the latest resources (looked up once per call)."""
        latest: Optional[str] | Unset = UNSET
        rollouts: List[Rollout] = []
        for request in requests:
            resources_id = request.resources_id
            if resources_id is None:
                if isinstance(latest, Unset):
                    latest = await self._latest_resources_id_in(collections)
                resources_id = latest
            rollouts.append(
                self._new_rollout(
                    request.input, request.mode, resources_id, request.config, request.metadata, status, now
                )
            )
        return rollouts

    @staticmethod
    def _new_rollout(
        input: TaskInput,
        mode: Optional[RolloutMode],
        resources_id: Optional[str],
        config: Optional[RolloutConfig],
        metadata: Optional[Dict[str, Any]],
        status: RolloutStatus,
        now: float,
    ) -> Rollout:
        return Rollout(
            rollout_id="ro-" + generate_id(12),
            input=input,
            start_time=now,
            mode=mode,
            resources_id=resources_id,
            status=status,
            config=RolloutConfig() if config is None else _checked_config(config),
            metadata={} if metadata is None else dict(metadata),
        )

    async def _get_rollout(self, collections: LightningCollections, rollout_id: str) -> Rollout:
        rollout = await collections.rollouts.get(filter=_key(rollout_id=rollout_id))
        if rollout is None:
            raise ValueError(f"Rollout {rollout_id} not found")
        return rollout

    async def _latest_attempt(self, collections: LightningCollections, rollout_id: str) -> Optional[Attempt]:
        return await collections.attempts.get(filter=_key(rollout_id=rollout_id), sort=_LATEST_FIRST)

    async def _latest_attempts(
        self, collections: LightningCollections, rollout_ids: Sequence[str]
    ) -> Dict[str, Attempt]:
        """Latest attempt of each rollout that has one (one query for all rollouts)."""
        if not rollout_ids:
            return {}
        if len(rollout_ids) == 1:
            attempt = await self._latest_attempt(collections, rollout_ids[0])
            return {} if attempt is None else {attempt.rollout_id: attempt}
        latest: Dict[str, Attempt] = {}
        for attempt in await collections.attempts.query(
            filter={"_must": {"rollout_id": {"within": list(rollout_ids)}}}
        ):
            current = latest.get(attempt.rollout_id)
            if current is None or attempt.sequence_id > current.sequence_id:
                latest[attempt.rollout_id] = attempt
        return latest

    async def _write_rollout(
        self,
        collections: LightningCollections,
        rollout: Rollout,
        updates: Dict[str, Any],
        now: float,
        changes: RolloutChanges,
        *,
        validate: bool = False,
    ) -> Rollout:
        """Write rollout fields. A terminal status stamps ``end_time``; a queuing status re-enqueues (once)."""
        status = updates.get("status")
        if status in FINISHED_STATUSES:
            updates = {**updates, "end_time": now}
        updated = _validated_copy(rollout, updates) if validate else rollout.model_copy(update=updates)
        await collections.rollouts.update([updated])
        if status in QUEUING_STATUSES and not await collections.rollout_queue.has(updated.rollout_id):
            await collections.rollout_queue.enqueue([updated.rollout_id])
        changes.append((updated, tuple(updates)))
        return updated

    async def _create_attempt(
        self,
        collections: LightningCollections,
        rollout: Rollout,
        worker_id: Optional[str],
        now: float,
        changes: RolloutChanges,
    ) -> AttemptedRollout:
        """A new ``preparing`` attempt (sequence = attempts so far + 1); the rollout becomes ``preparing``."""
        existing = await collections.attempts.query(filter=_key(rollout_id=rollout.rollout_id), limit=0)
        attempt = Attempt(
            rollout_id=rollout.rollout_id,
            attempt_id="at-" + generate_id(8),
            sequence_id=existing.total + 1,
            start_time=now,
            status="preparing",
            worker_id=worker_id,
        )
        await collections.attempts.insert([attempt])
        if rollout.status != "preparing":
            rollout = await self._write_rollout(collections, rollout, {"status": "preparing"}, now, changes)
        return AttemptedRollout(**dict(rollout), attempt=attempt)

    async def _apply_attempt_update(
        self,
        collections: LightningCollections,
        rollout: Rollout,
        attempt: Attempt,
        updates: Dict[str, Any],
        now: float,
        changes: RolloutChanges,
        latest: Optional[Attempt] = None,
    ) -> Attempt:
        """Write attempt fields and propagate a status change to the rollout and the worker.

        Used by ``update_attempt`` and by the watchdog. ``failed``/``succeeded`` stamp ``end_time``. When the
        attempt is the rollout's latest, the rollout takes the status derived by
        :func:`~agentbolt.store.utils.rollout_status_from_attempt` (a cancelled rollout stays cancelled).
        ``latest`` is the rollout's latest attempt when the caller has read it in this transaction (no attempt
        update changes which attempt is the latest); otherwise it is read here.
        """
        status = updates.get("status")
        if status in ("failed", "succeeded"):
            updates = {**updates, "end_time": now}
        updated = _validated_copy(attempt, updates)
        await collections.attempts.update([updated])
        if "status" in updates:
            if latest is None:
                latest = await self._latest_attempt(collections, rollout.rollout_id)
            if latest is not None and latest.attempt_id == updated.attempt_id and rollout.status != "cancelled":
                new_status = await rollout_status_from_attempt(updated, rollout.config)
                if new_status != rollout.status:
                    await self._write_rollout(collections, rollout, {"status": new_status}, now, changes)
        if updates.get("worker_id") or ("status" in updates and updated.worker_id):
            await self._sync_workers_with_attempts([updated], collections=collections, now=now)
        return updated

    async def _sync_workers_with_attempts(
        self,
        attempts: Sequence[Attempt],
        dequeue: bool = False,
        *,
        collections: Optional[LightningCollections] = None,
        now: Optional[float] = None,
    ) -> None:
        """Bring the workers of ``attempts`` in line with the attempts' statuses.

        Finished attempts leave their worker ``idle``; timed-out or unresponsive ones leave it ``unknown``; active
        ones make it ``busy`` on that attempt. Only these fields are written (heartbeat data is preserved).
        """
        if collections is None:
            async with self.collections.atomic(mode="rw", labels=["workers"]) as owned:
                await self._sync_workers_with_attempts(attempts, dequeue, collections=owned, now=now)
            return
        now = time.time() if now is None else now
        for attempt in attempts:
            if not attempt.worker_id:
                continue
            fields: Dict[str, Any]
            if attempt.status in ("succeeded", "failed", "timeout", "unresponsive"):
                fields = {
                    "status": "idle" if attempt.status in ("succeeded", "failed") else "unknown",
                    "last_idle_time": now,
                    "current_rollout_id": None,
                    "current_attempt_id": None,
                }
            else:
                fields = {
                    "status": "busy",
                    "last_busy_time": now,
                    "current_rollout_id": attempt.rollout_id,
                    "current_attempt_id": attempt.attempt_id,
                }
                if dequeue:
                    fields["last_dequeue_time"] = now
            await collections.workers.upsert(
                [Worker(worker_id=attempt.worker_id, **fields)], update_fields=list(fields)
            )

    async def _mark_worker_idle_after_empty_dequeue(
        self, collections: LightningCollections, worker_id: str, now: float
    ) -> None:
        # The worker's own record, read to keep ``last_idle_time`` when it was idle already; only the same worker's
        # other calls write it, and a runner makes one call at a time.
        worker = await collections.workers.get(filter=_key(worker_id=worker_id))
        fields: Dict[str, Any] = {"last_dequeue_time": now}
        if worker is None or worker.status != "idle":
            fields.update(status="idle", last_idle_time=now)
        await collections.workers.upsert([Worker(worker_id=worker_id, **fields)], update_fields=list(fields))

    async def _ensure_spans_available(self, rollout_id: str) -> None:
        """Hook raising when a rollout's spans can no longer be served (e.g. evicted); no-op by default."""

    async def _post_add_spans(self, spans: Sequence[Span], rollout_id: str, attempt_id: str) -> None:
        """Hook called after spans of one attempt were committed (no-op by default)."""

    async def _post_update_rollout(
        self, rollouts: Sequence[Tuple[Rollout, Sequence[str]]], skip_enqueue: bool = False
    ) -> None:
        """Hook called after rollout writes were committed: wakes waiters and records outcome metrics.

        Re-enqueueing already happened inside the atomic section; ``skip_enqueue`` is accepted for compatibility.
        """
        if any(rollout.status in QUEUING_STATUSES for rollout, _ in rollouts):
            self._notify_queued()  # requeued: it was put back in the queue inside the section
        finished = [rollout for rollout, fields in rollouts if is_finished(rollout)]
        if not finished:
            return
        self._notify_finished([rollout.rollout_id for rollout in finished])
        if self._tracker is None:
            return
        for rollout, fields in rollouts:
            if is_finished(rollout) and "end_time" in fields and rollout.end_time is not None:
                labels: Dict[str, str] = {"status": rollout.status, "mode": rollout.mode or "unknown"}
                await self._tracker.inc_counter("agl.rollouts.total", labels=labels)
                await self._tracker.observe_histogram(
                    "agl.rollouts.duration", rollout.end_time - rollout.start_time, labels=labels
                )

    # =================================================================================================================
    # Rollouts: creation, queue, attempts
    # =================================================================================================================

    @tracked("start_rollout")
    @healthcheck_before
    async def _start_rollout(self, request: RolloutRequest) -> AttemptedRollout:
        worker_id = request.worker_id
        _check_worker_id(worker_id)
        now = time.time()
        # A new rollout is nobody else's until this commits; its worker's record is written field by field.
        async with self.collections.atomic(
            mode="rw", labels=["rollouts", "attempts", "workers"], rollout_ids=()
        ) as collections:
            (rollout,) = await self._new_rollouts(collections, [request], "preparing", now)
            attempt = Attempt(
                rollout_id=rollout.rollout_id,
                attempt_id="at-" + generate_id(8),
                sequence_id=1,
                start_time=now,
                status="preparing",
                worker_id=worker_id,
            )
            await collections.rollouts.insert([rollout])
            await collections.attempts.insert([attempt])
            if worker_id:
                await self._sync_workers_with_attempts([attempt], collections=collections, now=now)
        return AttemptedRollout(**dict(rollout), attempt=attempt)

    async def _enqueue(self, requests: Sequence[EnqueueRolloutRequest]) -> List[Rollout]:
        """Create queued rollouts, in request order."""
        now = time.time()
        # New rollouts only: enqueues run side by side with each other and with dequeues (which claim queue rows).
        async with self.collections.atomic(
            mode="rw", labels=["rollouts", "rollout_queue"], rollout_ids=()
        ) as collections:
            rollouts = await self._new_rollouts(collections, requests, "queuing", now)
            if rollouts:
                await collections.rollouts.insert(rollouts)
                await collections.rollout_queue.enqueue([rollout.rollout_id for rollout in rollouts])
        if rollouts:
            self._notify_queued()
        return rollouts

    @tracked("enqueue_rollout")
    @healthcheck_before
    async def _enqueue_rollout(self, request: EnqueueRolloutRequest) -> Rollout:
        return (await self._enqueue([request]))[0]

    @tracked("enqueue_many_rollouts")
    @healthcheck_before
    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        """Enqueue several rollouts in one atomic section; results follow the input order."""
        requests = [EnqueueRolloutRequest.model_validate(request) for request in rollouts]
        return await self._enqueue(requests)

    async def _queue_has_rollouts(self) -> bool:
        """Whether the queue holds a rollout (its last committed state, read without locking)."""
        async with self._reading() as collections:
            return len(await collections.rollout_queue.peek(1)) > 0

    async def _dequeue(self, limit: int, worker_id: Optional[str]) -> List[AttemptedRollout]:
        _check_worker_id(worker_id)
        now = time.time()
        claimed: List[AttemptedRollout] = []
        changes: RolloutChanges = []
        if not await self._queue_has_rollouts():
            # Idle runners ask often: an empty answer locks only the asking worker's record, so that it does not hold
            # up the writes of every rollout (as locking the queue, rollouts and attempts would across processes).
            if worker_id:
                async with self.collections.atomic(mode="rw", labels=["workers"], rollout_ids=()) as collections:
                    await self._mark_worker_idle_after_empty_dequeue(collections, worker_id, now)
            return claimed
        # Claiming a queue entry is row-level (two dequeues never claim the same entry), so a dequeue holds the
        # labels shared, locks each rollout it claims, and writes its worker's record field by field: dequeues run
        # side by side with each other and with the writes of other rollouts.
        async with self.collections.atomic(
            mode="rw", labels=["rollout_queue", "rollouts", "attempts", "workers"], rollout_ids=()
        ) as collections:
            while len(claimed) < limit:
                rollout_ids = await collections.rollout_queue.dequeue(limit - len(claimed))
                if not rollout_ids:
                    break
                await collections.lock_rollouts(rollout_ids)
                for rollout_id in rollout_ids:
                    rollout = await collections.rollouts.get(filter=_key(rollout_id=rollout_id))
                    if rollout is None or not is_queuing(rollout):
                        logger.warning(
                            "Skipping queued rollout %s: it is %s",
                            rollout_id,
                            "gone" if rollout is None else rollout.status,
                        )
                        continue
                    claimed.append(await self._create_attempt(collections, rollout, worker_id, now, changes))
            if worker_id:
                if claimed:
                    await self._sync_workers_with_attempts(
                        [claimed[-1].attempt], dequeue=True, collections=collections, now=now
                    )
                else:
                    await self._mark_worker_idle_after_empty_dequeue(collections, worker_id, now)
        await self._post_update_rollout(changes)
        return claimed

    @tracked("dequeue_rollout")
    @healthcheck_before
    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        """Claim the oldest queued rollout with a new attempt; ``None`` when the queue is empty."""
        claimed = await self._dequeue(1, worker_id)
        return claimed[0] if claimed else None

    @tracked("dequeue_many_rollouts")
    @healthcheck_before
    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: Optional[str] = None
    ) -> Sequence[AttemptedRollout]:
        """Claim up to ``limit`` queued rollouts, oldest first."""
        if limit <= 0:
            return []
        return await self._dequeue(min(limit, MAX_DEQUEUE_LIMIT), worker_id)

    @tracked("start_attempt")
    @healthcheck_before
    async def start_attempt(self, rollout_id: str, worker_id: Optional[str] = None) -> AttemptedRollout:
        """Create a new attempt for an existing rollout (``max_attempts`` is not enforced here)."""
        _check_worker_id(worker_id)
        now = time.time()
        changes: RolloutChanges = []
        async with self.collections.atomic(
            mode="rw", labels=["rollouts", "attempts", "workers"], rollout_ids=[rollout_id]
        ) as collections:
            rollout = await self._get_rollout(collections, rollout_id)
            attempted = await self._create_attempt(collections, rollout, worker_id, now, changes)
            if worker_id:
                await self._sync_workers_with_attempts([attempted.attempt], collections=collections, now=now)
        await self._post_update_rollout(changes)
        return attempted

    # =================================================================================================================
    # Spans and sequence ids
    # =================================================================================================================

    async def _add_spans(self, spans: Sequence[Span], *, new_sequence_ids: bool = False) -> List[Span]:
        """Insert ``spans`` (with ``new_sequence_ids``, numbered first) in one atomic section; returns those inserted."""
        if not spans:
            return []
        groups: Dict[Tuple[str, str], List[Span]] = {}
        for span in spans:
            if not isinstance(span, Span):
                raise TypeError(f"Expected Span, got {type(span).__name__}")
            groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
        now = time.time()
        inserted: Dict[Tuple[str, str], List[Span]] = {}
        changes: RolloutChanges = []
        async with self.collections.atomic(
            mode="rw",
            labels=["span_sequence_ids", "rollouts", "attempts", "spans"],
            rollout_ids=sorted({rollout_id for rollout_id, _ in groups}),
        ) as collections:
            targets: Dict[Tuple[str, str], Tuple[Rollout, Attempt]] = {}
            for rollout_id, attempt_id in groups:  # validate everything before writing anything
                rollout = await self._get_rollout(collections, rollout_id)
                attempt = await collections.attempts.get(filter=_key(rollout_id=rollout_id, attempt_id=attempt_id))
                if attempt is None:
                    raise ValueError(f"Attempt {attempt_id} not found for rollout {rollout_id}")
                targets[(rollout_id, attempt_id)] = (rollout, attempt)
            if new_sequence_ids:  # issued and inserted in one section: concurrent calls never interleave the two
                groups = await self._numbered(collections, spans)
            for key, group in groups.items():
                rollout, attempt = targets[key]
                if not new_sequence_ids:  # ids issued above are below the counter already
                    await collections.span_sequence_ids.chmax(rollout.rollout_id, max(s.sequence_id for s in group))
                added = list(await collections.spans.insert_new(group))
                if len(added) < len(group):
                    kept = {id(span) for span in added}
                    skipped = [span.span_id for span in group if id(span) not in kept]
                    logger.warning(
                        "Skipped %d span(s) of rollout %s, attempt %s already stored with the same span id: %s",
                        len(skipped),
                        *key,
                        ", ".join(skipped),
                    )
                if added:
                    inserted[key] = added
                    await self._record_heartbeat(collections, rollout, attempt, now, changes)
        await self._post_update_rollout(changes)
        for (rollout_id, attempt_id), added in inserted.items():
            await self._post_add_spans(added, rollout_id, attempt_id)
        return [span for group in inserted.values() for span in group]

    @staticmethod
    async def _issue_sequence_ids(collections: LightningCollections, rollout_ids: Sequence[str]) -> List[int]:
        """A new sequence id for each of ``rollout_ids`` (a rollout may repeat), consecutive per rollout in order:
        one counter write per rollout."""
        next_ids: Dict[str, int] = {}
        for rollout_id, count in Counter(rollout_ids).items():
            next_ids[rollout_id] = await collections.span_sequence_ids.inc(rollout_id, count) - count + 1
        issued: List[int] = []
        for rollout_id in rollout_ids:
            issued.append(next_ids[rollout_id])
            next_ids[rollout_id] += 1
        return issued

    @classmethod
    async def _numbered(
        cls, collections: LightningCollections, spans: Sequence[Span]
    ) -> Dict[Tuple[str, str], List[Span]]:
        """``spans`` with new sequence ids of their rollouts, in order, grouped by rollout attempt."""
        sequence_ids = await cls._issue_sequence_ids(collections, [span.rollout_id for span in spans])
        groups: Dict[Tuple[str, str], List[Span]] = {}
        for span, sequence_id in zip(spans, sequence_ids, strict=True):
            numbered = span.model_copy(update={"sequence_id": sequence_id})
            groups.setdefault((span.rollout_id, span.attempt_id), []).append(numbered)
        return groups

    async def _record_heartbeat(
        self,
        collections: LightningCollections,
        rollout: Rollout,
        attempt: Attempt,
        now: float,
        changes: RolloutChanges,
    ) -> None:
        """A span is a sign of life: the attempt (and, if latest, a preparing/requeuing rollout) becomes running.

        A span of an attempt that ended (``timeout``, ``failed``, ...) is stored but revives nothing: that attempt
        stays ended, so a rollout it drove to ``requeuing`` stays queued for its next attempt instead of running
        on an attempt nobody finishes.
        """
        updates: Dict[str, Any] = {"last_heartbeat_time": now}
        if attempt.status in ("preparing", "unresponsive"):
            updates["status"] = "running"
        await collections.attempts.update([attempt.model_copy(update=updates)])
        if updates.get("status", attempt.status) != "running":
            return
        if rollout.status in ("preparing", "requeuing"):
            latest = await self._latest_attempt(collections, rollout.rollout_id)
            if latest is not None and latest.attempt_id == attempt.attempt_id:
                await self._write_rollout(collections, rollout, {"status": "running"}, now, changes)

    @tracked("add_span")
    async def add_span(self, span: Span) -> Optional[Span]:
        """Store a span and record it as a heartbeat; ``None`` (with a warning) when it is already stored.

        Raises:
            ValueError: When the rollout or the attempt does not exist.
        """
        added = await self._add_spans([span])
        return added[0] if added else None

    @tracked("add_many_spans")
    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        """Store several spans in one atomic section; returns those actually inserted."""
        return await self._add_spans(spans)

    @tracked("add_otel_span")
    async def add_otel_span(
        self,
        rollout_id: str,
        attempt_id: str,
        readable_span: ReadableSpan,
        sequence_id: int | None = None,
    ) -> Optional[Span]:
        """Convert an OpenTelemetry span and store it, allocating a sequence id when none is given."""
        if sequence_id is None:
            sequence_id = (await self._allocate_sequence_ids([(rollout_id, attempt_id)]))[0]
        span = Span.from_opentelemetry(readable_span, rollout_id, attempt_id, sequence_id)
        added = await self._add_spans([span])
        return added[0] if added else None

    @tracked("add_spans_with_new_sequence_ids")
    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        """Issue a sequence id for each span (in order, per rollout) and store the spans, in one atomic section.

        Concurrent calls never interleave: each call's ids are issued and its spans inserted before another call's
        ids are issued, so the order of the ids is the order in which the spans were stored.
        """
        return await self._add_spans(spans, new_sequence_ids=True)

    async def _allocate_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> List[int]:
        rollout_ids = sorted({rollout_id for rollout_id, _ in rollout_attempt_ids})
        async with self.collections.atomic(
            mode="rw", labels=["span_sequence_ids"], rollout_ids=rollout_ids
        ) as collections:
            return await self._issue_sequence_ids(collections, [rollout_id for rollout_id, _ in rollout_attempt_ids])

    @tracked("get_next_span_sequence_id")
    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        """Next sequence id of the rollout (one counter per rollout, starting at 1, never reissued)."""
        return (await self._allocate_sequence_ids([(rollout_id, attempt_id)]))[0]

    @tracked("get_many_span_sequence_ids")
    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> Sequence[int]:
        """One sequence id per ``(rollout_id, attempt_id)``, allocated in request order."""
        return await self._allocate_sequence_ids(rollout_attempt_ids)

    @tracked("query_spans")
    @healthcheck_before
    async def _query_spans(self, query: QuerySpansRequest) -> PaginatedResult[Span]:
        async with self._reading() as collections:
            filter_options = await self._span_filter(collections, query)
            if filter_options is None:
                return PaginatedResult(items=[], limit=query.limit, offset=query.offset, total=0)
            return await collections.spans.query(filter=filter_options, **_page_options(query))

    @tracked("query_spans")
    @healthcheck_before
    async def _query_spans_json(self, query: QuerySpansRequest) -> bytes:
        async with self._reading() as collections:
            filter_options = await self._span_filter(collections, query)
            if filter_options is None:
                return page_json([], query.limit, query.offset, 0)
            items, total = await collections.spans.query_json(filter=filter_options, **_page_options(query))
        return page_json(items, query.limit, query.offset, total)

    @tracked("query_spans_of_attempts")
    @healthcheck_before
    async def query_spans_of_attempts(
        self, rollout_attempt_ids: Sequence[Tuple[str, str]], *, name: Optional[str] = None
    ) -> Sequence[Sequence[Span]]:
        """The spans of each ``(rollout_id, attempt_id)`` pair, in input order (by sequence id, as ``query_spans``
        gives them), read in one query per thousand pairs.

        Raises:
            RuntimeError: The spans of one of the rollouts can no longer be served (as ``query_spans`` would).
        """
        pairs = [(rollout_id, attempt_id) for rollout_id, attempt_id in rollout_attempt_ids]
        for rollout_id in dict.fromkeys(rollout_id for rollout_id, _ in pairs):
            await self._ensure_spans_available(rollout_id)
        found: Dict[Tuple[str, str], List[Span]] = {pair: [] for pair in pairs}
        distinct = list(found)
        for start in range(0, len(distinct), _PAIRS_PER_SPAN_READ):
            chunk = distinct[start : start + _PAIRS_PER_SPAN_READ]
            # By rollout only: a second "within" on the attempt id makes SQLite probe every (rollout, attempt)
            # combination, quadratic in the chunk; the other attempts' spans this reads are dropped below.
            rollout_ids = list(dict.fromkeys(rollout_id for rollout_id, _ in chunk))
            filter_options: Dict[str, Any] = {
                "_must": {"rollout_id": {"within": rollout_ids}},
                **_filter_with("and", name={"exact": name}),
            }
            async with self._reading() as collections:
                spans = await collections.spans.query(filter=filter_options, sort=_SEQUENCE_ORDER)
            for span in spans:
                group = found.get((span.rollout_id, span.attempt_id))
                if group is not None:
                    group.append(span)
        return [list(found[pair]) for pair in pairs]

    async def _span_filter(
        self, collections: LightningCollections, query: QuerySpansRequest
    ) -> Optional[FilterOptions]:
        """Filter of a span query (``None``: nothing can match, the rollout has no attempt for ``"latest"``)."""
        await self._ensure_spans_available(query.rollout_id)
        filter_options: Dict[str, Any] = dict(
            _filter_with(
                query.filter_logic,  # type: ignore[arg-type]
                trace_id={"exact": query.trace_id, "contains": query.trace_id_contains},
                span_id={"exact": query.span_id, "contains": query.span_id_contains},
                parent_id={"exact": query.parent_id, "contains": query.parent_id_contains},
                name={"exact": query.name, "contains": query.name_contains},
            )
        )
        must: Dict[str, Any] = {"rollout_id": {"exact": query.rollout_id}}
        attempt_id = query.attempt_id
        if attempt_id == "latest":
            latest = await self._latest_attempt(collections, query.rollout_id)
            if latest is None:
                return None
            attempt_id = latest.attempt_id
        if attempt_id is not None:
            must["attempt_id"] = {"exact": attempt_id}
        filter_options["_must"] = must
        return filter_options

    # =================================================================================================================
    # Queries
    # =================================================================================================================

    @tracked("query_rollouts")
    @healthcheck_before
    async def _query_rollouts(self, query: QueryRolloutsRequest) -> PaginatedResult[Union[Rollout, AttemptedRollout]]:
        filter_options = _filter_with(
            query.filter_logic,  # type: ignore[arg-type]
            status={"within": query.status_in},
            rollout_id={"within": query.rollout_id_in, "contains": query.rollout_id_contains},
        )
        async with self._reading() as collections:
            page = await collections.rollouts.query(filter=filter_options, **_page_options(query))
            latest = await self._latest_attempts(collections, [rollout.rollout_id for rollout in page])
        return PaginatedResult(
            items=[_attach(rollout, latest.get(rollout.rollout_id)) for rollout in page],
            limit=page.limit,
            offset=page.offset,
            total=page.total,
        )

    @tracked("get_rollout_by_id")
    @healthcheck_before
    async def get_rollout_by_id(self, rollout_id: str) -> Optional[Union[Rollout, AttemptedRollout]]:
        """One rollout with its latest attempt attached when it has one; ``None`` when unknown."""
        async with self._reading() as collections:
            rollout = await collections.rollouts.get(filter=_key(rollout_id=rollout_id))
            if rollout is None:
                return None
            return _attach(rollout, await self._latest_attempt(collections, rollout_id))

    @tracked("query_attempts")
    @healthcheck_before
    async def _query_attempts(self, rollout_id: str, query: QueryAttemptsRequest) -> PaginatedResult[Attempt]:
        async with self._reading() as collections:
            return await collections.attempts.query(filter=_key(rollout_id=rollout_id), **_page_options(query))

    @tracked("get_latest_attempt")
    @healthcheck_before
    async def get_latest_attempt(self, rollout_id: str) -> Optional[Attempt]:
        """The attempt with the highest sequence id, or ``None``."""
        async with self._reading() as collections:
            return await self._latest_attempt(collections, rollout_id)

    # =================================================================================================================
    # Resources
    # =================================================================================================================

    async def _write_resources(self, resources_id: Optional[str], resources: NamedResources) -> ResourcesUpdate:
        resources = dict(resources)
        async with self.collections.atomic(mode="rw", labels=["resources"]) as collections:
            latest_id = await self._latest_resources_id_in(collections)
            latest = None if latest_id is None else await collections.resources.get(filter=_key(resources_id=latest_id))
            # "Latest" is the snapshot with the greatest update_time: keep update times strictly increasing.
            now = time.time()
            if latest is not None and latest.update_time >= now:
                now = latest.update_time + 1e-6
            existing = (
                None
                if resources_id is None
                else await collections.resources.get(filter=_key(resources_id=resources_id))
            )
            if existing is None:
                update = ResourcesUpdate(
                    resources_id=resources_id or "rs-" + generate_id(12),
                    create_time=now,
                    update_time=now,
                    version=1,
                    resources=resources,
                )
                await collections.resources.insert([update])
            else:
                update = ResourcesUpdate(
                    resources_id=existing.resources_id,
                    create_time=existing.create_time,
                    update_time=now,
                    version=existing.version + 1,
                    resources=resources,
                )
                await collections.resources.update([update])
            if self._cache_latest_resources:
                with self._latest_resources_lock:
                    self._latest_resources_id = update.resources_id
        return update

    @tracked("add_resources")
    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        """Store a new resource snapshot (version 1); it becomes the latest."""
        return await self._write_resources(None, resources)

    @tracked("update_resources")
    @healthcheck_before
    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        """Replace a snapshot's resources and bump its version, or create it; it becomes the latest."""
        check_addressable_id(resources_id, "resources_id")
        return await self._write_resources(resources_id, resources)

    @tracked("query_resources")
    async def _query_resources(self, query: QueryResourcesRequest) -> PaginatedResult[ResourcesUpdate]:
        filter_options = _filter_with(
            "and", resources_id={"exact": query.resources_id, "contains": query.resources_id_contains}
        )
        async with self._reading() as collections:
            return await collections.resources.query(filter=filter_options, **_page_options(query))

    @tracked("get_resources_by_id")
    async def get_resources_by_id(self, resources_id: str) -> Optional[ResourcesUpdate]:
        """One resource snapshot, or ``None``."""
        async with self._reading() as collections:
            return await collections.resources.get(filter=_key(resources_id=resources_id))

    @tracked("get_latest_resources")
    async def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        """The most recently added or updated snapshot, or ``None``."""
        async with self._reading() as collections:
            latest_id = await self._latest_resources_id_in(collections)
            if latest_id is None:
                return None
            return await collections.resources.get(filter=_key(resources_id=latest_id))

    # =================================================================================================================
    # Updates
    # =================================================================================================================

    @tracked("update_rollout")
    @healthcheck_before
    async def _update_rollout(self, rollout_id: str, fields: Dict[str, Any]) -> Rollout:
        updates = dict(fields)
        if updates.get("config") is not None:
            updates["config"] = _checked_config(updates["config"])
        if isinstance(updates.get("metadata"), dict):
            updates["metadata"] = dict(updates["metadata"])
        now = time.time()
        changes: RolloutChanges = []
        async with self.collections.atomic(
            mode="rw", labels=["rollouts", "rollout_queue"], rollout_ids=[rollout_id]
        ) as collections:
            rollout = await collections.rollouts.get(filter=_key(rollout_id=rollout_id))
            if rollout is None:
                raise ValueError(missing_item_message({"rollout_id": rollout_id}))
            updated = await self._write_rollout(collections, rollout, updates, now, changes, validate=True)
        await self._post_update_rollout(changes)
        return updated

    @tracked("update_attempt")
    @healthcheck_before
    async def _update_attempt(self, rollout_id: str, attempt_id: str, fields: Dict[str, Any]) -> Attempt:
        updates = dict(fields)
        if updates.get("last_heartbeat_time") is not None:  # NaN: the attempt could never be found unresponsive
            check_finite(updates["last_heartbeat_time"], "last_heartbeat_time")
        if isinstance(updates.get("metadata"), dict):
            updates["metadata"] = dict(updates["metadata"])
        now = time.time()
        changes: RolloutChanges = []
        # The update writes this rollout's rows; a status or worker change may also queue this rollout again (a row
        # of its own) and write worker records field by field.
        async with self.collections.atomic(
            mode="rw", labels=["rollouts", "attempts", "workers", "rollout_queue"], rollout_ids=[rollout_id]
        ) as collections:
            rollout = await self._get_rollout(collections, rollout_id)
            latest = await self._latest_attempt(collections, rollout_id)
            if latest is None:
                raise ValueError(f"No attempts found for rollout {rollout_id}")
            attempt = (
                latest
                if attempt_id == "latest" or attempt_id == latest.attempt_id
                else await collections.attempts.get(filter=_key(rollout_id=rollout_id, attempt_id=attempt_id))
            )
            if attempt is None:
                raise ValueError(f"Attempt {attempt_id} not found for rollout {rollout_id}")
            _validated_copy(attempt, updates)  # reject bad values before anything is written
            updated = await self._apply_attempt_update(collections, rollout, attempt, updates, now, changes, latest)
        await self._post_update_rollout(changes)
        return updated

    # =================================================================================================================
    # Workers
    # =================================================================================================================

    @tracked("query_workers")
    @healthcheck_before
    async def _query_workers(self, query: QueryWorkersRequest) -> PaginatedResult[Worker]:
        filter_options = _filter_with(
            query.filter_logic,  # type: ignore[arg-type]
            status={"within": query.status_in},
            worker_id={"contains": query.worker_id_contains},
        )
        async with self._reading() as collections:
            return await collections.workers.query(filter=filter_options, **_page_options(query))

    @tracked("get_worker_by_id")
    async def get_worker_by_id(self, worker_id: str) -> Optional[Worker]:
        """One worker, or ``None``."""
        async with self._reading() as collections:
            return await collections.workers.get(filter=_key(worker_id=worker_id))

    @tracked("update_worker")
    async def update_worker(self, worker_id: str, heartbeat_stats: Dict[str, Any] | Unset = UNSET) -> Worker:
        """Record a heartbeat (creating the worker as ``unknown`` when new); never changes the status."""
        _check_worker_id(worker_id)
        fields: Dict[str, Any] = {"last_heartbeat_time": time.time()}
        if not isinstance(heartbeat_stats, Unset):
            if not isinstance(heartbeat_stats, dict):
                raise TypeError(f"heartbeat_stats must be a dict, got {type(heartbeat_stats).__name__}")
            fields["heartbeat_stats"] = dict(heartbeat_stats)
        async with self.collections.atomic(mode="rw", labels=["workers"], rollout_ids=()) as collections:
            (worker,) = await collections.workers.upsert(
                [Worker(worker_id=worker_id, **fields)], update_fields=list(fields)
            )
        return worker

    # =================================================================================================================
    # Training metrics
    # =================================================================================================================

    @tracked("add_metrics")
    async def add_metrics(self, records: Sequence[MetricsRecord]) -> Sequence[MetricsRecord]:
        """Store training metrics, replacing stored records of the same ``(run_id, step)``.

        Raises:
            TypeError: An item is not a :class:`MetricsRecord`.
        """
        for record in records:
            if not isinstance(record, MetricsRecord):
                raise TypeError(f"Expected MetricsRecord, got {type(record).__name__}")
        if not records:
            return []
        async with self.collections.atomic(mode="rw", labels=["generic"]) as collections:
            return await collections.metrics.upsert(list(records), update_fields=["time", "values"])

    @tracked("query_metrics")
    async def query_metrics(
        self, *, run_id: Optional[str] = None, limit: int = -1, offset: int = 0
    ) -> PaginatedResult[MetricsRecord]:
        """Training metrics in the order first written, optionally of one run only."""
        filter_options: FilterOptions = _key(run_id=run_id) if run_id is not None else {}
        async with self._reading() as collections:
            return await collections.metrics.query(filter=filter_options or None, limit=limit, offset=offset)

    # =================================================================================================================
    # Waiting
    # =================================================================================================================

    def _notify_finished(self, rollout_ids: Sequence[str]) -> None:
        with self._waiters_lock:
            waiters = {waiter for rollout_id in rollout_ids for waiter in self._waiters.get(rollout_id, ())}
        for waiter in waiters:
            waiter.wake()

    def _notify_queued(self) -> None:
        with self._waiters_lock:
            waiters = list(self._queue_waiters)
        for waiter in waiters:
            waiter.wake()

    def _listen_for_changes(self) -> None:
        """Hook run before a wait: start receiving other processes' changes (no-op: one process owns the data)."""

    def _register_waiter(self, waiter: _Waiter, rollout_ids: Sequence[str]) -> None:
        self._listen_for_changes()
        with self._waiters_lock:
            for rollout_id in rollout_ids:
                self._waiters.setdefault(rollout_id, set()).add(waiter)

    def _unregister_waiter(self, waiter: _Waiter, rollout_ids: Sequence[str]) -> None:
        with self._waiters_lock:
            for rollout_id in rollout_ids:
                registered = self._waiters.get(rollout_id)
                if registered is not None:
                    registered.discard(waiter)
                    if not registered:
                        del self._waiters[rollout_id]

    async def _wait_until_finished(self, rollout_ids: Sequence[str], timeout: Optional[float]) -> Dict[str, Rollout]:
        """Finished rollouts among ``rollout_ids`` once all known ones finished or the deadline passed.

        Woken by completion notifications from this process; also re-checks at least every
        ``_wait_poll_interval`` seconds (changes made by other processes, watchdog verdicts). Cancellable.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(timeout, 0.0)
        unique_ids = list(dict.fromkeys(rollout_ids))
        waiter = _Waiter()
        self._register_waiter(waiter, unique_ids)
        finished: Dict[str, Rollout] = {}
        # Only rollouts not yet seen finished are re-read, so each wake-up costs O(still running), not O(all).
        pending = unique_ids
        try:
            first = True
            while True:
                if not first:
                    await self._healthcheck()
                first = False
                waiter.event.clear()
                async with self._reading() as collections:
                    known = await collections.rollouts.query(filter={"_must": {"rollout_id": {"within": pending}}})
                finished.update((rollout.rollout_id, rollout) for rollout in known if is_finished(rollout))
                pending = [rollout.rollout_id for rollout in known if not is_finished(rollout)]
                if not pending:
                    return finished
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return finished
                slice_seconds = (
                    self._wait_poll_interval if remaining is None else min(self._wait_poll_interval, remaining)
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), timeout=max(slice_seconds, 0.01))
        finally:
            self._unregister_waiter(waiter, unique_ids)

    @tracked("wait_for_queued_rollouts")
    async def wait_for_queued_rollouts(self, timeout: float) -> bool:
        """Wait until the queue holds a rollout (True) or ``timeout`` seconds have passed (False).

        Woken at once by rollouts queued (or requeued) through this store object; also re-checks at least every
        ``_wait_poll_interval`` seconds, for rollouts queued by other processes sharing the data (a PostgreSQL store
        is woken by their notifications). Cancellable.
        """
        timeout = queue_wait_seconds(timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = _Waiter()
        self._listen_for_changes()
        with self._waiters_lock:
            self._queue_waiters.add(waiter)
        try:
            while True:
                waiter.event.clear()  # registered before the check: a rollout queued after it still wakes us
                if await self._queue_has_rollouts():
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), timeout=min(self._wait_poll_interval, remaining))
        finally:
            with self._waiters_lock:
                self._queue_waiters.discard(waiter)

    async def wait_for_rollout(self, rollout_id: str, timeout: Optional[float] = None) -> Optional[Rollout]:
        """The rollout once finished; ``None`` if unknown or still unfinished at the deadline."""
        return (await self._wait_until_finished([rollout_id], timeout)).get(rollout_id)

    @tracked("wait_for_rollouts")
    @healthcheck_before
    async def wait_for_rollouts(self, *, rollout_ids: List[str], timeout: Optional[float] = None) -> List[Rollout]:
        """The rollouts among ``rollout_ids`` finished by the deadline, in input order; unknown ids are omitted.

        ``timeout=None`` waits until every known rollout finished (cancel the task to stop waiting);
        ``timeout <= 0`` checks once. Never modifies rollouts.
        """
        rollout_ids, timeout = rollout_wait_arguments(rollout_ids, timeout)
        finished = await self._wait_until_finished(rollout_ids, timeout)
        return [finished[rollout_id] for rollout_id in rollout_ids if rollout_id in finished]

    # =================================================================================================================
    # Statistics
    # =================================================================================================================

    @tracked("statistics")
    async def statistics(self) -> LightningStoreStatistics:
        """Counts of stored items and uptime."""
        async with self._reading() as collections:
            return LightningStoreStatistics(
                name=type(self).__name__,
                total_rollouts=await collections.rollouts.size(),
                total_attempts=await collections.attempts.size(),
                total_spans=await collections.spans.size(),
                total_resources=await collections.resources.size(),
                total_workers=await collections.workers.size(),
                uptime=time.time() - self._start_time,
            )
