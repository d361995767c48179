"""What the SQL backends (SQLite, PostgreSQL) share: the table layout and the translation of filters and sorting.

Each collection is a table holding the item (``data``) plus copies of the fields used to filter and sort in indexed
columns, and an insertion ordinal ``ord``. Filters and sorting are translated to SQL with exactly the semantics of the
in-memory collections (same results for the same query, ties in insertion order); conditions SQL cannot express
identically (fields without a column, values of another type) are left to the in-memory predicate, applied to the
rows SQL pre-selected. The two backends differ only in a few spellings, gathered in :class:`SqlDialect`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Literal, Optional, Sequence, Tuple, Type, TypeVar, cast

from pydantic import BaseModel

from agentbolt.store.collection import memory
from agentbolt.store.collection.base import (
    Collection,
    DuplicatedPrimaryKeyError,
    FilterOptions,
    LightningCollections,
    SortOptions,
    normalize_filter_options,
    resolve_sort_options,
)
from agentbolt.types import Attempt, FilterField, MetricsRecord, ResourcesUpdate, Rollout, Span, Worker
from agentbolt.types.wire import encode_repairing

__all__ = [
    "Column",
    "TableSpec",
    "SqlDialect",
    "QueryPlan",
    "SqlQuery",
    "ROLLOUTS",
    "ATTEMPTS",
    "SPANS",
    "RESOURCES",
    "WORKERS",
    "METRICS",
    "TABLES",
    "ALL_TABLES",
    "set_table_collections",
    "rollout_stored_condition",
    "compile_filter",
    "order_clause",
    "memory_predicate",
    "format_key",
    "SqlTable",
]

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

ColumnType = Literal["TEXT", "INTEGER", "REAL"]


@dataclass(frozen=True)
class Column:
    """An indexed copy of one item field."""

    name: str
    sql_type: ColumnType
    nullable: bool = True


@dataclass(frozen=True)
class TableSpec:
    """The table of one collection."""

    table: str
    item_type: Type[BaseModel]
    primary_keys: Tuple[str, ...]
    columns: Tuple[Column, ...]
    """Indexed copies of item fields; the primary-key fields come first."""
    indexes: Tuple[Tuple[str, ...], ...] = ()

    def column(self, name: str) -> Optional[Column]:
        """The column holding field ``name``, if any."""
        for column in self.columns:
            if column.name == name:
                return column
        return None

    @property
    def column_names(self) -> Tuple[str, ...]:
        """Names of the field columns, in table order."""
        return tuple(column.name for column in self.columns)


def _text(name: str, nullable: bool = True) -> Column:
    return Column(name, "TEXT", nullable)


def _real(name: str) -> Column:
    return Column(name, "REAL", True)


ROLLOUTS = TableSpec(
    "rollouts",
    Rollout,
    ("rollout_id",),
    (
        _text("rollout_id", False),
        _text("status", False),
        _text("mode"),
        _text("resources_id"),
        _real("start_time"),
        _real("end_time"),
    ),
    (("status",),),
)
ATTEMPTS = TableSpec(
    "attempts",
    Attempt,
    ("rollout_id", "attempt_id"),
    (
        _text("rollout_id", False),
        _text("attempt_id", False),
        Column("sequence_id", "INTEGER", False),
        _text("status", False),
        _text("worker_id"),
        _real("start_time"),
        _real("end_time"),
        _real("last_heartbeat_time"),
    ),
    (("status",),),
)
SPANS = TableSpec(
    "spans",
    Span,
    ("rollout_id", "attempt_id", "span_id"),
    (
        _text("rollout_id", False),
        _text("attempt_id", False),
        _text("span_id", False),
        Column("sequence_id", "INTEGER", False),
        _text("trace_id", False),
        _text("parent_id"),
        _text("name", False),
        _real("start_time"),
        _real("end_time"),
    ),
    (("rollout_id", "sequence_id"),),
)
RESOURCES = TableSpec(
    "resources",
    ResourcesUpdate,
    ("resources_id",),
    (
        _text("resources_id", False),
        _real("create_time"),
        _real("update_time"),
        Column("version", "INTEGER", False),
    ),
    (("update_time",),),
)
WORKERS = TableSpec(
    "workers",
    Worker,
    ("worker_id",),
    (
        _text("worker_id", False),
        _text("status", False),
        _real("last_heartbeat_time"),
        _real("last_dequeue_time"),
        _real("last_busy_time"),
        _real("last_idle_time"),
        _text("current_rollout_id"),
        _text("current_attempt_id"),
    ),
)
TABLES: Tuple[TableSpec, ...] = (ROLLOUTS, ATTEMPTS, SPANS, RESOURCES, WORKERS)
"""The tables of the first schema version of each backend."""
METRICS = TableSpec(
    "metrics",
    MetricsRecord,
    ("run_id", "step"),
    (_text("run_id", False), Column("step", "INTEGER", False), _real("time")),
)
"""Training metrics (one record per algorithm step), added after the first schema version."""
ALL_TABLES: Tuple[TableSpec, ...] = (*TABLES, METRICS)
"""Every table a SQL backend keeps, one per collection of :class:`LightningCollections`."""


def set_table_collections(collections: LightningCollections, make: Callable[[TableSpec], Collection[Any]]) -> None:
    """Give ``collections`` its table collections, each ``make(spec)`` of its table in :data:`ALL_TABLES`.

    The SQL backends differ only in ``make``; the queue and the counters are theirs to set.
    """
    collections.rollouts = make(ROLLOUTS)
    collections.attempts = make(ATTEMPTS)
    collections.spans = make(SPANS)
    collections.resources = make(RESOURCES)
    collections.workers = make(WORKERS)
    collections._metrics = make(METRICS)


def rollout_stored_condition(placeholder: str, rollouts_table: str) -> str:
    """SQL condition "the rollout whose id is the parameter is stored", for ``rollouts_table`` as spelled in SQL.

    The SQL backends write a span sequence counter only under it, in the writing statement itself (see
    :attr:`~agentbolt.store.collection.base.LightningCollections.span_sequence_ids`).
    """
    return f"EXISTS (SELECT 1 FROM {rollouts_table} WHERE rollout_id = {placeholder})"


@dataclass(frozen=True)
class SqlDialect:
    """The spellings in which the SQL backends differ.

    Attributes:
        placeholder: Parameter marker (``?`` or ``%s``).
        contains: SQL of "text column contains the parameter" for a column name.
        within: ``(sql, params)`` of "column is one of the values" for a column name and a non-empty value list.
    """

    placeholder: str
    contains: Callable[[str], str]
    within: Callable[[str, List[Any]], Tuple[str, List[Any]]]


@dataclass
class QueryPlan:
    """The SQL ``WHERE`` clause of a filter."""

    where: str
    params: List[Any]
    exact: bool
    """True when ``where`` expresses the whole filter; otherwise rows still go through the in-memory predicate."""


def _same_kind(column: Column, value: Any) -> bool:
    """Whether SQL compares ``value`` with the column exactly like Python's ``==`` (no type coercion)."""
    if column.sql_type == "TEXT":
        return isinstance(value, str)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _compile_condition(dialect: SqlDialect, column: Column, op: str, value: Any) -> Optional[Tuple[str, List[Any]]]:
    """SQL for one ``field op value`` condition with the in-memory semantics, or None when SQL can't express it."""
    name = column.name
    if op == "exact":
        return (f"{name} = {dialect.placeholder}", [value]) if _same_kind(column, value) else None
    if op == "within":
        if not isinstance(value, (list, tuple, set, frozenset)):
            return None
        values = list(value)
        if not all(_same_kind(column, v) for v in values):
            return None
        if not values:
            return "1 = 0", []
        return dialect.within(name, values)
    if op == "contains":
        if column.sql_type == "TEXT" and isinstance(value, str):
            return dialect.contains(name), [value]
        return None
    return None


def _compile_conditions(
    dialect: SqlDialect, spec: TableSpec, fields: Optional[Dict[str, FilterField]]
) -> Tuple[List[str], List[Any], bool]:
    """SQL terms and parameters of each field condition, and whether every condition compiled to SQL."""
    terms: List[str] = []
    params: List[Any] = []
    exact = True
    for field, ops in (fields or {}).items():
        for op, value in ops.items():
            column = spec.column(field)
            compiled = _compile_condition(dialect, column, op, value) if column else None
            if compiled is None:
                exact = False
                continue
            terms.append(compiled[0])
            params.extend(compiled[1])
    return terms, params, exact


def compile_filter(
    dialect: SqlDialect,
    spec: TableSpec,
    filters: Optional[Dict[str, FilterField]],
    must: Optional[Dict[str, FilterField]],
    aggregate: Literal["and", "or"],
) -> QueryPlan:
    """The ``WHERE`` clause of normalised filters (see :func:`~agentbolt.store.collection.base.normalize_filter_options`)."""
    must_terms, params, exact = _compile_conditions(dialect, spec, must)
    terms, term_params, filters_exact = _compile_conditions(dialect, spec, filters)
    if filters_exact:
        if terms:
            joiner = " AND " if aggregate == "and" else " OR "
            must_terms.append("(" + joiner.join(terms) + ")")
            params.extend(term_params)
    else:
        exact = False
        if aggregate == "and" and terms:  # the compiled part still narrows the scan
            must_terms.append("(" + " AND ".join(terms) + ")")
            params.extend(term_params)
    return QueryPlan(" AND ".join(must_terms) if must_terms else "1 = 1", params, exact)


def order_clause(spec: TableSpec, sort_name: Optional[str], order: str) -> Optional[str]:
    """SQL ``ORDER BY`` with the in-memory rules, or None when the field has no column.

    Ties keep insertion order in both directions (Python's stable sort); ``*_time`` NULLs sort after every value
    (before, descending); other nullable columns are strings whose NULL sorts as ``""``.
    """
    if sort_name is None:
        return "ord"
    memory.sort_key_function(spec.item_type, sort_name)  # same validation (unknown field -> ValueError)
    column = spec.column(sort_name)
    if column is None:
        return None
    direction = "DESC" if order == "desc" else "ASC"
    if not column.nullable:
        return f"{column.name} {direction}, ord"
    if sort_name.endswith("_time"):
        return f"({column.name} IS NULL) {direction}, {column.name} {direction}, ord"
    assert column.sql_type == "TEXT", "nullable non-time columns are strings"
    return f"COALESCE({column.name}, '') {direction}, ord"


def memory_predicate() -> Callable[..., bool]:
    """The in-memory filter predicate: the single definition of filter semantics, used for what SQL can't express."""
    return memory._item_matches_filters  # looked up on each call, like the in-memory collections do


@dataclass
class SqlQuery:
    """One collection query, planned once for both SQL backends: the ``WHERE`` and ``ORDER BY`` SQL can run, and the
    in-memory rules that finish what SQL cannot express."""

    spec: TableSpec
    filters: Any
    must: Any
    aggregate: Any
    sort_name: Optional[str]
    order: str
    plan: QueryPlan
    order_sql: Optional[str]

    @classmethod
    def build(
        cls,
        dialect: SqlDialect,
        spec: TableSpec,
        filter: Optional[FilterOptions],
        sort: Optional[SortOptions],
        limit: int,
        offset: int,
    ) -> SqlQuery:
        """Plan a query (``limit``/``offset`` are validated like the in-memory collections do)."""
        filters, must, aggregate = normalize_filter_options(filter)
        sort_name, order = resolve_sort_options(sort)
        plan = compile_filter(dialect, spec, filters, must, aggregate)
        order_sql = order_clause(spec, sort_name, order)
        memory.paginate([], limit, offset)
        return cls(spec, filters, must, aggregate, sort_name, order, plan, order_sql)

    @property
    def in_sql(self) -> bool:
        """Whether SQL expresses the whole query (filter and order), pagination included."""
        return self.plan.exact and self.order_sql is not None

    def finish(self, items: List[Any], limit: int, offset: int, raw: bool) -> Tuple[List[Any], int]:
        """Filter (what SQL could not), sort and paginate the decoded ``items`` SQL narrowed down, in memory.

        Returns:
            The page (each item as JSON when ``raw``) and the number of matches.
        """
        if not self.plan.exact:
            matches = memory_predicate()
            items = [item for item in items if matches(item, self.filters, self.aggregate, self.must)]
        if self.sort_name is not None:
            memory.sort_items(items, self.spec.item_type, self.sort_name, "desc" if self.order == "desc" else "asc")
        page = memory.paginate(items, limit, offset)
        return ([item.model_dump_json().encode() for item in page] if raw else page), len(items)


def format_key(names: Sequence[str], values: Sequence[Any]) -> str:
    """``name='value', ...`` of a primary key, for error messages."""
    return ", ".join(f"{name}={value!r}" for name, value in zip(names, values, strict=True))


class SqlTable(Collection[M], Generic[M]):
    """What a SQL collection knows of its table: names, keys, the checks made before any statement runs, and reads.

    A backend provides :meth:`_query_page`; :meth:`query`, :meth:`query_json` and :meth:`get` are built on it.
    """

    _dialect: SqlDialect
    """How the backend spells what differs between SQL databases."""

    def __init__(self, spec: TableSpec, table: str) -> None:
        """Build the statements every SQL backend writes alike, for ``table`` (the name as the statements spell it,
        schema-qualified where the backend needs it) laid out as ``spec``."""
        self._spec = spec
        self._table = table
        ph = self._dialect.placeholder
        self._names = spec.column_names
        self._non_pk = [name for name in self._names if name not in spec.primary_keys]
        self._pk_where = " AND ".join(f"{key} = {ph}" for key in spec.primary_keys)
        self._update_sql = (
            f"UPDATE {table} SET "
            + ", ".join(f"{name} = {ph}" for name in [*self._non_pk, "data"])
            + f" WHERE {self._pk_where}"
        )
        self._insert_head = f"INSERT INTO {table} ({', '.join(self._names)}, data) VALUES "
        """The ``INSERT`` up to its rows; one row's values are :attr:`_row_placeholders`."""
        self._row_placeholders = "(" + ", ".join([ph] * (len(self._names) + 1)) + ")"
        self._insert_sql = self._insert_head + self._row_placeholders
        self._conflict = ", ".join(spec.primary_keys)
        assignments = ", ".join(f"{name} = excluded.{name}" for name in [*self._non_pk, "data"])
        self._replace_sql = f"{self._insert_sql} ON CONFLICT ({self._conflict}) DO UPDATE SET {assignments}"
        """Insert one row, or replace every column of the stored one with the same key."""

    def _encode_row(self, item: M) -> List[Any]:
        """The values of ``item``'s row: its column values in column order, then its payload.

        Raises:
            UnicodeEncodeError, pydantic_core.PydanticSerializationError: a string has no UTF-8 form, or a value is
                not JSON.
        """
        raise NotImplementedError()

    def _row(self, item: M) -> List[Any]:
        """The values of ``item``'s row (see :meth:`_encode_row`), the item repaired if it must be to be stored."""
        return self._repairing(self._encode_row, item)

    def _repairing(self, encode: Callable[[M], R], item: M) -> R:
        """``encode(item)``, or ``encode`` of the item repaired when a string of it has no UTF-8 form.

        Strings holding lone surrogates (bytes decoded with ``errors="surrogateescape"``, half of an escaped emoji) fit
        in no UTF-8 column. Rather than refusing the item, it is stored with U+FFFD in their place and a warning is
        logged (:func:`~agentbolt.types.wire.encode_repairing`), as the HTTP client does before sending: what an
        in-memory store keeps as written, a durable store keeps repaired.
        """
        return encode_repairing(encode, item, f"A {self._spec.item_type.__name__} item")

    @staticmethod
    def _merge(existing: M, item: M, update_fields: Sequence[str]) -> M:
        """``existing`` with the ``update_fields`` of ``item`` written over it."""
        return existing.model_copy(update={name: getattr(item, name) for name in update_fields})

    def _update_params(self, row: Sequence[Any], key: Sequence[Any]) -> List[Any]:
        """Parameters of :attr:`_update_sql` writing the encoded ``row`` (see ``_row``) to the item with ``key``."""
        values = [value for name, value in zip(self._names, row, strict=False) if name not in self._spec.primary_keys]
        return [*values, row[-1], *key]

    def primary_keys(self) -> Sequence[str]:
        """Primary-key field names."""
        return list(self._spec.primary_keys)

    def item_type(self) -> Type[M]:
        """The stored pydantic model."""
        return cast(Type[M], self._spec.item_type)

    def _check_items(self, items: Sequence[M], *, unique: bool = False) -> None:
        """Reject items of another type and, with ``unique``, items repeating a primary key among themselves."""
        for item in items:
            if not isinstance(item, self._spec.item_type):
                raise TypeError(f"{self._spec.table} stores {self._spec.item_type.__name__}, got {type(item).__name__}")
        if unique:
            self._check_unique(items)

    def _check_unique(self, items: Sequence[M]) -> None:
        seen: set[Tuple[Any, ...]] = set()
        for item in items:
            key = self._key(item)
            if key in seen:
                raise DuplicatedPrimaryKeyError(
                    f"Duplicated primary key(s) in the inserted items: {format_key(self._spec.primary_keys, key)}"
                )
            seen.add(key)

    def _check_update_fields(self, update_fields: Optional[Sequence[str]]) -> None:
        for name in update_fields or ():
            if name not in self._spec.item_type.model_fields:
                raise ValueError(f"Unknown field {name!r} for {self._spec.item_type.__name__}")

    def _key(self, item: M) -> Tuple[Any, ...]:
        return tuple(getattr(item, k) for k in self._spec.primary_keys)

    def _missing(self, key: Sequence[Any]) -> ValueError:
        return ValueError(memory.missing_item_message(dict(zip(self._spec.primary_keys, key, strict=True))))

    def _exists_error(self, key: Sequence[Any]) -> DuplicatedPrimaryKeyError:
        return DuplicatedPrimaryKeyError(
            f"Item already exists with primary key(s): {format_key(self._spec.primary_keys, key)}"
        )

    async def _query_page(
        self, query: SqlQuery, limit: int, offset: int, raw: bool, count: bool
    ) -> Tuple[List[Any], int]:
        """The page of ``query`` (each item as JSON bytes when ``raw``) and the number of matches (when ``count``)."""
        raise NotImplementedError()

    async def _page(
        self, filter: Optional[FilterOptions], sort: Optional[SortOptions], limit: int, offset: int, raw: bool = False
    ) -> Tuple[List[Any], int]:
        """Plan the query (checking ``limit`` and ``offset``) and read its page."""
        query = SqlQuery.build(self._dialect, self._spec, filter, sort, limit, offset)
        return await self._query_page(query, limit, offset, raw, count=True)

    async def _first(self, filter: Optional[FilterOptions], sort: Optional[SortOptions]) -> Optional[M]:
        """The first matching item, read without counting the matches (a statement of its own)."""
        query = SqlQuery.build(self._dialect, self._spec, filter, sort, 1, 0)
        items, _ = await self._query_page(query, 1, 0, raw=False, count=False)
        return items[0] if items else None
