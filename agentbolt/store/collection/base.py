"""The storage interface the store lifecycle is written against: collections, a queue and a key-value map.

Backends (memory, SQLite, ...) implement only these primitives; every lifecycle rule lives once in
:class:`agentbolt.store.collection_based.CollectionBasedLightningStore`.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generic,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
)

from agentbolt.store.method_context import current_store_method_labels
from agentbolt.types import FilterField, FilterOptions, PaginatedResult, SortOptions

if TYPE_CHECKING:
    from agentbolt.types import Attempt, MetricsRecord, ResourcesUpdate, Rollout, Span, Worker
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "AtomicLabels",
    "AtomicMode",
    "Collection",
    "Queue",
    "KeyValue",
    "FilterOptions",
    "SortOptions",
    "PaginatedResult",
    "LightningCollections",
    "DuplicatedPrimaryKeyError",
    "StorageUnavailableError",
    "StorageOutcomeUnknownError",
    "TrackedCollection",
    "normalize_filter_options",
    "merge_must_filters",
    "resolve_sort_options",
    "ensure_numeric",
    "resolve_error_type",
    "record_outcome",
    "FILTER_OPERATORS",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")

AtomicMode = Literal["r", "w", "rw"]
AtomicLabels = Literal[
    "rollouts", "attempts", "spans", "resources", "workers", "rollout_queue", "span_sequence_ids", "generic"
]
FILTER_OPERATORS: Tuple[str, ...] = ("exact", "within", "contains")


class DuplicatedPrimaryKeyError(ValueError):
    """Inserting an item whose primary key already exists."""


class StorageUnavailableError(RuntimeError):
    """The storage cannot be reached right now (connection lost, server restarting, locked beyond the timeout).

    The operation was not applied: calling it again later is safe.
    """


class StorageOutcomeUnknownError(RuntimeError):
    """The connection to the storage failed while committing: the operation may or may not have been applied."""


def resolve_error_type(exc: Optional[BaseException]) -> str:
    """Label of an outcome for metrics: ``"OK"`` or the exception's class name."""
    return "OK" if exc is None else type(exc).__name__


@asynccontextmanager
async def record_outcome(
    tracker: MetricsBackend, labels: Mapping[str, str], *, counter: str, histogram: str
) -> AsyncIterator[None]:
    """Count the operation run in the ``async with`` body in ``counter`` and its seconds in ``histogram``.

    Both are recorded once the body ends, however it ends, with ``labels`` plus ``status`` (see
    :func:`resolve_error_type`); an exception of the body propagates.
    """
    start = time.perf_counter()
    error: Optional[BaseException] = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        labelled = {**labels, "status": resolve_error_type(error)}
        await tracker.inc_counter(counter, labels=labelled)
        await tracker.observe_histogram(histogram, time.perf_counter() - start, labels=labelled)


def ensure_numeric(value: Any, *, description: str) -> float | int:
    """Reject non-numeric values (booleans included) with a ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{description} must be numeric, got {type(value).__name__}")
    return value


def merge_must_filters(target: Dict[str, FilterField], definition: Any) -> None:
    """Merge one ``_must`` mapping (or a sequence of them) into ``target``; a repeated operator is an error."""
    if definition is None:
        return
    if isinstance(definition, Mapping):
        entries: Sequence[Mapping[str, Any]] = [definition]
    elif isinstance(definition, Sequence) and not isinstance(definition, (str, bytes)):
        entries = list(definition)
    else:
        raise ValueError(f"_must must be a mapping or a sequence of mappings, got {type(definition).__name__}")
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise ValueError("_must entries must be mappings of field -> operators")
        for field, ops in entry.items():
            if not isinstance(ops, Mapping):
                raise ValueError(f"Filter for field {field!r} must be a mapping of operators")
            current = target.setdefault(field, {})
            for op, value in ops.items():
                if op not in FILTER_OPERATORS:
                    raise ValueError(f"Unknown filter operator {op!r} for field {field!r}")
                if op in current:
                    raise ValueError(f"Duplicate operator {op!r} for field {field!r} in _must filters")
                current[op] = value  # type: ignore[literal-required]


def normalize_filter_options(
    filter: Optional[FilterOptions],
) -> Tuple[Optional[Dict[str, FilterField]], Optional[Dict[str, FilterField]], Literal["and", "or"]]:
    """Split filter options into (field filters, must filters, aggregate), validating operators.

    Operators whose expected value is ``None`` are dropped; empty groups become ``None``.
    """
    if not filter:
        return None, None, "and"
    aggregate = filter.get("_aggregate", "and")
    if aggregate not in ("and", "or"):
        raise ValueError(f"Unsupported filter aggregate {aggregate!r}; use 'and' or 'or'")
    must: Dict[str, FilterField] = {}
    merge_must_filters(must, filter.get("_must"))
    filters: Dict[str, FilterField] = {}
    for field, ops in filter.items():
        if field in ("_aggregate", "_must"):
            continue
        if not isinstance(ops, Mapping):
            raise ValueError(f"Filter for field {field!r} must be a mapping of operators")
        kept: Dict[str, Any] = {}
        for op, value in ops.items():
            if op not in FILTER_OPERATORS:
                raise ValueError(f"Unknown filter operator {op!r} for field {field!r}")
            if value is not None:
                kept[op] = value
        if kept:
            filters[field] = kept  # type: ignore[assignment]
    cleaned_must: Dict[str, FilterField] = {}
    for field, ops in must.items():
        kept_must = {op: value for op, value in ops.items() if value is not None}
        if kept_must:
            cleaned_must[field] = kept_must  # type: ignore[assignment]
    return (filters or None), (cleaned_must or None), aggregate  # type: ignore[return-value]


def resolve_sort_options(sort: Optional[SortOptions]) -> Tuple[Optional[str], Literal["asc", "desc"]]:
    """``(field name or None, order)`` from sort options."""
    if not sort:
        return None, "asc"
    name = sort.get("name")
    if not name:
        raise ValueError("Sort options must include a 'name' field")
    order = sort.get("order", "asc")
    if order not in ("asc", "desc"):
        raise ValueError(f"Invalid sort order {order!r}; use 'asc' or 'desc'")
    return name, order


class TrackedCollection:
    """Mixin recording per-operation counters and latencies when a metrics tracker is attached."""

    def __init__(self, tracker: MetricsBackend | None = None, name: Optional[str] = None) -> None:
        if tracker is not None and not callable(getattr(tracker, "register_histogram", None)):
            raise TypeError(
                f"tracker must be a metrics backend (e.g. agentbolt.utils.metrics.ConsoleMetricsBackend()), "
                f"got {type(tracker).__name__}"
            )
        self._tracker = tracker
        self._name = name

    @property
    def tracker(self) -> MetricsBackend | None:
        """The metrics backend, if any."""
        return self._tracker

    @property
    def collection_name(self) -> str:
        """Name used in metric labels: the ``name`` given to the constructor."""
        if self._name is None:
            raise NotImplementedError()
        return self._name

    @property
    def extra_tracking_labels(self) -> Dict[str, str]:
        """Extra labels attached to every metric of this collection."""
        return {}

    @asynccontextmanager
    async def tracking_context(self, operation: str, collection: str) -> AsyncIterator[None]:
        """Record ``agl.collections.total`` / ``agl.collections.latency`` around an operation."""
        if self._tracker is None:
            yield
            return
        labels = {
            **current_store_method_labels(),
            "operation": operation,
            "collection": collection,
            **self.extra_tracking_labels,
        }
        async with record_outcome(
            self._tracker, labels, counter="agl.collections.total", histogram="agl.collections.latency"
        ):
            yield


class Collection(TrackedCollection, Generic[T]):
    """A table of pydantic items keyed by a (composite) primary key."""

    def primary_keys(self) -> Sequence[str]:
        """Field names forming the primary key."""
        raise NotImplementedError()

    def item_type(self) -> Type[T]:
        """The pydantic model stored."""
        raise NotImplementedError()

    async def size(self) -> int:
        """Number of items."""
        raise NotImplementedError()

    async def _page(
        self, filter: Optional[FilterOptions], sort: Optional[SortOptions], limit: int, offset: int, raw: bool = False
    ) -> Tuple[List[Any], int]:
        """The page of items matching ``filter`` (each as JSON bytes when ``raw``) and the number of matches.

        Backends implement this (checking ``limit`` and ``offset``); :meth:`query`, :meth:`query_json` and
        :meth:`get` are built on it.
        """
        raise NotImplementedError()

    async def query(
        self,
        filter: Optional[FilterOptions] = None,
        sort: Optional[SortOptions] = None,
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[T]:
        """Items matching ``filter``, sorted, paginated (``limit=-1`` means no limit)."""
        async with self.tracking_context("query", self.collection_name):
            items, total = await self._page(filter, sort, limit, offset)
            return PaginatedResult(items=items, limit=limit, offset=offset, total=total)

    async def get(self, filter: Optional[FilterOptions] = None, sort: Optional[SortOptions] = None) -> Optional[T]:
        """The first matching item (by ``sort`` when given), or ``None``."""
        async with self.tracking_context("get", self.collection_name):
            return await self._first(filter, sort)

    async def _first(self, filter: Optional[FilterOptions], sort: Optional[SortOptions]) -> Optional[T]:
        """The first item matching ``filter``: the first page of one. A backend for which counting the matches costs
        a statement of its own overrides this to skip the count."""
        items, _ = await self._page(filter, sort, 1, 0)
        return items[0] if items else None

    async def query_json(
        self,
        filter: Optional[FilterOptions] = None,
        sort: Optional[SortOptions] = None,
        limit: int = -1,
        offset: int = 0,
    ) -> Tuple[List[bytes], int]:
        """Like :meth:`query`, with each item as JSON (an object with the item's fields), and the total.

        Backends storing items as JSON return them without building the models.
        """
        async with self.tracking_context("query", self.collection_name):
            return await self._page(filter, sort, limit, offset, raw=True)

    async def insert(self, items: Sequence[T]) -> None:
        """Insert new items; a duplicated primary key raises :class:`DuplicatedPrimaryKeyError`."""
        raise NotImplementedError()

    async def insert_new(self, items: Sequence[T]) -> Sequence[T]:
        """Insert the items whose primary key is not stored yet (of repeated keys, the first); returns those inserted.

        Backends may override this with a single statement; the default inserts the items one by one.
        """
        inserted: List[T] = []
        for item in items:
            try:
                await self.insert([item])
            except DuplicatedPrimaryKeyError:
                continue
            inserted.append(item)
        return inserted

    async def update(self, items: Sequence[T], update_fields: Optional[Sequence[str]] = None) -> Sequence[T]:
        """Update existing items (whole, or only ``update_fields``); a missing item raises ``ValueError``."""
        raise NotImplementedError()

    async def upsert(self, items: Sequence[T], update_fields: Optional[Sequence[str]] = None) -> Sequence[T]:
        """Insert or update. ``update_fields=None`` replaces; a list updates those fields; ``[]`` is get-or-insert."""
        raise NotImplementedError()

    async def delete(self, items: Sequence[T]) -> None:
        """Delete existing items; a missing item raises ``ValueError``."""
        raise NotImplementedError()


class Queue(TrackedCollection, Generic[T]):
    """A FIFO queue."""

    def item_type(self) -> Type[T]:
        """Type of the queued items."""
        raise NotImplementedError()

    async def has(self, item: T) -> bool:
        """Whether ``item`` is queued."""
        raise NotImplementedError()

    async def enqueue(self, items: Sequence[T]) -> Sequence[T]:
        """Append items at the tail."""
        raise NotImplementedError()

    async def dequeue(self, limit: int = 1) -> Sequence[T]:
        """Pop up to ``limit`` items from the head."""
        raise NotImplementedError()

    async def peek(self, limit: int = 1) -> Sequence[T]:
        """Up to ``limit`` items from the head, without removing them."""
        raise NotImplementedError()

    async def size(self) -> int:
        """Number of queued items."""
        raise NotImplementedError()


class KeyValue(TrackedCollection, Generic[K, V]):
    """A key-value map with atomic numeric helpers."""

    async def has(self, key: K) -> bool:
        """Whether ``key`` exists."""
        raise NotImplementedError()

    async def get(self, key: K, default: Optional[V] = None) -> Optional[V]:
        """Value of ``key`` or ``default``."""
        raise NotImplementedError()

    async def set(self, key: K, value: V) -> None:
        """Set ``key`` to ``value``."""
        raise NotImplementedError()

    async def inc(self, key: K, amount: V) -> V:
        """Add ``amount`` (a missing key counts as 0) and return the new value."""
        raise NotImplementedError()

    async def chmax(self, key: K, value: V) -> V:
        """Store ``max(current, value)`` and return it."""
        raise NotImplementedError()

    async def pop(self, key: K, default: Optional[V] = None) -> Optional[V]:
        """Remove ``key`` and return its value (or ``default``)."""
        raise NotImplementedError()

    async def size(self) -> int:
        """Number of keys."""
        raise NotImplementedError()


class LightningCollections(TrackedCollection):
    """The set of collections a store needs, with atomic sections.

    Within ``atomic(mode="rw")`` the operations of one section are isolated from other sections touching the same
    labels; durable backends commit the section as one transaction.
    """

    def __init__(self, tracker: MetricsBackend | None = None, extra_labels: Optional[Sequence[str]] = None) -> None:
        super().__init__(tracker=tracker, name="router")
        self._extra_labels = list(extra_labels or [])
        if tracker is not None:
            label_names = ["store_pubmeth", "operation", "collection", "store_privmeth", "status", *self._extra_labels]
            tracker.register_histogram("agl.collections.latency", label_names, group_level=2)
            tracker.register_counter("agl.collections.total", label_names, group_level=2)

    # Each backend sets these in its constructor, narrowing the types to its own classes.
    rollouts: Collection[Rollout]
    """Rollouts, keyed by ``rollout_id``."""
    attempts: Collection[Attempt]
    """Attempts, keyed by ``(rollout_id, attempt_id)``."""
    spans: Collection[Span]
    """Spans, keyed by ``(rollout_id, attempt_id, span_id)``."""
    resources: Collection[ResourcesUpdate]
    """Resource snapshots, keyed by ``resources_id``."""
    workers: Collection[Worker]
    """Workers, keyed by ``worker_id``."""
    rollout_queue: Queue[str]
    """FIFO of rollout ids waiting to be dequeued."""
    span_sequence_ids: KeyValue[str, int]
    """Per-rollout span sequence counters, keyed by rollout id.

    Only a stored rollout has a counter: writing (``set``, ``inc``, ``chmax``) the counter of an id that is not
    a stored rollout's returns what it would for a missing key and stores nothing, so asking for the sequence
    ids of an unknown rollout leaves no counter behind. Backends check this as they write (the SQL ones in the
    writing statement), so the counters of stored rollouts cost nothing more.
    """
    _metrics: Optional[Collection[MetricsRecord]] = None
    """Set by the backends that keep training metrics (see :attr:`metrics`)."""

    @property
    def metrics(self) -> Collection[MetricsRecord]:
        """Training metrics, keyed by ``(run_id, step)`` (backends without it raise ``NotImplementedError``)."""
        if self._metrics is None:
            raise NotImplementedError(f"{type(self).__name__} does not keep training metrics")
        return self._metrics

    async def claim_periodic_run(self, name: str, interval: float, now: float) -> bool:
        """Whether the caller should run the periodic task ``name`` now.

        Storage shared by several processes answers True to one caller per ``interval`` seconds among all of them
        (so that, e.g., the watchdog scans once per period however many server workers there are); storage owned by
        one process always answers True (the caller debounces locally).
        """
        return True

    def atomic(
        self,
        *,
        mode: AtomicMode = "rw",
        snapshot: bool = False,
        commit: bool = False,
        labels: Optional[Sequence[AtomicLabels]] = None,
        rollout_ids: Optional[Sequence[str]] = None,
        **kwargs: Any,
    ) -> Any:
        """Async context manager yielding collections usable as one atomic section.

        Args:
            mode: ``"r"`` (reads), ``"w"`` or ``"rw"`` (writes, applied together or not at all).
            snapshot: Reads see one consistent state for the whole section.
            commit: Write through at the end of the section (backends that buffer writes).
            labels: The collections the section touches (all when empty); sections sharing a label are serialized.
            rollout_ids: The section touches only the data of these rollouts (their rollout rows, attempts, spans and
                sequence counters), of rollouts it creates (an empty sequence: it only creates rollouts, and
                queues them) and of rollouts it adds with :meth:`lock_rollouts`; it may also write worker records,
                field by field with ``upsert(..., update_fields=...)`` (each such write is atomic on its own).
                Backends that lock across processes use it to run sections on different rollouts side by side; a
                section without it (``None``) excludes every section on its labels. Backends that serialize all
                writes anyway ignore it.
        """
        raise NotImplementedError()

    async def lock_rollouts(self, rollout_ids: Sequence[str]) -> None:
        """Add ``rollout_ids`` to the rollouts the current section touches (see ``rollout_ids`` of :meth:`atomic`).

        For a section that learns which rollouts it touches as it goes, such as a dequeue, which claims queue
        entries first. A backend that locks rollouts one by one locks these now, so the section waits for any other
        section on them and then reads their last committed state; backends that hold whole labels already (every
        section without ``rollout_ids``, and all sections of backends that serialize writes) have nothing to do.
        """
        return None

    async def execute(
        self,
        callback: Callable[[LightningCollections], Awaitable[R]],
        *,
        mode: AtomicMode = "rw",
        snapshot: bool = False,
        commit: bool = False,
        labels: Optional[Sequence[AtomicLabels]] = None,
        **kwargs: Any,
    ) -> R:
        """Run ``callback(collections)`` inside :meth:`atomic`."""
        async with self.atomic(mode=mode, snapshot=snapshot, commit=commit, labels=labels, **kwargs) as collections:
            return await callback(collections)
