"""In-memory collections: dict-indexed tables, a FIFO queue, a key-value map and per-label locks.

The pure filter semantics (:func:`_item_matches_filters`) and sort-key rules (:func:`sort_key_function`) are defined
here once; other backends reuse them to check or post-filter items.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import logging
import threading
import types
import weakref
from collections import deque
from contextlib import contextmanager
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Iterable,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import BaseModel
from typing_extensions import Self

from agentbolt.types import (
    Attempt,
    FilterField,
    FilterOptions,
    MetricsRecord,
    ResourcesUpdate,
    Rollout,
    SortOptions,
    Span,
    Worker,
)
from agentbolt.types.wire import encode_json_repairing

from .base import (
    AtomicLabels,
    AtomicMode,
    Collection,
    DuplicatedPrimaryKeyError,
    KeyValue,
    LightningCollections,
    Queue,
    ensure_numeric,
    normalize_filter_options,
    resolve_sort_options,
)

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "ListBasedCollection",
    "DequeBasedQueue",
    "DictBasedKeyValue",
    "InMemoryLightningCollections",
    "missing_item_message",
    "sort_items",
    "sort_key_function",
]

logger = logging.getLogger("agentbolt.store.collection.memory")

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
M = TypeVar("M", bound=BaseModel)

_IMMUTABLE = frozenset((str, int, float, bool, type(None), bytes))


def _detached_value(value: Any) -> Any:
    """A copy of ``value`` sharing nothing mutable with it (lists of numbers and strings copied at C speed)."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is list:
        if _IMMUTABLE.issuperset(map(type, value)):
            return value.copy()
        return [_detached_value(item) for item in value]
    if kind is dict:
        return {key: _detached_value(item) for key, item in value.items()}
    if isinstance(value, BaseModel):
        return _detached(value)
    try:
        return copy.deepcopy(value)
    except (TypeError, copy.Error):  # a lock, a client, an open file...: shared, as the store shared all before
        return value


def _attributes_copy(attributes: Any) -> Any:
    """A copy of the attributes of a span, an event, a link or a resource: they hold strings, numbers and lists of
    them (checked when the model is built), so copying their lists suffices, at a fraction of checking each item."""
    if type(attributes) is not dict:
        return _detached_value(attributes)
    return {key: value.copy() if type(value) is list else value for key, value in attributes.items()}


def _detached(item: M) -> M:
    """A copy of a stored item that shares nothing mutable with it.

    The collections copy what they are given and what they return, as a store that writes to a database does: a
    caller that changes a value it wrote or read (an agent changing its task in place) changes nothing stored, and
    nothing another reader sees. ``copy.deepcopy`` would copy a span's token ids one by one; the lists of a span's
    attributes are copied whole.
    """
    copied = item.model_copy()
    fields = copied.__dict__
    for name, value in fields.items():
        fields[name] = _attributes_copy(value) if name == "attributes" else _detached_value(value)
    extra = copied.__pydantic_extra__
    if extra:
        copied.__pydantic_extra__ = {name: _detached_value(value) for name, value in extra.items()}
    return copied


ALL_LABELS: Tuple[AtomicLabels, ...] = (
    "rollouts",
    "attempts",
    "spans",
    "resources",
    "workers",
    "rollout_queue",
    "span_sequence_ids",
    "generic",
)


# ---------------------------------------------------------------------------------------------------------------------
# Filter and sort semantics (shared by every backend)
# ---------------------------------------------------------------------------------------------------------------------


def _field_value(item: Any, field: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(field)
    return getattr(item, field, None)


def _operator_matches(value: Any, op: str, expected: Any) -> bool:
    if op == "exact":
        return bool(value == expected)
    if op == "within":
        try:
            return value in expected
        except TypeError:
            return False
    if op == "contains":
        if value is None:
            return False
        if isinstance(value, str):
            return isinstance(expected, str) and expected in value
        try:
            return expected in value
        except TypeError:
            return False
    raise ValueError(f"Unknown filter operator {op!r}")


def _item_matches_filters(
    item: Any,
    filters: Optional[Mapping[str, FilterField]],
    filter_logic: Literal["and", "or"],
    must_filters: Optional[Mapping[str, FilterField]] = None,
) -> bool:
    """Whether ``item`` satisfies normalised filters (see :func:`normalize_filter_options`).

    Every ``_must`` condition must hold. Every operator of every other field contributes one condition to a pool,
    combined with ``filter_logic``; an empty pool matches everything. Operators expecting ``None`` are ignored.
    """
    if must_filters:
        for field, ops in must_filters.items():
            value = _field_value(item, field)
            for op, expected in ops.items():
                if expected is not None and not _operator_matches(value, op, expected):
                    return False
    if not filters:
        return True
    any_condition = False
    for field, ops in filters.items():
        value = _field_value(item, field)
        for op, expected in ops.items():
            if expected is None:
                continue
            any_condition = True
            matched = _operator_matches(value, op, expected)
            if filter_logic == "and" and not matched:
                return False
            if filter_logic == "or" and matched:
                return True
    return filter_logic == "and" or not any_condition


def _unwrap_optional(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap_optional(args[0])
    return annotation


def _none_default_for(annotation: Any) -> Tuple[bool, Any]:
    """``(known, default)`` used in place of ``None`` when sorting a field of this annotation."""
    annotation = _unwrap_optional(annotation)
    if annotation is str or get_origin(annotation) is Literal:
        return True, ""
    if annotation is bool:
        return True, False
    if annotation is int:
        return True, 0
    if annotation is float:
        return True, 0.0
    return False, None


def sort_key_function(item_type: Type[Any], field: str) -> Callable[[Any], Any]:
    """Sort key for ``field`` of ``item_type`` items.

    ``*_time`` fields sort ``None`` after every value; other ``None`` values take the default of the field's type
    (``""`` for strings and literals, ``0`` for numbers) or sort first. Unknown fields raise ``ValueError``.
    """
    model_fields: Mapping[str, Any] = getattr(item_type, "model_fields", {})
    if field not in model_fields:
        allowed = ", ".join(model_fields)
        raise ValueError(f"Invalid sort field {field!r} for {item_type.__name__}; allowed fields are: {allowed}")
    if field.endswith("_time"):

        def time_key(item: Any) -> Any:
            value = _field_value(item, field)
            return (1, 0.0) if value is None else (0, value)

        return time_key
    known, default = _none_default_for(model_fields[field].annotation)
    if known:

        def typed_key(item: Any) -> Any:
            value = _field_value(item, field)
            return default if value is None else value

        return typed_key

    def generic_key(item: Any) -> Any:
        value = _field_value(item, field)
        return (0, 0) if value is None else (1, value)

    return generic_key


@contextmanager
def _comparable(field: Optional[str]) -> Iterator[None]:
    """Give a comparison failure while sorting a message naming the field."""
    try:
        yield
    except TypeError as exc:
        raise TypeError(f"Cannot sort by {field!r}: its values are not comparable ({exc})") from None


def sort_items(items: List[T], item_type: Type[Any], field: str, order: Literal["asc", "desc"]) -> None:
    """Sort ``items`` in place by ``field`` with the shared rules of :func:`sort_key_function` (stable).

    Raises:
        ValueError: ``field`` is not a field of ``item_type``.
        TypeError: The field's values cannot be compared with each other.
    """
    key = sort_key_function(item_type, field)
    with _comparable(field):
        items.sort(key=key, reverse=order == "desc")


def missing_item_message(keys: Mapping[str, Any]) -> str:
    """Error text for an update/delete of an item that does not exist."""
    rendered = ", ".join(f"{name}={value!r}" for name, value in keys.items())
    return f"Item does not exist with primary key(s): {rendered}"


def paginate(items: List[T], limit: int, offset: int) -> List[T]:
    """Apply ``offset``/``limit`` (``-1`` = unlimited) to a list."""
    if offset < 0:
        raise ValueError("offset must be >= 0")
    if limit == -1:
        return items[offset:]
    if limit < 0:
        raise ValueError("limit must be >= 0 or -1 for no limit")
    return items[offset : offset + limit]


def _tracked_operation(operation: str) -> Callable[[F], F]:
    """Record collection metrics around an operation, with no overhead when no tracker is attached."""

    def decorator(func: F) -> F:
        @functools.wraps(func)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self._tracker is None:
                return await func(self, *args, **kwargs)
            async with self.tracking_context(operation, self.collection_name):
                return await func(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


# ---------------------------------------------------------------------------------------------------------------------
# Collections
# ---------------------------------------------------------------------------------------------------------------------


class ListBasedCollection(Collection[T]):
    """A table of pydantic items indexed by primary key, kept in insertion order.

    Items are indexed by their full primary key (O(1) lookups) and, for composite keys, grouped by the first key
    field so that exact filters on it only scan that group. Items are copied (shallowly) on the way in and out,
    so callers cannot alter stored items by mutating returned objects.

    Args:
        items: Initial items.
        item_type: The pydantic model stored.
        primary_keys: Field names forming the primary key (at least one).
        id: Name of the collection (used in metrics).
        tracker: Optional metrics backend.
    """

    def __init__(
        self,
        items: List[T],
        item_type: Type[T],
        primary_keys: Sequence[str],
        id: Optional[str] = None,
        tracker: MetricsBackend | None = None,
    ) -> None:
        if not primary_keys:
            raise ValueError("primary_keys must not be empty")
        if not (isinstance(item_type, type) and issubclass(item_type, BaseModel)):
            raise TypeError(f"ListBasedCollection stores pydantic models, not {item_type!r}")
        super().__init__(tracker=tracker, name=id or item_type.__name__.lower())
        self._item_type = item_type
        self._primary_keys = tuple(primary_keys)
        self._items: Dict[Tuple[Any, ...], T] = {}
        self._groups: Dict[Any, Dict[Tuple[Any, ...], T]] = {}
        self._ordinals: Dict[Tuple[Any, ...], int] = {}
        self._next_ordinal = 0
        if items:
            self._insert_now(items)

    def primary_keys(self) -> Sequence[str]:
        return self._primary_keys

    def item_type(self) -> Type[T]:
        return self._item_type

    # -- helpers -----------------------------------------------------------------------------------------------------

    def _key(self, item: T) -> Tuple[Any, ...]:
        if not isinstance(item, self._item_type):
            raise TypeError(f"Expected {self._item_type.__name__}, got {type(item).__name__}")
        return tuple(getattr(item, name) for name in self._primary_keys)

    def _key_repr(self, key: Tuple[Any, ...]) -> Dict[str, Any]:
        return dict(zip(self._primary_keys, key, strict=True))

    def _store(self, key: Tuple[Any, ...], item: T) -> None:
        copied = _detached(item)  # type: ignore[type-var]
        if key not in self._items:
            self._ordinals[key] = self._next_ordinal
            self._next_ordinal += 1
        self._items[key] = copied
        if len(self._primary_keys) > 1:
            self._groups.setdefault(key[0], {})[key] = copied

    def _remove(self, key: Tuple[Any, ...]) -> None:
        del self._items[key]
        del self._ordinals[key]
        if len(self._primary_keys) > 1:
            group = self._groups[key[0]]
            del group[key]
            if not group:
                del self._groups[key[0]]

    def holds(self, *key: Any) -> bool:
        """Whether an item with this primary key (its values, in key order) is stored."""
        return key in self._items

    def _insert_now(self, items: Sequence[T]) -> None:
        keys = [self._key(item) for item in items]
        seen: set[Tuple[Any, ...]] = set()
        for key in keys:
            if key in seen or key in self._items:
                raise DuplicatedPrimaryKeyError(f"Duplicated primary key(s): {self._key_repr(key)}")
            seen.add(key)
        for key, item in zip(keys, items, strict=True):
            self._store(key, item)

    def _exact_key_constraints(
        self,
        filters: Optional[Mapping[str, FilterField]],
        must_filters: Optional[Mapping[str, FilterField]],
        filter_logic: str,
    ) -> Dict[str, List[Any]]:
        """Primary-key fields constrained to exact values / candidate sets by conditions that must hold."""
        groups: List[Mapping[str, FilterField]] = []
        if must_filters:
            groups.append(must_filters)
        if filters and filter_logic == "and":
            groups.append(filters)
        constraints: Dict[str, List[Any]] = {}
        for group in groups:
            for field in self._primary_keys:
                ops = group.get(field)
                if not ops:
                    continue
                candidates: Optional[List[Any]] = None
                try:
                    if ops.get("exact") is not None:
                        candidates = list(dict.fromkeys([ops["exact"]]))
                    elif ops.get("within") is not None:
                        candidates = list(dict.fromkeys(ops["within"]))
                except TypeError:  # unhashable values: no index narrowing, plain matching applies
                    candidates = None
                if candidates is None:
                    continue
                if field in constraints:
                    constraints[field] = [c for c in constraints[field] if c in candidates]
                else:
                    constraints[field] = candidates
        return constraints

    def _candidates(
        self,
        filters: Optional[Mapping[str, FilterField]],
        must_filters: Optional[Mapping[str, FilterField]],
        filter_logic: str,
    ) -> Iterable[T]:
        constraints = self._exact_key_constraints(filters, must_filters, filter_logic)
        if all(name in constraints for name in self._primary_keys):
            # Every key field is pinned: direct lookups.
            keys: List[Tuple[Any, ...]] = [()]
            for name in self._primary_keys:
                keys = [(*key, value) for key in keys for value in constraints[name]]
            return self._in_insertion_order(keys)
        first = self._primary_keys[0]
        if first in constraints and len(self._primary_keys) > 1:
            values = constraints[first]
            if len(values) == 1:
                return list(self._groups.get(values[0], {}).values())
            return self._in_insertion_order([key for value in values for key in list(self._groups.get(value, {}))])
        return list(self._items.values())

    def _in_insertion_order(self, keys: Iterable[Tuple[Any, ...]]) -> List[T]:
        """Stored items of ``keys`` (missing ones skipped), in insertion order.

        Only single dict operations are used, so unlocked readers stay safe while another thread writes.
        """
        found = []
        for key in keys:
            item = self._items.get(key)
            ordinal = self._ordinals.get(key)
            if item is not None and ordinal is not None:
                found.append((ordinal, item))
        found.sort(key=lambda pair: pair[0])
        return [item for _, item in found]

    def _iter_items(
        self,
        root: Optional[Iterable[T]] = None,
        filters: Optional[Mapping[str, FilterField]] = None,
        must_filters: Optional[Mapping[str, FilterField]] = None,
        filter_logic: Literal["and", "or"] = "and",
    ) -> Iterator[T]:
        """Stored items (from ``root`` when given) matching the normalised filters."""
        source = root if root is not None else self._candidates(filters, must_filters, filter_logic)
        if not filters and not must_filters:
            yield from source
            return
        matches = globals()["_item_matches_filters"]
        for item in source:
            if matches(item, filters, filter_logic, must_filters):
                yield item

    def _matching(self, filter: Optional[FilterOptions], sort: Optional[SortOptions]) -> List[T]:
        filters, must_filters, logic = normalize_filter_options(filter)
        sort_name, sort_order = resolve_sort_options(sort)
        if sort_name is not None:
            sort_key_function(self._item_type, sort_name)  # reject unknown fields even when nothing matches
        items = list(self._iter_items(None, filters, must_filters, logic))
        if sort_name is not None:
            sort_items(items, self._item_type, sort_name, sort_order)
        return items

    # -- Collection API ----------------------------------------------------------------------------------------------

    @_tracked_operation("size")
    async def size(self) -> int:
        return len(self._items)

    async def _page(
        self, filter: Optional[FilterOptions], sort: Optional[SortOptions], limit: int, offset: int, raw: bool = False
    ) -> Tuple[List[Any], int]:
        items = self._matching(filter, sort)
        page = paginate(items, limit, offset)
        if raw:
            return [encode_json_repairing(item) for item in page], len(items)
        return [_detached(item) for item in page], len(items)  # type: ignore[type-var]

    @_tracked_operation("get")
    async def get(self, filter: Optional[FilterOptions] = None, sort: Optional[SortOptions] = None) -> Optional[T]:
        filters, must_filters, logic = normalize_filter_options(filter)
        sort_name, sort_order = resolve_sort_options(sort)
        matching = self._iter_items(None, filters, must_filters, logic)
        if sort_name is None:
            found = next(matching, None)
        else:
            key = sort_key_function(self._item_type, sort_name)
            chooser = max if sort_order == "desc" else min
            with _comparable(sort_name):
                found = chooser(matching, key=key, default=None)
        return None if found is None else _detached(found)  # type: ignore[type-var]

    @_tracked_operation("insert")
    async def insert(self, items: Sequence[T]) -> None:
        self._insert_now(items)

    def _existing_keys(self, items: Sequence[T]) -> List[Tuple[Any, ...]]:
        keys = [self._key(item) for item in items]
        for key in keys:
            if key not in self._items:
                raise ValueError(missing_item_message(self._key_repr(key)))
        return keys

    def _merged(self, key: Tuple[Any, ...], item: T, update_fields: Optional[Sequence[str]]) -> T:
        if update_fields is None:
            return item
        updates = {name: getattr(item, name) for name in update_fields}
        return self._items[key].model_copy(update=updates)  # type: ignore[attr-defined]

    def _check_update_fields(self, update_fields: Optional[Sequence[str]]) -> None:
        if update_fields is None:
            return
        model_fields = self._item_type.model_fields  # type: ignore[attr-defined]
        for name in update_fields:
            if name not in model_fields:
                raise ValueError(f"Unknown field {name!r} for {self._item_type.__name__}")

    @_tracked_operation("update")
    async def update(self, items: Sequence[T], update_fields: Optional[Sequence[str]] = None) -> Sequence[T]:
        self._check_update_fields(update_fields)
        keys = self._existing_keys(items)
        merged = [self._merged(key, item, update_fields) for key, item in zip(keys, items, strict=True)]
        for key, item in zip(keys, merged, strict=True):
            self._store(key, item)
        return [_detached(item) for item in merged]  # type: ignore[type-var]

    @_tracked_operation("upsert")
    async def upsert(self, items: Sequence[T], update_fields: Optional[Sequence[str]] = None) -> Sequence[T]:
        self._check_update_fields(update_fields)
        keys = [self._key(item) for item in items]
        results: List[T] = []
        for key, item in zip(keys, items, strict=True):
            if key in self._items:
                if update_fields is not None and not update_fields:
                    results.append(self._items[key])
                    continue
                item = self._merged(key, item, update_fields)
            self._store(key, item)
            results.append(self._items[key])
        return [_detached(item) for item in results]  # type: ignore[type-var]

    @_tracked_operation("delete")
    async def delete(self, items: Sequence[T]) -> None:
        for key in self._existing_keys(items):
            self._remove(key)

    def _delete_group(self, first_key_value: Any) -> List[T]:
        """Remove every item whose first primary-key field equals ``first_key_value``; returns them."""
        if len(self._primary_keys) > 1:
            group = self._groups.get(first_key_value, {})
            removed = list(group.values())
            for key in list(group):
                self._remove(key)
            return removed
        key = (first_key_value,)
        if key not in self._items:
            return []
        item = self._items[key]
        self._remove(key)
        return [item]


class DequeBasedQueue(Queue[T]):
    """A type-checked FIFO queue.

    Args:
        item_type: Type of the queued items.
        items: Initial content.
        id: Name of the queue (used in metrics).
        tracker: Optional metrics backend.
    """

    def __init__(
        self,
        item_type: Type[T],
        items: Optional[Sequence[T]] = None,
        id: Optional[str] = None,
        tracker: MetricsBackend | None = None,
    ) -> None:
        super().__init__(tracker=tracker, name=id or "queue")
        self._item_type = item_type
        self._items: Deque[T] = deque()
        self._counts: Dict[T, int] = {}
        if items:
            self._append(items)

    def item_type(self) -> Type[T]:
        return self._item_type

    def _check(self, item: Any) -> None:
        if not isinstance(item, self._item_type):
            raise TypeError(f"Expected {self._item_type.__name__}, got {type(item).__name__}")

    def _append(self, items: Sequence[T]) -> None:
        for item in items:
            self._check(item)
        for item in items:
            self._items.append(item)
            self._counts[item] = self._counts.get(item, 0) + 1

    @_tracked_operation("has")
    async def has(self, item: T) -> bool:
        self._check(item)
        return item in self._counts

    @_tracked_operation("enqueue")
    async def enqueue(self, items: Sequence[T]) -> Sequence[T]:
        self._append(items)
        return list(items)

    @_tracked_operation("dequeue")
    async def dequeue(self, limit: int = 1) -> Sequence[T]:
        popped: List[T] = []
        while len(popped) < limit and self._items:
            item = self._items.popleft()
            count = self._counts[item] - 1
            if count:
                self._counts[item] = count
            else:
                del self._counts[item]
            popped.append(item)
        return popped

    @_tracked_operation("peek")
    async def peek(self, limit: int = 1) -> Sequence[T]:
        if limit <= 0:
            return []
        return list(itertools.islice(self._items, limit))

    @_tracked_operation("size")
    async def size(self) -> int:
        return len(self._items)


class DictBasedKeyValue(KeyValue[K, V]):
    """A dict-backed key-value map.

    Args:
        data: Initial content (copied).
        id: Name of the map (used in metrics).
        tracker: Optional metrics backend.
        keeps: Which keys may be stored (all when ``None``): writing a key it refuses returns what writing a missing
            key would, and stores nothing.
    """

    def __init__(
        self,
        data: Optional[Mapping[K, V]] = None,
        id: Optional[str] = None,
        tracker: MetricsBackend | None = None,
        keeps: Optional[Callable[[K], bool]] = None,
    ) -> None:
        super().__init__(tracker=tracker, name=id or "key_value")
        self._data: Dict[K, V] = dict(data or {})
        self._keeps = keeps

    def _write(self, key: K, value: V) -> None:
        if self._keeps is None or self._keeps(key):
            self._data[key] = value

    @_tracked_operation("has")
    async def has(self, key: K) -> bool:
        return key in self._data

    @_tracked_operation("get")
    async def get(self, key: K, default: Optional[V] = None) -> Optional[V]:
        return self._data.get(key, default)

    @_tracked_operation("set")
    async def set(self, key: K, value: V) -> None:
        self._write(key, value)

    @_tracked_operation("inc")
    async def inc(self, key: K, amount: V) -> V:
        ensure_numeric(amount, description="Increment amount")
        current = self._data.get(key)
        value: Any = amount
        if current is not None:
            value = ensure_numeric(current, description=f"Value of {key!r}") + amount  # type: ignore[operator]
        self._write(key, value)
        return value  # type: ignore[no-any-return]

    @_tracked_operation("chmax")
    async def chmax(self, key: K, value: V) -> V:
        ensure_numeric(value, description="Value")
        current = self._data.get(key)
        if current is not None and ensure_numeric(current, description=f"Value of {key!r}") >= value:  # type: ignore[operator]
            return current
        self._write(key, value)
        return value

    @_tracked_operation("pop")
    async def pop(self, key: K, default: Optional[V] = None) -> Optional[V]:
        return self._data.pop(key, default)

    @_tracked_operation("size")
    async def size(self) -> int:
        return len(self._data)


# ---------------------------------------------------------------------------------------------------------------------
# Locks
# ---------------------------------------------------------------------------------------------------------------------


class _AsyncLockBase:
    """``async with`` over ``acquire``/``release``; a lock pickles as a new, free lock (held state stays local)."""

    async def acquire(self) -> None:
        raise NotImplementedError()

    def release(self) -> None:
        raise NotImplementedError()

    async def __aenter__(self) -> Self:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()

    def __getstate__(self) -> Dict[str, Any]:
        return {}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class _LoopAwareAsyncLock(_AsyncLockBase):
    """An asyncio lock usable from several event loops (one underlying lock per loop).

    Only coroutines of the same loop exclude each other; use :class:`_ThreadSafeAsyncLock` across threads.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()
        self._last: Tuple[Optional[asyncio.AbstractEventLoop], Optional[asyncio.Lock]] = (None, None)

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        last_loop, last_lock = self._last  # fast path: the loop that used the lock last
        if last_loop is loop and last_lock is not None:
            return last_lock
        with self._guard:
            lock = self._locks.get(loop)
            if lock is None:
                lock = asyncio.Lock()
                self._locks[loop] = lock
            self._last = (loop, lock)
        return lock

    async def acquire(self) -> None:
        """Wait for the lock of the running loop."""
        await self._lock().acquire()

    def release(self) -> None:
        """Release the lock of the running loop; ``RuntimeError`` when it is not held."""
        lock = self._lock()
        if not lock.locked():
            raise RuntimeError("Lock is not acquired")
        lock.release()

    def locked(self) -> bool:
        """Whether the running loop's lock is held."""
        return self._lock().locked()


class _ThreadSafeAsyncLock(_AsyncLockBase):
    """A lock excluding coroutines of any loop in any thread without blocking an event loop.

    Coroutines of the same loop queue fairly on a per-loop asyncio lock; the winner then takes a
    :class:`threading.Lock`, polling with a short backoff while another thread holds it (critical sections are short).
    """

    _MAX_BACKOFF = 0.005

    def __init__(self) -> None:
        self._loop_lock = _LoopAwareAsyncLock()
        self._thread_lock = threading.Lock()

    async def acquire(self) -> None:
        """Acquire the lock."""
        await self._loop_lock.acquire()
        try:
            delay = 0.0
            while not self._thread_lock.acquire(blocking=False):
                await asyncio.sleep(delay)
                delay = min(self._MAX_BACKOFF, max(delay * 2, 0.00005))
        except BaseException:
            self._loop_lock.release()
            raise

    def release(self) -> None:
        """Release the lock; ``RuntimeError`` when it is not held."""
        if not self._thread_lock.locked():
            raise RuntimeError("Lock is not acquired")
        self._thread_lock.release()
        self._loop_lock.release()

    def locked(self) -> bool:
        """Whether some coroutine holds the lock."""
        return self._thread_lock.locked()


AsyncLock = Union[_LoopAwareAsyncLock, _ThreadSafeAsyncLock]


class _AtomicSection:
    """Async context manager of one atomic section: acquires the given locks in order, yields the collections."""

    __slots__ = ("_acquired", "_collections", "_locks")

    def __init__(self, collections: InMemoryLightningCollections, locks: Sequence[AsyncLock]) -> None:
        self._collections = collections
        self._locks = locks
        self._acquired = 0

    async def __aenter__(self) -> InMemoryLightningCollections:
        try:
            for lock in self._locks:
                await lock.acquire()
                self._acquired += 1
        except BaseException:
            self._release()
            raise
        return self._collections

    async def __aexit__(self, *exc: Any) -> None:
        self._release()

    def _release(self) -> None:
        while self._acquired:
            self._acquired -= 1
            self._locks[self._acquired].release()


class InMemoryLightningCollections(LightningCollections):
    """Every store collection held in process memory, with one lock per atomic label.

    Args:
        lock_type: ``"asyncio"`` (coroutines of one thread) or ``"thread"`` (coroutines of any thread).
        tracker: Optional metrics backend.
    """

    def __init__(self, lock_type: Literal["thread", "asyncio"] = "asyncio", tracker: MetricsBackend | None = None):
        super().__init__(tracker=tracker)
        if lock_type not in ("thread", "asyncio"):
            raise ValueError(f"lock_type must be 'thread' or 'asyncio', got {lock_type!r}")
        self._lock_type = lock_type
        self._locks = self._make_locks()
        self._lock_orders: Dict[Tuple[str, ...], Tuple[AsyncLock, ...]] = {}
        self.rollouts = ListBasedCollection([], Rollout, ["rollout_id"], id="rollouts", tracker=tracker)
        self.attempts = ListBasedCollection([], Attempt, ["rollout_id", "attempt_id"], id="attempts", tracker=tracker)
        self.spans: ListBasedCollection[Span] = ListBasedCollection(
            [], Span, ["rollout_id", "attempt_id", "span_id"], id="spans", tracker=tracker
        )
        self.resources = ListBasedCollection([], ResourcesUpdate, ["resources_id"], id="resources", tracker=tracker)
        self.workers = ListBasedCollection([], Worker, ["worker_id"], id="workers", tracker=tracker)
        self.rollout_queue: DequeBasedQueue[str] = DequeBasedQueue(str, id="rollout_queue", tracker=tracker)
        self.span_sequence_ids: DictBasedKeyValue[str, int] = DictBasedKeyValue(
            id="span_sequence_ids", tracker=tracker, keeps=self.rollouts.holds
        )
        self._metrics = ListBasedCollection([], MetricsRecord, ["run_id", "step"], id="metrics", tracker=tracker)

    def _make_locks(self) -> Dict[str, AsyncLock]:
        factory = _ThreadSafeAsyncLock if self._lock_type == "thread" else _LoopAwareAsyncLock
        return {label: factory() for label in ALL_LABELS}

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_locks", None)
        state.pop("_lock_orders", None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._locks = self._make_locks()
        self._lock_orders = {}

    def atomic(
        self,
        *,
        mode: AtomicMode = "rw",
        snapshot: bool = False,
        commit: bool = False,
        labels: Optional[Sequence[AtomicLabels]] = None,
        **kwargs: Any,
    ) -> _AtomicSection:
        """Hold the locks of ``labels`` (all when empty) in sorted order.

        Plain reads take no lock with ``asyncio`` locks: no other coroutine runs while a read walks the collections, as
        reads do not await in between. With ``thread`` locks they take the locks like a write, since another thread
        may change a collection while a read walks it.

        ``rollout_ids`` (in ``kwargs``) is ignored: a section never waits on I/O while it holds its locks, so finer
        locks would save nothing.

        There is no rollback: a section that raises after mutating keeps its mutations, so callers validate
        before writing.
        """
        if mode == "r" and not snapshot and self._lock_type == "asyncio":
            return _AtomicSection(self, ())
        key = tuple(labels) if labels else ()
        locks = self._lock_orders.get(key)
        if locks is None:
            names = sorted(set(key)) if key else sorted(ALL_LABELS)
            unknown = [name for name in names if name not in self._locks]
            if unknown:
                raise ValueError(f"Unknown atomic label(s) {unknown}; use one of {list(ALL_LABELS)}")
            locks = tuple(self._locks[name] for name in names)
            self._lock_orders[key] = locks
        return _AtomicSection(self, locks)

    async def evict_spans_for_rollout(self, rollout_id: str) -> int:
        """Delete every span of a rollout; returns the number of spans removed."""
        return len(self.spans._delete_group(rollout_id))
