"""Collections stored in PostgreSQL: shared by every process and machine that connects, durable, concurrent.

Layout (all tables in one schema, ``agentbolt`` by default, so that several stores can share a database):

* ``schema_migrations``: the versioned migrations applied so far. The store applies the missing ones when it
  opens (under an advisory lock, so processes opening together do not race) and refuses a schema written by a
  newer version.
* one table per collection (``rollouts``, ``attempts``, ``spans``, ``resources``, ``workers``). Each row holds the
  fields used to filter and sort in indexed columns (see :mod:`agentbolt.store.collection.sql`), an insertion
  ordinal ``ord``, and the rest of the item as ``json`` text in ``data`` (written as pydantic serialized it, so
  keys keep their order and strings may hold NUL; migrations 1 and 2 created ``jsonb``, which migration 3
  converts): fields held by a column are not repeated in the payload, so a span costs its attributes plus a few
  bytes.
* ``rollout_queue``: FIFO of rollout ids; positions only grow. ``span_sequence_ids``: per-rollout counters.
  ``store_meta``: timestamps of periodic work shared by all processes (the watchdog's last scan).
* Triggers send ``NOTIFY`` on the schema's channel when a rollout reaches a terminal status (payload
  ``f:<rollout_id>``) and when rollouts are queued (payload ``q``), inside the writing transaction: waiters in every
  process wake when the change commits, without polling.

Connections and transactions: one psycopg connection pool per process and event loop. An atomic read-write
section runs in one transaction on one connection and first takes a transaction-scoped advisory lock per label
(sorted, so sections never deadlock); sections touching the same labels therefore run one after the other in every
process, exactly like the in-memory collections' per-label locks in one process. A section given the rollouts it
touches (``rollout_ids``, :meth:`PostgresLightningCollections.lock_rollouts` for those it finds as it goes, and the
rollouts a dequeue claims, locked by the claim) takes its label locks shared and a lock per rollout (in key order), so
sections on different rollouts run side by side. Plain read
sections use one connection without a transaction and see the last committed state; snapshot reads run in a read-only
``REPEATABLE READ`` transaction. A section that raises is rolled back; a section whose connection is lost before its
commit raises :class:`PostgresUnavailableError` (nothing was applied, the call can be retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import math
import os
import re
import threading
import time
import weakref
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Generic,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    TypeVar,
    cast,
)

from pydantic import BaseModel

from agentbolt.store.collection.base import (
    AtomicLabels,
    AtomicMode,
    Collection,
    KeyValue,
    LightningCollections,
    Queue,
    StorageOutcomeUnknownError,
    StorageUnavailableError,
    TrackedCollection,
    ensure_numeric,
)
from agentbolt.store.collection.sql import (
    METRICS,
    TABLES,
    SqlDialect,
    SqlQuery,
    SqlTable,
    TableSpec,
    rollout_stored_condition,
    set_table_collections,
)
from agentbolt.types.wire import decode_json
from agentbolt.utils.imports import import_extra

__all__ = [
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "Migration",
    "PostgresStoreError",
    "PostgresConnectionError",
    "PostgresPermissionError",
    "PostgresSchemaVersionError",
    "PostgresUnavailableError",
    "PostgresCommitUnknownError",
    "PostgresCollection",
    "PostgresQueue",
    "PostgresCounters",
    "PostgresLightningCollections",
    "redact_dsn",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

_ALL_LABELS: Tuple[AtomicLabels, ...] = (
    "attempts",
    "generic",
    "resources",
    "rollout_queue",
    "rollouts",
    "span_sequence_ids",
    "spans",
    "workers",
)
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,52}")
"""Valid schema names (matched whole): the notification channel ``agentbolt:<schema>`` must fit PostgreSQL's 63-byte
identifiers."""
_MAX_ROWS_PER_STATEMENT = 1000
"""Rows per multi-row ``INSERT`` (PostgreSQL accepts at most 65,535 parameters per statement)."""


def _psycopg() -> Any:
    return import_extra("psycopg", feature="The PostgreSQL store", extra="postgres", note="psycopg 3 with its pool")


# ----------------------------------------------------------------------------------------------------------------
# Errors


class PostgresStoreError(RuntimeError):
    """The PostgreSQL store cannot be used; the message names the database (without its password)."""


class PostgresConnectionError(PostgresStoreError):
    """The database cannot be reached or refuses the connection (wrong host, port, database, user or password)."""


class PostgresPermissionError(PostgresStoreError):
    """The database role lacks a privilege the store needs (creating its schema and tables, reading, writing)."""


class PostgresSchemaVersionError(PostgresStoreError):
    """The schema was written by a newer version of agentbolt (a migration this version does not know)."""


class PostgresUnavailableError(PostgresStoreError, StorageUnavailableError):
    """The connection to the database failed before the operation committed: nothing was applied (retry later)."""


class PostgresCommitUnknownError(PostgresStoreError, StorageOutcomeUnknownError):
    """The connection failed while committing: the operation may or may not have been applied."""


_URI_PASSWORD = re.compile(r"(://[^:/@\s]*:)(\S*)@")
"""The password of a URI (``postgresql://user:password@host/...``), up to the URI's last ``@``: a password written
with an unescaped ``@`` (or ``/``) is hidden whole, though libpq reads its rest as the host."""
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"]+)", re.IGNORECASE)
"""A ``password=value`` pair of a key-value string or of a URI's query."""


def _dsn_passwords(dsn: str) -> Set[str]:
    """The passwords ``dsn`` holds, as written and as libpq reads them (even where libpq cannot parse ``dsn``)."""
    from urllib.parse import unquote

    found = {m.group(2) for pattern in (_URI_PASSWORD, _KEYWORD_PASSWORD) for m in pattern.finditer(dsn)}
    found |= {unquote(password.strip("'")) for password in found}
    with suppress(Exception):
        from psycopg.conninfo import conninfo_to_dict

        found.add(str(conninfo_to_dict(dsn).get("password") or ""))
    # libpq's reading of a password with an unescaped "@" is a part of the whole one, which hides it already; replacing
    # that part on its own would also cut it out of words of the message ("p" of "postgresql").
    return {p for p in found if p and not any(p != other and p in other for other in found)}


def _redact(text: str, dsn: str) -> str:
    """``text`` (a message about ``dsn``, e.g. libpq's, which may quote it) without the passwords of ``dsn``."""
    text = _KEYWORD_PASSWORD.sub(r"\1***", _URI_PASSWORD.sub(r"\1***@", text))
    for password in sorted(_dsn_passwords(dsn), key=len, reverse=True):
        text = text.replace(password, "***")
    return text


def redact_dsn(dsn: str) -> str:
    """``dsn`` without its password, for messages and logs."""
    written = _URI_PASSWORD.search(dsn)
    if written is not None and "@" in written.group(2):  # libpq would show the password's rest as the host
        return _redact(dsn, dsn)
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
    except Exception:
        return _redact(dsn, dsn)
    if "password" in params:
        params["password"] = "***"
    return make_conninfo(**params)  # type: ignore[arg-type]


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", None) or "")


def _is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection (or the server) went away, as opposed to a problem with the request."""
    psycopg = _psycopg()
    from psycopg_pool import PoolTimeout

    if isinstance(exc, PoolTimeout):
        return True
    state = _sqlstate(exc)
    # 08: connection exception; 57P: operator intervention (shutdown, restart); 40001/40P01: the transaction was
    # aborted by a serialization failure or a deadlock (rolled back, safe to retry).
    if state.startswith("08") or state.startswith("57P") or state in ("40001", "40P01"):
        return True
    return isinstance(exc, psycopg.OperationalError) and not state


# ----------------------------------------------------------------------------------------------------------------
# Schema and migrations


@dataclass(frozen=True)
class Migration:
    """One step of the schema's history: applied once, in order, in one transaction."""

    version: int
    description: str
    statements: Tuple[str, ...]


_PG_TYPES = {"TEXT": "text", "INTEGER": "bigint", "REAL": "double precision"}
_FINISHED = "('succeeded', 'failed', 'cancelled')"


def _table_statements(spec: TableSpec) -> List[str]:
    columns = ", ".join(f"{c.name} {_PG_TYPES[c.sql_type]}{'' if c.nullable else ' NOT NULL'}" for c in spec.columns)
    statements = [
        f"CREATE TABLE {spec.table} (ord bigint GENERATED ALWAYS AS IDENTITY, {columns}, data jsonb NOT NULL, "
        f"PRIMARY KEY ({', '.join(spec.primary_keys)}))",
        f"CREATE INDEX {spec.table}_ord ON {spec.table} (ord)",
    ]
    for index in spec.indexes:
        statements.append(f"CREATE INDEX {spec.table}_{'_'.join(index)} ON {spec.table} ({', '.join(index)}, ord)")
    return statements


def _initial_statements() -> Tuple[str, ...]:
    statements: List[str] = []
    for spec in TABLES:
        statements.extend(_table_statements(spec))
    statements += [
        # Query routes: rollouts by start time (dashboards), attempts by sequence (latest attempt).
        "CREATE INDEX rollouts_start_time ON rollouts (start_time, ord)",
        "CREATE INDEX attempts_latest ON attempts (rollout_id, sequence_id)",
        "CREATE INDEX workers_status ON workers (status, ord)",
        "CREATE TABLE rollout_queue (pos bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item text NOT NULL)",
        "CREATE INDEX rollout_queue_item ON rollout_queue (item)",
        "CREATE TABLE span_sequence_ids (key text PRIMARY KEY, value bigint NOT NULL)",
        "CREATE TABLE store_meta (key text PRIMARY KEY, value double precision NOT NULL)",
        # Wake-ups: NOTIFY is transactional, so waiters learn about a change exactly when it commits.
        "CREATE FUNCTION notify_rollout_finished() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM pg_notify('agentbolt:' || TG_TABLE_SCHEMA, 'f:' || NEW.rollout_id); RETURN NULL; END $$",
        "CREATE TRIGGER rollouts_finished AFTER INSERT OR UPDATE OF status ON rollouts FOR EACH ROW "
        f"WHEN (NEW.status IN {_FINISHED}) EXECUTE FUNCTION notify_rollout_finished()",
        "CREATE FUNCTION notify_rollouts_queued() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "PERFORM pg_notify('agentbolt:' || TG_TABLE_SCHEMA, 'q'); RETURN NULL; END $$",
        "CREATE TRIGGER rollouts_queued AFTER INSERT ON rollout_queue FOR EACH STATEMENT "
        "EXECUTE FUNCTION notify_rollouts_queued()",
    ]
    return tuple(statements)


def _payloads_as_json_statements() -> Tuple[str, ...]:
    """``jsonb`` reorders object keys and cannot hold NUL characters; ``json`` keeps the text as written."""
    return tuple(
        f"ALTER TABLE {spec.table} ALTER COLUMN data TYPE json USING data::json" for spec in (*TABLES, METRICS)
    )


MIGRATIONS: Tuple[Migration, ...] = (
    Migration(1, "initial layout", _initial_statements()),
    Migration(2, "training metrics", tuple(_table_statements(METRICS))),
    Migration(3, "payloads as json text, keeping key order and NUL characters", _payloads_as_json_statements()),
)
"""Every migration, oldest first. A new layout is a new entry here; existing entries never change."""

SCHEMA_VERSION = MIGRATIONS[-1].version
"""Version of the layout this module reads and writes."""


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _lock_key(*parts: str) -> int:
    """A 64-bit advisory lock key for ``parts``, stable across processes: the first 8 bytes of the SHA-256 of
    ``agentbolt:<parts joined by ":">`` (UTF-8), read as a signed big-endian integer.

    PostgreSQL computes the same key with :func:`_lock_key_sql`, so that a statement can lock rows it finds.
    """
    digest = hashlib.sha256(":".join(("agentbolt", *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _lock_key_sql(text: str) -> str:
    """SQL computing :func:`_lock_key` in PostgreSQL from ``text``, an SQL expression of the joined text."""
    return f"('x' || encode(substring(sha256(convert_to({text}, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint"


def _schema_version(conn: Any, schema: str) -> int:
    """The last migration applied to ``schema`` (0 when it or its ``schema_migrations`` table is missing).

    Reads only: a role that may read and write the tables but not create any opens an up-to-date schema.
    """
    table = f"{_quote(schema)}.schema_migrations"
    (present,) = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    if not present:
        return 0
    row = conn.execute(f"SELECT max(version) FROM {table}").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _create_schema(conn: Any, schema: str) -> None:
    """Create ``schema`` (when missing) and its ``schema_migrations`` table."""
    quoted = _quote(schema)
    # CREATE SCHEMA IF NOT EXISTS would still need the CREATE privilege on the database, which a role given a
    # schema made for it lacks.
    if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        conn.execute(f"CREATE SCHEMA {quoted}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {quoted}.schema_migrations (version integer PRIMARY KEY, "
        "description text NOT NULL, applied_at double precision NOT NULL)"
    )


def apply_migrations(dsn: str, schema: str, connect_timeout: float) -> int:
    """Create the schema when missing and apply the migrations it lacks; returns the version found before.

    Raises:
        PostgresConnectionError: The database cannot be reached or refuses the connection.
        PostgresPermissionError: The role may not create the schema or its tables.
        PostgresSchemaVersionError: The schema was written by a newer version.
    """
    psycopg = _psycopg()
    where = redact_dsn(dsn)
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout)))
    except psycopg.Error as exc:
        raise PostgresConnectionError(f"Cannot connect to PostgreSQL ({where}): {_one_line(exc, dsn)}") from exc
    quoted = _quote(schema)
    try:
        with conn:
            # Several processes may open the store at once: one applies the migrations, the others wait.
            conn.execute("SELECT pg_advisory_lock(%s)", (_lock_key(schema, "migrations"),))
            try:
                found = _schema_version(conn, schema)
                if found > SCHEMA_VERSION:
                    raise PostgresSchemaVersionError(
                        f"Schema {schema!r} of {where} was written by a newer version of agentbolt (schema version "
                        f"{found}); this version knows versions up to {SCHEMA_VERSION}. Upgrade agentbolt."
                    )
                for migration in MIGRATIONS:
                    if migration.version <= found:
                        continue
                    logger.info(
                        "Applying migration %d (%s) to schema %s", migration.version, migration.description, schema
                    )
                    started = time.monotonic()
                    with conn.transaction():
                        if found == 0 and migration is MIGRATIONS[0]:
                            # In the first migration's transaction: a migration that fails leaves nothing behind.
                            _create_schema(conn, schema)
                        conn.execute(f"SET LOCAL search_path TO {quoted}")
                        for statement in migration.statements:
                            conn.execute(statement)
                        conn.execute(
                            "INSERT INTO schema_migrations (version, description, applied_at) VALUES (%s, %s, %s)",
                            (migration.version, migration.description, time.time()),
                        )
                    logger.info("Applied migration %d in %.1f s", migration.version, time.monotonic() - started)
                return found
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(schema, "migrations"),))
    except PostgresStoreError:
        raise
    except psycopg.errors.InsufficientPrivilege as exc:
        raise PostgresPermissionError(
            f"The database role lacks a privilege the store needs on schema {schema!r} of {where}: "
            f"{_one_line(exc, dsn)}. Grant it CREATE on the database (or create the schema for it and grant ALL on it)."
        ) from exc
    except psycopg.Error as exc:
        if _is_connection_failure(exc):
            raise PostgresConnectionError(
                f"Lost the connection to PostgreSQL ({where}): {_one_line(exc, dsn)}"
            ) from exc
        raise PostgresStoreError(f"Cannot prepare schema {schema!r} of {where}: {_one_line(exc, dsn)}") from exc


def _ensure_integer(value: Any, description: str) -> int:
    """``value`` if it is an integer (not a boolean), else a ``TypeError`` naming ``description``."""
    ensure_numeric(value, description=description)
    if not isinstance(value, int):
        raise TypeError(f"{description} must be an integer, got {type(value).__name__}")
    return value


def _one_line(exc: BaseException, dsn: str) -> str:
    """The message of ``exc`` on one line, without the passwords of ``dsn`` (libpq's messages may quote it)."""
    return _redact(" ".join(str(exc).split()), dsn) or type(exc).__name__


# ----------------------------------------------------------------------------------------------------------------
# Connections, sections


def _check_utf8(values: Sequence[Any]) -> None:
    """Raise ``UnicodeEncodeError`` when a string among ``values`` has no UTF-8 form (psycopg would, later)."""
    for value in values:
        if isinstance(value, str) and not value.isascii():
            value.encode("utf-8")


class _RawJson:
    """JSON text serialized by pydantic, passed to a ``json`` parameter without re-encoding."""

    __slots__ = ("data",)

    def __init__(self, text: str) -> None:
        self.data = text.encode()


def _configure_adapters(context: Any) -> None:
    """psycopg adapters of a connection: JSON parsed by :func:`decode_json` (integers stay exact),
    :class:`_RawJson` sent as it is."""
    from psycopg.adapt import Dumper
    from psycopg.types.json import set_json_loads

    class RawJsonDumper(Dumper):
        oid = context.adapters.types["json"].oid

        def dump(self, obj: _RawJson) -> bytes:
            return obj.data

    context.adapters.register_dumper(_RawJson, RawJsonDumper)
    set_json_loads(decode_json, context)


class _Section:
    """The connection of the atomic section running in the current task."""

    __slots__ = ("conn", "owner", "rollout_keys", "writes")

    def __init__(self, owner: _Database, conn: Any, writes: bool, rollout_keys: Optional[Set[int]] = None) -> None:
        self.owner = owner
        self.conn = conn
        self.writes = writes
        self.rollout_keys = rollout_keys
        """The lock keys of the rollouts the section holds, when it holds its labels shared and each rollout it
        touches exclusively; ``None`` for other sections."""


_current_section: contextvars.ContextVar[Optional[_Section]] = contextvars.ContextVar(
    "agentbolt_postgres_section", default=None
)


@dataclass(frozen=True)
class _ConnectionSettings:
    """Where and how a process connects: all that a copy of the store in another process needs."""

    dsn: str
    schema: str
    pool_min_size: int
    pool_max_size: int
    pool_timeout: float
    connect_timeout: float

    @property
    def connect_timeout_seconds(self) -> int:
        """``connect_timeout`` as libpq takes it: whole seconds, at least 1."""
        return max(1, round(self.connect_timeout))


@dataclass
class _LoopPool:
    """The connection pool of one event loop, and the connections it opened (to close them once the loop is gone)."""

    loop: weakref.ref[asyncio.AbstractEventLoop]
    pool: Any
    connections: weakref.WeakSet[Any]

    def serves(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether this is ``loop``'s pool (a finished loop's id may be given to a new loop)."""
        return self.loop() is loop

    @property
    def loop_finished(self) -> bool:
        """Whether the pool's event loop is closed or gone: the pool can no longer be used or closed normally."""
        loop = self.loop()
        return loop is None or loop.is_closed()

    def close_without_loop(self) -> None:
        """Close the pool's connections without its event loop (libpq closes each socket at once)."""
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.pgconn.finish()


class _Database:
    """Connection pools (one per process and event loop), atomic sections, and the notification listener.

    The pool of an event loop that finished (a thread's loop, an ``asyncio.run`` per call) is closed when the next
    pool is opened, so successive loops do not hold connections until the server refuses more.
    """

    def __init__(self, settings: _ConnectionSettings) -> None:
        self.settings = settings
        self.dsn = settings.dsn
        self.schema = settings.schema
        self.where = redact_dsn(settings.dsn)
        self.channel = f"agentbolt:{settings.schema}"
        self._pools: Dict[Tuple[int, int], _LoopPool] = {}
        self._pools_lock = threading.Lock()
        self._label_locks = {label: _lock_key(settings.schema, "label", label) for label in _ALL_LABELS}
        self._closed = False
        self._listener: Optional[_Listener] = None
        self._background: Set[asyncio.Future[None]] = set()
        self.on_notification: Optional[Callable[[str], None]] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"settings": self.settings}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["settings"])  # type: ignore[misc]

    # -- pools -------------------------------------------------------------------------------------------------

    async def pool(self) -> Any:
        """The pool of this process and event loop, opened on first use."""
        if self._closed:
            raise PostgresStoreError(f"The store is closed ({self.where})")
        loop = asyncio.get_running_loop()
        pid = os.getpid()
        key = (pid, id(loop))
        entry = self._pools.get(key)
        if entry is not None and entry.serves(loop):
            return entry.pool
        from psycopg_pool import AsyncConnectionPool

        connections: weakref.WeakSet[Any] = weakref.WeakSet()

        async def configure(conn: Any) -> None:
            _configure_adapters(conn)
            connections.add(conn)

        settings = self.settings
        pool = AsyncConnectionPool(
            settings.dsn,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout,
            kwargs={"autocommit": True, "connect_timeout": settings.connect_timeout_seconds},
            configure=configure,
            open=False,
            name=f"agentbolt-{self.schema}",
        )
        with self._pools_lock:
            entry = self._pools.get(key)
            if entry is not None and entry.serves(loop):
                return entry.pool
            # A pool inherited through fork belongs to the parent: never touch its connections.
            finished = [k for k, other in self._pools.items() if k[0] == pid and other.loop_finished]
            stale = [self._pools.pop(k) for k in finished]
            self._pools[key] = _LoopPool(weakref.ref(loop), pool, connections)
        for other in stale:
            other.close_without_loop()
        await pool.open(wait=False)
        return pool

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection (autocommit) for the body."""
        pool = await self.pool()
        try:
            async with pool.connection() as conn:
                yield conn
        except BaseException as exc:
            if _is_connection_failure(exc):
                task = asyncio.ensure_future(_check_pool(pool))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                raise PostgresUnavailableError(
                    f"PostgreSQL is unavailable ({self.where}): {_one_line(exc, self.dsn)}; nothing was applied"
                ) from exc
            if isinstance(exc, _psycopg().DataError) and "NUL" in str(exc):
                raise ValueError(
                    "PostgreSQL cannot hold the NUL character (0x00) in ids, names and the other indexed text "
                    f"fields; nothing was applied ({_one_line(exc, self.dsn)})"
                ) from exc
            raise

    async def close(self) -> None:
        """Close this process's pools and the listener."""
        self._closed = True
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        with self._pools_lock:
            pools, self._pools = self._pools, {}
        pid = os.getpid()
        current = asyncio.get_running_loop()
        for (owner_pid, _), entry in pools.items():
            if owner_pid != pid:
                continue  # a pool inherited through fork belongs to the parent: never touch its connections
            loop = entry.loop()
            if loop is current:
                await entry.pool.close()
            elif loop is not None and loop.is_running():
                future = asyncio.run_coroutine_threadsafe(entry.pool.close(), loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=10.0)
                except Exception as exc:
                    logger.debug("Could not close a pool of another event loop: %s", _one_line(exc, self.dsn))
                    entry.close_without_loop()
            else:
                entry.close_without_loop()

    # -- sections ----------------------------------------------------------------------------------------------

    def rollout_lock_key(self, rollout_id: str) -> int:
        """The advisory lock key of a rollout."""
        return _lock_key(self.schema, "rollout", rollout_id)

    def rollout_lock_key_sql(self, column: str) -> str:
        """SQL computing :meth:`rollout_lock_key` of the rollout id in ``column``."""
        # The schema name is letters, digits and underscores (checked when the collections are built).
        return _lock_key_sql(f"'agentbolt:{self.schema}:rollout:' || {column}")

    def lock_statement(self, labels: Optional[Sequence[AtomicLabels]], rollout_keys: Optional[Set[int]] = None) -> str:
        """``SELECT`` taking the advisory locks of ``labels`` (all labels when empty), in a fixed order.

        With ``rollout_keys`` (possibly empty: the section only creates rollouts), the labels are locked shared and
        each rollout exclusively (label locks first, then the rollouts in key order, so sections never deadlock):
        sections on different rollouts run side by side, while a section locking a whole label excludes them all.
        """
        chosen = sorted(set(labels)) if labels else list(_ALL_LABELS)
        if rollout_keys is None:
            calls = [f"pg_advisory_xact_lock({self._label_locks[label]})" for label in chosen]
        else:
            calls = [f"pg_advisory_xact_lock_shared({self._label_locks[label]})" for label in chosen]
            calls += [f"pg_advisory_xact_lock({key})" for key in sorted(rollout_keys)]
        return f"SELECT {', '.join(calls)}"

    async def lock_rollouts(self, rollout_ids: Sequence[str]) -> None:
        """Lock the rollouts among ``rollout_ids`` that the current section does not hold yet, in key order, if it
        locks rollouts one by one (see ``lock_statement``).

        A section holding rollouts already that waits here for one of a lower key could deadlock with a section
        holding that one and waiting for one of its own (PostgreSQL then aborts one of the two): a dequeue's claim
        locks the rollouts it claims itself, without such waits (:meth:`PostgresQueue.dequeue`).
        """
        section = self.current()
        if section is None or section.rollout_keys is None:
            return
        keys = {self.rollout_lock_key(rollout_id) for rollout_id in rollout_ids} - section.rollout_keys
        if keys:
            await section.conn.execute(f"SELECT {', '.join(f'pg_advisory_xact_lock({key})' for key in sorted(keys))}")
            section.rollout_keys.update(keys)

    @asynccontextmanager
    async def section(
        self,
        *,
        writes: bool,
        snapshot: bool,
        labels: Optional[Sequence[AtomicLabels]],
        rollout_ids: Optional[Sequence[str]] = None,
    ) -> AsyncIterator[_Section]:
        """Bind one connection to the current task for the body: a locked transaction, a snapshot, or plain reads."""
        async with self.connection() as conn:
            rollout_keys = None
            if writes and rollout_ids is not None:
                rollout_keys = {self.rollout_lock_key(rollout_id) for rollout_id in rollout_ids}
            section = _Section(self, conn, writes, rollout_keys)
            if not writes and not snapshot:
                token = _current_section.set(section)
                try:
                    yield section
                finally:
                    _current_section.reset(token)
                return
            begin = (
                f"BEGIN; {self.lock_statement(labels, rollout_keys)}"
                if writes
                else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            )
            await conn.execute(begin)
            token = _current_section.set(section)
            try:
                yield section
            except BaseException:
                _current_section.reset(token)
                try:
                    await conn.execute("ROLLBACK")
                except Exception as rollback_error:  # the connection is gone: the server rolls back by itself
                    logger.debug("Rollback on %s failed: %s", self.where, _one_line(rollback_error, self.dsn))
                raise
            _current_section.reset(token)
            try:
                await conn.execute("COMMIT")
            except Exception as exc:
                if _is_connection_failure(exc):
                    raise PostgresCommitUnknownError(
                        f"The connection to PostgreSQL ({self.where}) failed while committing: "
                        f"{_one_line(exc, self.dsn)}; the operation may or may not have been applied"
                    ) from exc
                raise

    def current(self) -> Optional[_Section]:
        """The section of the current task on this database, if any."""
        section = _current_section.get()
        return section if section is not None and section.owner is self else None

    @asynccontextmanager
    async def for_read(self) -> AsyncIterator[Any]:
        """The connection for a read: the current section's, or a pooled one."""
        section = self.current()
        if section is not None:
            yield section.conn
            return
        async with self.connection() as conn:
            yield conn

    @asynccontextmanager
    async def for_write(self) -> AsyncIterator[Any]:
        """The connection for a write: the current write section's, or a pooled one inside its own transaction."""
        section = self.current()
        if section is not None and section.writes:
            yield section.conn
            return
        async with self.section(writes=True, snapshot=False, labels=["generic"]) as own:
            yield own.conn

    # -- notifications -----------------------------------------------------------------------------------------

    def ensure_listening(self) -> None:
        """Start the notification listener (once per process) on the running event loop."""
        listener = self._listener
        if listener is not None and listener.pid == os.getpid() and listener.alive():
            return
        self._listener = _Listener(self)
        self._listener.start()

    def notified(self, payload: str) -> None:
        if self.on_notification is not None:
            self.on_notification(payload)


async def _check_pool(pool: Any) -> None:
    """Drop the broken connections of ``pool`` after a connection failure (the server may have restarted)."""
    try:
        await pool.check()
    except Exception as exc:
        logger.debug("Checking the pool after a connection failure failed: %r", exc)


class _Listener:
    """A task holding one connection that ``LISTEN``s on the store's channel; reconnects with backoff."""

    def __init__(self, database: _Database) -> None:
        self.database = database
        self.pid = os.getpid()
        self._task: Optional[asyncio.Task[None]] = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="agentbolt-postgres-listener")

    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        self._stopping = True
        task = self._task
        if task is None or task.done():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task
        else:
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def _run(self) -> None:
        psycopg = _psycopg()
        delay = 0.1
        while not self._stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.database.dsn,
                    autocommit=True,
                    connect_timeout=self.database.settings.connect_timeout_seconds,
                )
                async with conn:
                    await conn.execute(f"LISTEN {_quote(self.database.channel)}")
                    # Changes committed while the listener was down were missed: let waiters re-check once.
                    self.database.notified("*")
                    delay = 0.1
                    async for notification in conn.notifies():
                        self.database.notified(notification.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                logger.debug(
                    "Notification listener on %s failed (%s); reconnecting",
                    self.database.where,
                    _one_line(exc, self.database.dsn),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


# ----------------------------------------------------------------------------------------------------------------
# Filters


def _within(name: str, values: List[Any]) -> Tuple[str, List[Any]]:
    if any(isinstance(v, float) for v in values):
        values = [float(v) for v in values]
    return f"{name} = ANY(%s)", [values]


_DIALECT = SqlDialect(placeholder="%s", contains=lambda name: f"strpos({name}, %s) > 0", within=_within)


# ----------------------------------------------------------------------------------------------------------------
# Collections


class _Backed(TrackedCollection):
    """A collection kept in ``table`` of the schema; its metric label is the table's name."""

    def __init__(self, database: _Database, table: str, tracker: Any) -> None:
        super().__init__(tracker=tracker, name=table)
        self._db = database
        self._table = f"{_quote(database.schema)}.{table}"


class PostgresCollection(SqlTable[M], _Backed, Collection[M], Generic[M]):
    """A collection of pydantic items: indexed field columns plus the rest of the item as ``json``."""

    _dialect = _DIALECT

    def __init__(self, database: _Database, spec: TableSpec, tracker: Any = None) -> None:
        _Backed.__init__(self, database, spec.table, tracker)
        SqlTable.__init__(self, spec, self._table)
        self._payload_exclude = set(self._names)
        columns = ", ".join(self._names)
        self._select = f"SELECT {columns}, data FROM {self._table}"
        # A row's JSON for a client: the indexed columns as one JSON object (PostgreSQL writes it, floats in their
        # shortest exact form) and the payload's text, joined without parsing either.
        pairs = ", ".join(f"'{name}', {name}" for name in self._names)
        self._select_json = f"SELECT json_build_object({pairs})::text, data::text FROM {self._table}"
        # Payload fields an update must give for the payload to be written whole (None: extra fields are kept).
        model = spec.item_type
        self._whole_payload: Optional[Set[str]] = (
            set(model.model_fields) - self._payload_exclude if model.model_config.get("extra") != "allow" else None
        )

    # -- encoding -------------------------------------------------------------------------------------------------

    def _encode_row(self, item: M) -> List[Any]:
        values: List[Any] = [getattr(item, name) for name in self._names]
        _check_utf8(values)
        values.append(_RawJson(item.model_dump_json(exclude=self._payload_exclude)))
        return values

    def _decode(self, row: Sequence[Any]) -> M:
        data: Dict[str, Any] = row[-1]
        for name, value in zip(self._names, row, strict=False):
            data[name] = value
        return cast(M, self._spec.item_type.model_validate(data))

    # -- reads ----------------------------------------------------------------------------------------------------

    async def size(self) -> int:
        """Number of items."""
        async with self.tracking_context("size", self.collection_name), self._db.for_read() as conn:
            row = await (await conn.execute(f"SELECT count(*) FROM {self._table}")).fetchone()
            return int(row[0])

    @staticmethod
    def _row_json(row: Sequence[str]) -> bytes:
        """The JSON object of a row read with ``_select_json``: the indexed columns, then the payload's fields."""
        columns, payload = row
        return (columns if payload == "{}" else f"{columns[:-1]}, {payload[1:]}").encode()

    async def _query_page(
        self, query: SqlQuery, limit: int, offset: int, raw: bool, count: bool
    ) -> Tuple[List[Any], int]:
        plan = query.plan
        async with self._db.for_read() as conn:
            if query.in_sql:
                sql = f"{self._select_json if raw else self._select} WHERE {plan.where} ORDER BY {query.order_sql}"
                params = list(plan.params)
                if limit >= 0 or offset > 0:
                    sql += " LIMIT %s OFFSET %s"
                    params += [None if limit < 0 else limit, offset]
                items: List[Any] = []
                if limit != 0:  # limit 0 asks only for the count
                    rows = await (await conn.execute(sql, params)).fetchall()
                    items = [self._row_json(row) for row in rows] if raw else [self._decode(row) for row in rows]
                    # The page itself tells the total when it ends before the limit and is not past the end.
                    if not count or ((limit < 0 or len(items) < limit) and (items or offset == 0)):
                        return items, offset + len(items)
                count_sql = f"SELECT count(*) FROM {self._table} WHERE {plan.where}"
                total = (await (await conn.execute(count_sql, plan.params)).fetchone())[0]
                return items, int(total)
            # Fallback for what SQL cannot express: narrow with SQL, finish in Python with the in-memory rules.
            rows = await (await conn.execute(f"{self._select} WHERE {plan.where} ORDER BY ord", plan.params)).fetchall()
        return query.finish([self._decode(row) for row in rows], limit, offset, raw)

    # -- writes ---------------------------------------------------------------------------------------------------

    async def _insert_skipping(self, conn: Any, items: Sequence[M]) -> List[Tuple[Any, ...]]:
        """Insert in as few statements as possible, skipping stored keys; the keys actually inserted."""
        inserted: List[Tuple[Any, ...]] = []
        keys = ", ".join(self._spec.primary_keys)
        for start in range(0, len(items), _MAX_ROWS_PER_STATEMENT):
            chunk = items[start : start + _MAX_ROWS_PER_STATEMENT]
            sql = (
                self._insert_head
                + ", ".join([self._row_placeholders] * len(chunk))
                + f" ON CONFLICT ({self._conflict}) DO NOTHING RETURNING {keys}"
            )
            params = [value for item in chunk for value in self._row(item)]
            inserted += [tuple(row) for row in await (await conn.execute(sql, params)).fetchall()]
        return inserted

    async def _undo_inserts(self, conn: Any, keys: Sequence[Tuple[Any, ...]]) -> None:
        for key in keys:
            await conn.execute(f"DELETE FROM {self._table} WHERE {self._pk_where}", key)

    async def insert(self, items: Sequence[M]) -> None:
        """Insert new items; any duplicated primary key raises :class:`DuplicatedPrimaryKeyError`, inserting none."""
        self._check_items(items, unique=True)
        if not items:
            return
        async with self.tracking_context("insert", self.collection_name), self._db.for_write() as conn:
            inserted = await self._insert_skipping(conn, items)
            if len(inserted) != len(items):
                await self._undo_inserts(conn, inserted)
                done = set(inserted)
                key = next(self._key(item) for item in items if self._key(item) not in done)
                raise self._exists_error(key)

    async def insert_new(self, items: Sequence[M]) -> Sequence[M]:
        """Insert the items whose key is not stored yet (the first of repeated keys); returns those inserted."""
        self._check_items(items)
        if not items:
            return []
        async with self.tracking_context("insert_new", self.collection_name), self._db.for_write() as conn:
            inserted = set(await self._insert_skipping(conn, items))
        added: List[M] = []
        for item in items:
            key = self._key(item)
            if key in inserted:
                inserted.discard(key)
                added.append(item)
        return added

    def _partial_sql(self, update_fields: Sequence[str], item: M) -> Tuple[str, List[Any]]:
        """``SET`` clause and parameters writing only ``update_fields`` of ``item`` (repaired if it must be)."""
        return self._repairing(lambda writable: self._encode_partial(update_fields, writable), item)

    def _merges_payload(self, update_fields: Sequence[str]) -> bool:
        """Whether writing ``update_fields`` must merge them into the stored payload (read it, then write it whole).

        Worker and metrics records, the ones written field by field, keep one field in the payload: an update of
        that field writes the payload whole, in one statement. Any other update of part of a payload reads the
        stored item first (PostgreSQL's JSON functions cannot read a payload holding a NUL character).
        """
        payload_fields = {name for name in update_fields if name not in self._payload_exclude}
        return bool(payload_fields) and not (self._whole_payload is not None and self._whole_payload <= payload_fields)

    def _encode_partial(self, update_fields: Sequence[str], item: M) -> Tuple[str, List[Any]]:
        assignments: List[str] = []
        params: List[Any] = []
        for name in update_fields:
            if name in self._payload_exclude and name not in self._spec.primary_keys:
                assignments.append(f"{name} = %s")
                params.append(getattr(item, name))
        _check_utf8(params)
        # Payload fields reach here only when they are the whole payload (else the caller merges, _merges_payload).
        if any(name not in self._payload_exclude for name in update_fields):
            assignments.append("data = %s")
            params.append(_RawJson(item.model_dump_json(exclude=self._payload_exclude)))
        return ", ".join(assignments), params

    async def update(self, items: Sequence[M], update_fields: Optional[Sequence[str]] = None) -> Sequence[M]:
        """Update existing items (whole or ``update_fields`` only); a missing one raises ``ValueError``, updating none."""
        self._check_items(items)
        self._check_update_fields(update_fields)
        if not items:
            return []
        async with self.tracking_context("update", self.collection_name), self._db.for_write() as conn:
            if len(items) > 1:
                await conn.execute("SAVEPOINT agentbolt_update")
            try:
                results = [await self._update_one(conn, item, update_fields) for item in items]
            except BaseException:
                if len(items) > 1:
                    await conn.execute("ROLLBACK TO SAVEPOINT agentbolt_update")
                raise
            if len(items) > 1:
                await conn.execute("RELEASE SAVEPOINT agentbolt_update")
            return results

    async def _fetch_locked(self, conn: Any, key: Sequence[Any]) -> Optional[M]:
        """The stored item with ``key``, its row locked until the transaction ends; ``None`` when there is none."""
        row = await (await conn.execute(f"{self._select} WHERE {self._pk_where} FOR UPDATE", key)).fetchone()
        return None if row is None else self._decode(row)

    async def _update_one(self, conn: Any, item: M, update_fields: Optional[Sequence[str]]) -> M:
        key = self._key(item)
        if update_fields is not None and self._merges_payload(update_fields):
            existing = await self._fetch_locked(conn, key)
            if existing is None:
                raise self._missing(key)
            item, update_fields = self._merge(existing, item, update_fields), None
        if update_fields is None:
            cursor = await conn.execute(self._update_sql, self._update_params(self._row(item), key))
            if cursor.rowcount == 0:
                raise self._missing(key)
            return item
        assignments, params = self._partial_sql(update_fields, item)
        if not assignments:
            found = await (await conn.execute(f"{self._select} WHERE {self._pk_where}", key)).fetchone()
            if found is None:
                raise self._missing(key)
            return self._decode(found)
        sql = f"UPDATE {self._table} SET {assignments} WHERE {self._pk_where} RETURNING {', '.join(self._names)}, data"
        found = await (await conn.execute(sql, [*params, *key])).fetchone()
        if found is None:
            raise self._missing(key)
        return self._decode(found)

    async def upsert(self, items: Sequence[M], update_fields: Optional[Sequence[str]] = None) -> Sequence[M]:
        """Insert or update: ``None`` replaces, a list updates those fields, ``[]`` gets or inserts."""
        self._check_items(items)
        self._check_update_fields(update_fields)
        results: List[M] = []
        async with self.tracking_context("upsert", self.collection_name), self._db.for_write() as conn:
            for item in items:
                results.append(await self._upsert_one(conn, item, update_fields))
        return results

    async def _upsert_one(self, conn: Any, item: M, update_fields: Optional[Sequence[str]]) -> M:
        if update_fields is None:
            await conn.execute(self._replace_sql, self._row(item))
            return item
        if self._merges_payload(update_fields):
            return await self._upsert_merging(conn, item, update_fields)
        returning = f"RETURNING {', '.join(self._names)}, data"
        assignments, params = self._partial_sql(update_fields, item)
        if assignments:
            sql = (
                f"{self._insert_head}{self._row_placeholders} ON CONFLICT ({self._conflict}) "
                f"DO UPDATE SET {assignments} {returning}"
            )
            row = await (await conn.execute(sql, [*self._row(item), *params])).fetchone()
            return self._decode(row)
        sql = f"{self._insert_head}{self._row_placeholders} ON CONFLICT ({self._conflict}) DO NOTHING {returning}"
        row = await (await conn.execute(sql, self._row(item))).fetchone()
        if row is None:  # already stored: get
            row = await (await conn.execute(f"{self._select} WHERE {self._pk_where}", self._key(item))).fetchone()
        return self._decode(row)

    async def _upsert_merging(self, conn: Any, item: M, update_fields: Sequence[str]) -> M:
        """Write ``update_fields`` of ``item`` over the stored item, read under a row lock; insert it if new."""
        key = self._key(item)
        insert = f"{self._insert_sql} ON CONFLICT ({self._conflict}) DO NOTHING RETURNING 1"
        while True:
            existing = await self._fetch_locked(conn, key)
            if existing is not None:
                merged = self._merge(existing, item, update_fields)
                await conn.execute(self._update_sql, self._update_params(self._row(merged), key))
                return merged
            if await (await conn.execute(insert, self._row(item))).fetchone() is not None:
                return item
            # Another transaction inserted it since the read: read it again, locked, and merge into it.

    async def delete(self, items: Sequence[M]) -> None:
        """Delete existing items; a missing one raises ``ValueError``, deleting none."""
        self._check_items(items)
        if not items:
            return
        async with self.tracking_context("delete", self.collection_name), self._db.for_write() as conn:
            deleted: List[M] = []
            for item in items:
                key = self._key(item)
                found = await (
                    await conn.execute(
                        f"DELETE FROM {self._table} WHERE {self._pk_where} RETURNING {', '.join(self._names)}, data",
                        key,
                    )
                ).fetchone()
                if found is None:
                    if deleted:  # put back what this call deleted: a failed delete deletes nothing
                        await self._insert_skipping(conn, deleted)
                    raise self._missing(key)
                deleted.append(self._decode(found))


class PostgresQueue(_Backed, Queue[str]):
    """The FIFO of rollout ids; positions only grow. A claimed head is never handed to two transactions."""

    def __init__(self, database: _Database, tracker: Any = None) -> None:
        _Backed.__init__(self, database, "rollout_queue", tracker)
        table = self._table
        head = f"FROM {table} ORDER BY pos LIMIT %s FOR UPDATE SKIP LOCKED"
        self._head_sql = f"SELECT pos, item {head}"
        self._claim_sql = f"DELETE FROM {table} WHERE pos IN (SELECT pos {head}) RETURNING pos, item"
        # PostgreSQL evaluates a volatile function of the select list after the sort: the rollouts are locked in
        # key order, the order every section locks rollouts in.
        self._claim_and_lock_sql = (
            f"WITH claimed AS ({self._claim_sql}) SELECT pos, item, key, pg_advisory_xact_lock(key) "
            f"FROM (SELECT pos, item, {database.rollout_lock_key_sql('item')} AS key FROM claimed) AS c ORDER BY key"
        )

    def item_type(self) -> Type[str]:
        """Queued items are rollout ids."""
        return str

    def _check(self, item: Any) -> None:
        if not isinstance(item, str):
            raise TypeError(f"rollout_queue holds str, got {type(item).__name__}")

    async def has(self, item: str) -> bool:
        """Whether ``item`` is queued."""
        self._check(item)
        async with self.tracking_context("has", self.collection_name), self._db.for_read() as conn:
            cursor = await conn.execute(f"SELECT 1 FROM {self._table} WHERE item = %s LIMIT 1", (item,))
            return await cursor.fetchone() is not None

    async def enqueue(self, items: Sequence[str]) -> Sequence[str]:
        """Append items at the tail."""
        for item in items:
            self._check(item)
        if not items:
            return list(items)
        async with self.tracking_context("enqueue", self.collection_name), self._db.for_write() as conn:
            await conn.execute(
                f"INSERT INTO {self._table} (item) SELECT item FROM unnest(%s::text[]) WITH ORDINALITY AS t(item, n) "
                "ORDER BY n",
                (list(items),),
            )
        return list(items)

    async def dequeue(self, limit: int = 1) -> Sequence[str]:
        """Pop up to ``limit`` items from the head.

        In a section confined to rollouts (``rollout_ids`` of :meth:`PostgresLightningCollections.atomic`), the
        claimed rollouts are locked too, as :meth:`~PostgresLightningCollections.lock_rollouts` would: by the claim
        itself, in key order, when the section holds no rollout yet. A section holding rollouts already never waits
        for another (waiting for one of a lower key than one it holds could deadlock with a section holding that
        one and waiting for one of its own): it claims head entries only while their rollouts are free, and leaves
        the first entry whose rollout is not, and those after it, queued.
        """
        if limit <= 0:
            return []
        async with self.tracking_context("dequeue", self.collection_name), self._db.for_write() as conn:
            section = self._db.current()
            held = None if section is None else section.rollout_keys
            if held is None:
                rows = await (await conn.execute(self._claim_sql, (limit,))).fetchall()
            elif not held:
                rows = await (await conn.execute(self._claim_and_lock_sql, (limit,))).fetchall()
                held.update(row[2] for row in rows)
            else:
                rows = await self._claim_while_free(conn, held, limit)
        return [row[1] for row in sorted(rows)]

    async def _claim_while_free(self, conn: Any, held: Set[int], limit: int) -> List[Tuple[int, str]]:
        """Claim head entries, locking their rollouts without waiting, up to the first whose rollout is locked."""
        claimed: List[Tuple[int, str]] = []
        for pos, item in await (await conn.execute(self._head_sql, (limit,))).fetchall():
            key = self._db.rollout_lock_key(item)
            (free,) = await (await conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (key,))).fetchone()
            if not free:
                break
            held.add(key)
            claimed.append((pos, item))
        if claimed:
            await conn.execute(f"DELETE FROM {self._table} WHERE pos = ANY(%s)", ([pos for pos, _ in claimed],))
        return claimed

    async def peek(self, limit: int = 1) -> Sequence[str]:
        """Up to ``limit`` items from the head, not removed."""
        if limit <= 0:
            return []
        async with self.tracking_context("peek", self.collection_name), self._db.for_read() as conn:
            cursor = await conn.execute(f"SELECT item FROM {self._table} ORDER BY pos LIMIT %s", (limit,))
            return [row[0] for row in await cursor.fetchall()]

    async def size(self) -> int:
        """Number of queued items."""
        async with self.tracking_context("size", self.collection_name), self._db.for_read() as conn:
            return int((await (await conn.execute(f"SELECT count(*) FROM {self._table}")).fetchone())[0])


class PostgresCounters(_Backed, KeyValue[str, int]):
    """The span sequence counters, by rollout id; every read-modify-write is one statement.

    A counter is written only while its rollout is stored (see
    :attr:`~agentbolt.store.collection.base.LightningCollections.span_sequence_ids`): the write of an unknown
    rollout's counter returns what it would for a missing key and stores nothing.
    """

    def __init__(self, database: _Database, tracker: Any = None) -> None:
        _Backed.__init__(self, database, "span_sequence_ids", tracker)
        self._rollout_stored = rollout_stored_condition("%s", f"{_quote(database.schema)}.rollouts")

    @staticmethod
    def _integer(value: Any, description: str) -> int:
        return _ensure_integer(value, description)

    async def has(self, key: str) -> bool:
        """Whether ``key`` exists."""
        return await self.get(key) is not None

    async def get(self, key: str, default: Optional[int] = None) -> Optional[int]:
        """Value of ``key`` or ``default``."""
        async with self.tracking_context("get", self.collection_name), self._db.for_read() as conn:
            row = await (await conn.execute(f"SELECT value FROM {self._table} WHERE key = %s", (key,))).fetchone()
            return default if row is None else int(row[0])

    async def _upsert(self, operation: str, key: str, value: int, update: str) -> int:
        sql = (
            f"INSERT INTO {self._table} AS t (key, value) SELECT %s::text, %s::bigint WHERE {self._rollout_stored} "
            f"ON CONFLICT (key) DO UPDATE SET value = {update} RETURNING value"
        )
        async with self.tracking_context(operation, self.collection_name), self._db.for_write() as conn:
            row = await (await conn.execute(sql, (key, value, key))).fetchone()
        return value if row is None else int(row[0])  # None: the rollout is not stored, nothing was written

    async def set(self, key: str, value: int) -> None:
        """Set ``key`` to ``value``."""
        await self._upsert("set", key, self._integer(value, "value"), "EXCLUDED.value")

    async def inc(self, key: str, amount: int) -> int:
        """Add ``amount`` (a missing key counts as 0) and return the new value."""
        return await self._upsert("inc", key, self._integer(amount, "amount"), "t.value + EXCLUDED.value")

    async def chmax(self, key: str, value: int) -> int:
        """Store ``max(current, value)`` and return it."""
        return await self._upsert("chmax", key, self._integer(value, "value"), "GREATEST(t.value, EXCLUDED.value)")

    async def pop(self, key: str, default: Optional[int] = None) -> Optional[int]:
        """Remove ``key`` and return its value (or ``default``)."""
        async with self.tracking_context("pop", self.collection_name), self._db.for_write() as conn:
            cursor = await conn.execute(f"DELETE FROM {self._table} WHERE key = %s RETURNING value", (key,))
            row = await cursor.fetchone()
            return default if row is None else int(row[0])

    async def size(self) -> int:
        """Number of keys."""
        async with self.tracking_context("size", self.collection_name), self._db.for_read() as conn:
            return int((await (await conn.execute(f"SELECT count(*) FROM {self._table}")).fetchone())[0])


class PostgresLightningCollections(LightningCollections):
    """All store collections in one PostgreSQL schema (see the module docstring for layout and transactions).

    Opening applies the missing migrations; pools open lazily, one per process and event loop, so the object may be
    pickled to (or inherited by) other processes, which then open their own connections.

    Args:
        dsn: libpq connection string or URI, e.g. ``postgresql://user:password@host:5432/dbname``.
        schema: Schema holding the store's tables (created when missing).
        pool_min_size: Connections each pool keeps open.
        pool_max_size: Most connections of each pool (per process and event loop).
        pool_timeout: Seconds a call waits for a free connection before failing with
            :class:`PostgresUnavailableError`.
        connect_timeout: Seconds allowed to open a connection.
        tracker: Optional metrics backend.

    Raises:
        ValueError: Invalid schema name, pool sizes or timeouts.
        TypeError: A pool size or timeout of the wrong type.
        PostgresConnectionError: The database cannot be reached or refuses the connection.
        PostgresPermissionError: The role may not create the schema or its tables.
        PostgresSchemaVersionError: The schema was written by a newer version of agentbolt.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "agentbolt",
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        pool_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        tracker: Any = None,
    ) -> None:
        super().__init__(tracker=tracker)
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(
                f"Invalid schema name {schema!r}: use letters, digits and _ (at most 53, the first not a digit)"
            )
        _ensure_integer(pool_min_size, "pool_min_size")
        _ensure_integer(pool_max_size, "pool_max_size")
        ensure_numeric(pool_timeout, description="pool_timeout")
        ensure_numeric(connect_timeout, description="connect_timeout")
        if pool_min_size < 0 or pool_max_size < 1 or pool_min_size > pool_max_size:
            raise ValueError(f"Invalid pool sizes: min {pool_min_size}, max {pool_max_size}")
        if not all(0 < timeout < math.inf for timeout in (pool_timeout, connect_timeout)):
            raise ValueError(
                f"pool_timeout and connect_timeout must be positive numbers of seconds, got {pool_timeout} and "
                f"{connect_timeout}"
            )
        self.schema = schema
        self.migrated_from = apply_migrations(dsn, schema, connect_timeout)
        self._db = _Database(
            _ConnectionSettings(dsn, schema, pool_min_size, pool_max_size, pool_timeout, connect_timeout)
        )
        self._build(tracker)

    def _build(self, tracker: Any) -> None:
        db = self._db
        set_table_collections(self, lambda spec: PostgresCollection(db, spec, tracker))
        self.rollout_queue = PostgresQueue(db, tracker)
        self.span_sequence_ids = PostgresCounters(db, tracker)
        self._meta_table = f"{_quote(db.schema)}.store_meta"

    def __getstate__(self) -> Dict[str, Any]:
        return {"schema": self.schema, "migrated_from": self.migrated_from, "_db": self._db}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        LightningCollections.__init__(self)
        self.schema = state["schema"]
        self.migrated_from = state["migrated_from"]
        self._db = state["_db"]
        self._build(None)

    @property
    def dsn(self) -> str:
        """The connection string."""
        return self._db.dsn

    @property
    def extra_tracking_labels(self) -> Dict[str, str]:
        """The schema, as an extra metric label."""
        return {"schema": self.schema}

    @asynccontextmanager
    async def atomic(
        self,
        *,
        mode: AtomicMode = "rw",
        snapshot: bool = False,
        commit: bool = False,
        labels: Optional[Sequence[AtomicLabels]] = None,
        rollout_ids: Optional[Sequence[str]] = None,
        **kwargs: Any,
    ) -> AsyncIterator[PostgresLightningCollections]:
        """One atomic section.

        ``"w"``/``"rw"`` sections run in one transaction after taking the advisory locks of ``labels`` (every label
        when none is given), so sections sharing a label run one after the other across all processes; with
        ``rollout_ids``, the labels are locked shared and the rollouts exclusively, so that sections on different
        rollouts run (and commit) side by side. The section is rolled back if the body raises and this returns once
        committed. ``"r"`` sections read the last committed
        state on one connection (``snapshot=True``: one consistent snapshot). Nested sections join the enclosing
        one.
        """
        current = self._db.current()
        writes = mode != "r"
        if current is not None and (current.writes or not writes):
            yield self
            return
        async with self._db.section(writes=writes, snapshot=snapshot, labels=labels, rollout_ids=rollout_ids):
            yield self

    async def lock_rollouts(self, rollout_ids: Sequence[str]) -> None:
        """In a section opened with ``rollout_ids``, lock these rollouts too (after its label locks, in key order)."""
        await self._db.lock_rollouts(rollout_ids)

    async def claim_periodic_run(self, name: str, interval: float, now: float) -> bool:
        """Claim the periodic task ``name``: True for one caller per ``interval`` among all processes."""
        sql = (
            f"INSERT INTO {self._meta_table} AS t (key, value) VALUES (%s, %s) ON CONFLICT (key) "
            "DO UPDATE SET value = EXCLUDED.value WHERE t.value <= %s RETURNING value"
        )
        async with self._db.connection() as conn:
            return await (await conn.execute(sql, (name, now, now - interval))).fetchone() is not None

    def subscribe(self, on_notification: Callable[[str], None]) -> None:
        """Receive the payloads of the store's notifications (``f:<rollout_id>``, ``q``, ``*`` after reconnecting)."""
        self._db.on_notification = on_notification

    def ensure_listening(self) -> None:
        """Start listening for notifications on the running event loop (once per process)."""
        self._db.ensure_listening()

    async def close(self) -> None:
        """Close this process's connection pools and the listener."""
        await self._db.close()
