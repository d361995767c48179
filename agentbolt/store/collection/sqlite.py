"""Collections stored in one SQLite database file: durable, WAL mode, group commit, never on the event loop.

Layout of the database:

* ``schema_version``: one row holding the schema version; a file written by a newer (unknown) schema is refused.
* one table per collection (``rollouts``, ``attempts``, ``spans``, ``resources``, ``workers``). Each row holds the
  item as JSON in ``data`` plus a copy of the filterable / sortable fields in indexed columns, and an integer
  ``ord`` (the rowid) recording insertion order. A unique index enforces the primary key.
* ``rollout_queue``: FIFO of rollout ids; positions only grow, so the order survives restarts.
* ``span_sequence_ids``: per-rollout span sequence counters (never reissued, also after a restart).
* ``store_meta``: timestamps of periodic work shared by every process using the file (the watchdog's last scan),
  so that server workers sharing the file scan once per period among them.

Threads and transactions:

* One writer thread owns the only writing connection. An atomic read-write section (``atomic(mode="rw")``) holds
  the write gate for its whole duration and runs inside a SAVEPOINT of the current transaction, so a section that
  raises is rolled back entirely. When a section ends while other sections wait for the gate, its commit is
  deferred and the next section joins the same transaction (group commit); the last section of a group commits
  and only then are all the sections of the group acknowledged. A write is never acknowledged before its commit.
* Reads outside write sections run on a small pool of reader threads, each with its own connection; in WAL mode
  they see the last committed state and never block the writer.

Durability: WAL mode with ``synchronous=NORMAL`` (the default) keeps every committed transaction across a crash or
kill of the process; only an operating-system crash or power loss may lose the last commits. ``synchronous="FULL"``
syncs the WAL on every commit (group commit amortises the cost) and survives power loss too.

Read-only (``read_only=True``): the file is opened with SQLite's read-only URI (``file:...?mode=ro``) by reader
threads only; there is no writer thread and no write gate, and every write (a write section, a writer operation) is
refused with :class:`SqliteReadOnlyError`. Nothing is created, changed or migrated: a missing or empty file, a file
that is not a store, and any schema version but the current one are errors. A file of the current version written
before a table of ``_ADDED_TABLES`` existed is readable: the table reads as empty (each connection shadows it with an
empty ``TEMP`` table), as it would right after a writable opening added it; ``store_meta`` is only used by writes.
How the file is opened depends on whether a process uses it:

* a ``-wal`` file lies next to it (a process has it open, or crashed with it open): plain ``mode=ro``. Reads take
  part in SQLite's WAL protocol through the ``-shm`` file, so each read sees the last committed state of the live
  writers, and the writers never wait. If the ``-shm`` file is missing and cannot be created (read-only folder),
  opening fails with a :class:`SqliteStoreError` naming the file;
* no ``-wal`` file (a closed store, a copy, a file in a read-only folder): ``mode=ro&immutable=1``, so that SQLite
  creates no ``-wal`` / ``-shm`` file next to it and needs no write access to the folder. ``immutable`` reads without
  locks, which is safe only while the file does not change: the file's identity (inode, size, modification time) is
  recorded when opening and checked after every read, and once a process that opened the store meanwhile has changed
  it, every read raises :class:`SqliteStoreError` (reopen to read the new state). Until then reads see the state of
  the file at opening.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Coroutine,
    Deque,
    Generic,
    List,
    Literal,
    NoReturn,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    TypeVar,
    cast,
)

import orjson
from pydantic import BaseModel

from agentbolt.store.collection.base import (
    AtomicLabels,
    AtomicMode,
    Collection,
    KeyValue,
    LightningCollections,
    Queue,
    ensure_numeric,
)
from agentbolt.store.collection.sql import (
    ALL_TABLES,
    METRICS,
    SqlDialect,
    SqlQuery,
    SqlTable,
    TableSpec,
    rollout_stored_condition,
    set_table_collections,
)
from agentbolt.utils.event_loop import new_event_loop

__all__ = [
    "SCHEMA_VERSION",
    "SynchronousMode",
    "SqliteStoreError",
    "SqliteDatabaseLockedError",
    "SqliteDatabaseCorruptError",
    "SqliteSchemaVersionError",
    "SqliteReadOnlyError",
    "SqliteCollection",
    "SqliteQueue",
    "SqliteKeyValue",
    "SqliteLightningCollections",
]

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Version of the database layout written by this module."""

SynchronousMode = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
K = TypeVar("K")
V = TypeVar("V")

_MAX_GROUP_SIZE = 64
"""Most sections sharing one commit."""
_MAX_SQL_PARAMS = 900
"""Above this many values, ``within`` filters pass the values as one JSON array."""


class SqliteStoreError(RuntimeError):
    """A SQLite store file cannot be used. ``path`` names the file, ``reason`` says what is wrong."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{message} (database file: {path})")
        self.path = path
        self.reason = message
        """What is wrong, without the file's name."""


class SqliteDatabaseLockedError(SqliteStoreError):
    """Another connection or process holds a lock on the database beyond the busy timeout."""


class SqliteDatabaseCorruptError(SqliteStoreError):
    """The file is not a SQLite database, is corrupt, or is not an agentbolt store."""


class SqliteSchemaVersionError(SqliteStoreError):
    """The database was written with a schema version this version of agentbolt does not know."""


class SqliteReadOnlyError(SqliteStoreError):
    """A write was asked of a database opened with ``read_only=True``; nothing was written."""


def _translate_error(exc: BaseException, path: str) -> BaseException:
    """Turn low-level SQLite errors about the file into typed errors naming the file."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            return SqliteDatabaseLockedError(path, f"Database is locked by another connection or process: {exc}")
        if "unable to open" in text or "disk i/o" in text or "readonly" in text:
            return SqliteStoreError(path, f"Cannot use the database file: {exc}")
        return exc
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
        exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)
    ):
        return SqliteDatabaseCorruptError(path, f"Not a valid SQLite database or corrupt file: {exc}")
    return exc


def _create_parent_folder(path: str) -> None:
    """Create the folder of a database file (and its parents) when missing.

    Raises:
        SqliteStoreError: The folder cannot be created; the message names it and the reason.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(folder):
        return
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise SqliteStoreError(
            path, f"Cannot create the folder {folder} of the database: {exc.strerror or exc}"
        ) from exc


# ----------------------------------------------------------------------------------------------------------------
# Table layout (shared with the PostgreSQL backend: see agentbolt.store.collection.sql)

_ADDED_TABLES: Tuple[TableSpec, ...] = (METRICS,)
"""Tables added to schema version 1 after its first release: created when a file lacks them (older readers ignore
tables they do not know, so the version stays 1)."""
_STORE_META = "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value REAL NOT NULL)"
"""Added to schema version 1 like ``_ADDED_TABLES``: files written before it gain it when opened."""


def _create_table(spec: TableSpec, temp: bool = False) -> str:
    columns = ", ".join(f"{c.name} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in spec.columns)
    kind = "TEMP TABLE" if temp else "TABLE"
    return f"CREATE {kind} {spec.table} (ord INTEGER PRIMARY KEY, {columns}, data TEXT NOT NULL)"


def _table_statements(spec: TableSpec) -> List[str]:
    statements = [
        _create_table(spec),
        f"CREATE UNIQUE INDEX {spec.table}_pk ON {spec.table}({', '.join(spec.primary_keys)})",
    ]
    for index in spec.indexes:
        statements.append(f"CREATE INDEX {spec.table}_{'_'.join(index)} ON {spec.table}({', '.join(index)})")
    return statements


def _schema_statements() -> List[str]:
    statements = [
        "CREATE TABLE schema_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL, "
        "created_at REAL NOT NULL)",
        "CREATE TABLE rollout_queue (pos INTEGER PRIMARY KEY AUTOINCREMENT, item TEXT NOT NULL)",
        "CREATE INDEX rollout_queue_item ON rollout_queue(item)",
        "CREATE TABLE span_sequence_ids (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        _STORE_META,
    ]
    for spec in ALL_TABLES:
        statements.extend(_table_statements(spec))
    return statements


# ----------------------------------------------------------------------------------------------------------------
# Connections, threads and the write gate


def _connect(path: str, busy_timeout: float, cache_kib: int, synchronous: SynchronousMode) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            raise SqliteStoreError(path, f"Cannot switch the database to WAL mode (journal_mode={mode!r})")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        _set_caches(conn, cache_kib)
        conn.execute(f"PRAGMA journal_size_limit={64 * 1024 * 1024}")
    except BaseException:
        conn.close()
        raise
    return conn


def _set_caches(conn: sqlite3.Connection, cache_kib: int) -> None:
    conn.execute(f"PRAGMA cache_size=-{int(cache_kib)}")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA mmap_size=0")


def _refuse_folder(path: str) -> None:
    if os.path.isdir(path):
        raise SqliteStoreError(path, "Path is a directory, not a database file")


_SQLITE_HEADER = b"SQLite format 3\x00"


def _refuse_other_file(path: str) -> None:
    """Refuse a file that holds something other than a SQLite database before SQLite opens it for writing: SQLite
    reports most such files, but takes one shorter than its header for a new database and writes over it.

    Raises:
        SqliteDatabaseCorruptError: ``path`` is not empty and does not start with SQLite's header.
    """
    try:
        with open(path, "rb") as file:
            header = file.read(len(_SQLITE_HEADER))
    except OSError:  # missing (a new store), or unreadable: SQLite's own open reports it
        return
    if header and header != _SQLITE_HEADER:
        raise SqliteDatabaseCorruptError(path, "Not an SQLite database")


def _read_only_uri(path: str) -> Tuple[str, bool]:
    """The URI that opens the database ``path`` for reading only, and whether it opens it ``immutable``.

    Raises:
        SqliteStoreError: ``path`` does not exist, is a folder, or cannot be read.
        SqliteDatabaseCorruptError: ``path`` is empty or not a SQLite database.
    """
    _refuse_folder(path)
    try:
        with open(path, "rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        raise SqliteStoreError(path, "No such file (a read-only store is never created)") from None
    except OSError as exc:
        raise SqliteStoreError(path, f"Cannot read the database file: {exc.strerror or exc}") from exc
    if not header:
        raise SqliteDatabaseCorruptError(path, "The file is empty: it holds no store")
    if len(header) < 100 or not header.startswith(_SQLITE_HEADER):
        raise SqliteDatabaseCorruptError(path, "Not an SQLite database")
    database = Path(path).resolve()
    # Byte 18 of the header is 2 in WAL mode; with no -wal file next to it, no process has the database open.
    immutable = header[18] == 2 and not os.path.exists(f"{database}-wal")
    return database.as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro"), immutable


def _file_identity(path: str) -> Optional[Tuple[int, int, int, int]]:
    """What changes when the file is written or replaced (None once it is gone)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class _Section:
    """An atomic section of one task: either a write section (holding the gate) or a plain read scope."""

    __slots__ = ("database", "writes")

    def __init__(self, database: _Database, writes: bool) -> None:
        self.database = database
        self.writes = writes


_current_section: contextvars.ContextVar[Optional[_Section]] = contextvars.ContextVar(
    "agentbolt_sqlite_section", default=None
)


class _Database:
    """The database file: a writer thread running a private event loop, reader threads, the write gate.

    The writer thread owns the only writing connection. Write work submitted from any other event loop costs one
    hand-off to the writer thread; coroutines running *on* the writer loop (see :meth:`run_on_writer`) call
    SQLite directly, so a whole store operation costs a single hand-off.
    """

    def __init__(
        self,
        path: str,
        *,
        synchronous: SynchronousMode,
        busy_timeout: float,
        cache_size_mb: float,
        reader_threads: int,
    ) -> None:
        self._synchronous = synchronous
        self._init_readers(path, busy_timeout, cache_size_mb, reader_threads)
        # Write gate state, guarded by ``_gate_lock``.
        self._gate_lock = threading.Lock()
        self._gate_owned = False
        self._gate_waiters: Deque[Tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._group: List[Tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._in_transaction = False  # only touched by the gate owner
        self._left_group_commits: Set[asyncio.Task[None]] = set()
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._run_writer_loop, name="agentbolt-sqlite-writer", daemon=True)
        self._thread.start()
        try:
            self._conn: sqlite3.Connection = self._call_blocking(lambda: self._open(cache_size_mb))
        except BaseException:
            self._stop_writer_loop()
            self._readers.shutdown(wait=True)
            raise

    def _init_readers(self, path: str, busy_timeout: float, cache_size_mb: float, reader_threads: int) -> None:
        """The state every database has: its file, the pool of reader threads and the statistics."""
        self.path = path
        self._busy_timeout = busy_timeout
        self._reader_cache_kib = max(256, int(cache_size_mb * 1024 / 4))
        self._readers = ThreadPoolExecutor(max_workers=reader_threads, thread_name_prefix="agentbolt-sqlite-reader")
        self._reader_local = threading.local()
        self._reader_conns: List[sqlite3.Connection] = []
        self._reader_loops: List[asyncio.AbstractEventLoop] = []
        self._reader_lock = threading.Lock()
        self._closed = False
        self.commits = 0
        self.sections = 0

    # -- the writer thread -------------------------------------------------------------------------------------

    def _run_writer_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _stop_writer_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def _call_blocking(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the writer thread and wait for it (for synchronous callers only)."""
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result()

    def on_writer_loop(self) -> bool:
        """Whether the caller runs on the writer thread's event loop."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def run_on_writer(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` on the writer loop, where SQLite calls need no thread hand-off."""
        if self.on_writer_loop():
            return await fn(*args, **kwargs)
        self._check_open()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._loop))

    # -- opening -----------------------------------------------------------------------------------------------

    def _open(self, cache_size_mb: float) -> sqlite3.Connection:
        _refuse_folder(self.path)
        _refuse_other_file(self.path)
        try:
            conn = _connect(self.path, self._busy_timeout, max(256, int(cache_size_mb * 1024)), self._synchronous)
        except SqliteStoreError:
            raise
        except sqlite3.Error as exc:
            raise _translate_error(exc, self.path) from exc
        try:
            self._ensure_schema(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise _translate_error(exc, self.path) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _stored_tables(self, conn: sqlite3.Connection) -> Set[str]:
        """The tables of the file, once it is known to be a store of the current schema version (none: a new file).

        Raises:
            SqliteDatabaseCorruptError: The file holds tables of something else, or no schema version.
            SqliteSchemaVersionError: The file was written with another schema version.
        """
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "schema_version" not in tables:
            if tables - {"sqlite_sequence"}:
                raise SqliteDatabaseCorruptError(
                    self.path, "The SQLite file is not an agentbolt store (no schema_version table)"
                )
            return set()
        row = conn.execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
        if row is None:
            raise SqliteDatabaseCorruptError(self.path, "The schema_version table is empty")
        version = int(row[0])
        if version != SCHEMA_VERSION:
            newer = "a newer" if version > SCHEMA_VERSION else "an unknown older"
            raise SqliteSchemaVersionError(
                self.path,
                f"The store was written with {newer} schema version {version}; this version of agentbolt "
                f"reads schema version {SCHEMA_VERSION} only",
            )
        return tables

    def _check_complete(self, tables: Set[str]) -> None:
        """Raise :class:`SqliteDatabaseCorruptError` if a collection's table is not among ``tables``."""
        missing = {spec.table for spec in ALL_TABLES} - tables
        if missing:
            raise SqliteDatabaseCorruptError(self.path, f"Missing tables: {', '.join(sorted(missing))}")

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = self._stored_tables(conn)
            if not tables:
                for statement in _schema_statements():
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (id, version, created_at) VALUES (1, ?, ?)",
                    (SCHEMA_VERSION, time.time()),
                )
                logger.info("Created agentbolt store schema v%d in %s", SCHEMA_VERSION, self.path)
            else:
                for spec in _ADDED_TABLES:
                    if spec.table not in tables:
                        for statement in _table_statements(spec):
                            conn.execute(statement)
                        tables.add(spec.table)
                        logger.info("Added table %s to the agentbolt store in %s", spec.table, self.path)
                if "store_meta" not in tables:
                    conn.execute(_STORE_META)
                    tables.add("store_meta")
                    logger.info("Added table store_meta to the agentbolt store in %s", self.path)
                self._check_complete(tables)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # -- running work ------------------------------------------------------------------------------------------

    def _guard(self, fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            translated = _translate_error(exc, self.path)
            if translated is exc:
                raise
            raise translated from exc

    async def write_call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the writer connection (the caller must own the gate).

        On the writer loop this is a direct call; from other loops the work is handed to the writer thread. Work
        handed over always runs, in submission order, even if the awaiting task is cancelled.
        """
        self._check_open()
        if self.on_writer_loop():
            return self._guard(fn, self._conn)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()

        def run() -> None:
            try:
                value = self._guard(fn, self._conn)
            except BaseException as exc:
                _settle(loop, result, error=exc)
            else:
                _settle(loop, result, value=value)

        self._loop.call_soon_threadsafe(run)
        return await result

    async def _write_to_the_end(self, fn: Callable[[sqlite3.Connection], T]) -> Tuple[T, bool]:
        """Run a bookkeeping statement on the writer and wait for its outcome even if the caller is cancelled.

        Returns the statement's value and whether the caller was cancelled meanwhile: the caller first accounts for
        what the statement did (a transaction it opened, a commit it made), then raises the cancellation.
        """
        if self.on_writer_loop():
            return await self.write_call(fn), False  # completes without suspending
        work = asyncio.ensure_future(self.write_call(fn))
        cancelled = False
        while not work.done():
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:  # the caller's cancellation, possibly just as the work finished
                if work.cancelled():
                    raise
                cancelled = True
        return work.result(), cancelled

    def _connect_reader(self) -> sqlite3.Connection:
        """A new connection of a reader thread (it never writes)."""
        conn = _connect(self.path, self._busy_timeout, self._reader_cache_kib, self._synchronous)
        conn.execute("PRAGMA query_only=ON")
        return conn

    def _reader_conn(self) -> sqlite3.Connection:
        conn = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = self._connect_reader()
            self._reader_local.conn = conn
            with self._reader_lock:
                self._reader_conns.append(conn)
        return conn

    def _read_job(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            conn = self._reader_conn()
        except sqlite3.Error as exc:
            raise _translate_error(exc, self.path) from exc
        return self._guard(fn, conn)

    async def read_call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on a read-only connection, which sees the last committed state.

        Operations running on a reader thread (see :meth:`run_on_reader`) or on the writer loop call their thread's
        own read-only connection directly; calls from any other loop are handed to a reader thread.
        """
        self._check_open()
        if self._on_reader_loop() or self.on_writer_loop():
            return self._read_job(fn)
        return await asyncio.wrap_future(self._readers.submit(self._read_job, fn))

    def _on_reader_loop(self) -> bool:
        """Whether the caller runs a read operation on a reader thread's event loop."""
        return getattr(self._reader_local, "running", False)

    def _run_read_operation(self, fn: Callable[..., Coroutine[Any, Any, T]], args: Any, kwargs: Any) -> T:
        """Run a whole read operation on this reader thread's private event loop."""
        loop = getattr(self._reader_local, "loop", None)
        if loop is None:
            loop = self._reader_local.loop = new_event_loop()
            with self._reader_lock:
                self._reader_loops.append(loop)
        self._reader_local.running = True
        try:
            return loop.run_until_complete(fn(*args, **kwargs))
        finally:
            self._reader_local.running = False

    async def run_on_reader(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` on a reader thread, where its reads need no further hand-off."""
        if self.on_writer_loop() or self._on_reader_loop():
            return await fn(*args, **kwargs)
        self._check_open()
        return await asyncio.wrap_future(self._readers.submit(self._run_read_operation, fn, args, kwargs))

    @property
    def closed(self) -> bool:
        """Whether the database was closed."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise SqliteStoreError(self.path, "The store is closed")

    # -- the write gate and group commit -------------------------------------------------------------------------

    async def _acquire_gate(self) -> None:
        loop = asyncio.get_running_loop()
        with self._gate_lock:
            if not self._gate_owned:
                self._gate_owned = True
                return
            future: asyncio.Future[None] = loop.create_future()
            self._gate_waiters.append((loop, future))
        try:
            await future
        except BaseException:
            with self._gate_lock:
                granted = future.done() and not future.cancelled() and future.exception() is None
                if not granted:
                    with suppress(ValueError):
                        self._gate_waiters.remove((loop, future))
            if granted:
                await self._finish_section(None)
            raise

    def _hand_over_locked(self) -> None:
        """Give the gate to the next waiter, or free it. Caller holds ``_gate_lock``."""
        while self._gate_waiters:
            loop, future = self._gate_waiters.popleft()

            def grant(future: asyncio.Future[None] = future) -> None:
                if future.done():  # the waiter gave up meanwhile: pass the gate on
                    with self._gate_lock:
                        self._hand_over_locked()
                else:
                    future.set_result(None)

            try:
                loop.call_soon_threadsafe(grant)
            except RuntimeError:  # the waiter's event loop is closed
                continue
            return
        if self._in_transaction:
            # Sections that joined the open transaction wait for the next owner to commit it, and every waiter gave
            # up meanwhile: the writer loop takes the gate over and commits the group.
            try:
                self._loop.call_soon_threadsafe(self._commit_left_group)
                return
            except RuntimeError:  # the writer loop is stopped: the store is closed
                pass
        self._gate_owned = False

    def _commit_left_group(self) -> None:
        """Finish, as the gate's owner, a section with no writes of its own: commit the group (writer loop only)."""
        task = self._loop.create_task(self._finish_section(None))
        self._left_group_commits.add(task)
        task.add_done_callback(self._left_group_committed)

    def _left_group_committed(self, task: asyncio.Task[None]) -> None:
        self._left_group_commits.discard(task)
        if not task.cancelled() and task.exception() is not None:  # the group's sections received the error
            logger.debug("Committing a group of sections of %s failed: %s", self.path, task.exception())

    async def _finish_section(self, error: Optional[BaseException]) -> None:
        """End the owner's section: join the next section's commit, or commit the group now."""
        loop = asyncio.get_running_loop()
        cancelled = False
        if self._in_transaction and loop is self._loop:
            # Let store operations that are ready to run reach the gate, so that they join this commit.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                cancelled = True  # finish the hand-over first
        with self._gate_lock:
            defer = self._in_transaction and bool(self._gate_waiters) and len(self._group) < _MAX_GROUP_SIZE - 1
            if defer:
                ack: asyncio.Future[None] = loop.create_future()
                self._group.append((loop, ack))
                self._hand_over_locked()
        if defer:
            if cancelled:
                raise asyncio.CancelledError()
            await ack
            return
        commit_error, cancelled_in_commit = await self._commit_group()
        with self._gate_lock:
            self._hand_over_locked()
        if commit_error is not None:
            raise commit_error
        if cancelled or cancelled_in_commit:
            raise asyncio.CancelledError()

    async def _commit_group(self) -> Tuple[Optional[BaseException], bool]:
        """Commit the open transaction (the gate owner's call) and acknowledge the sections waiting for it.

        Returns the commit error, which the waiting sections also receive, and whether the caller was cancelled
        while the commit ran (the commit is finished and acknowledged all the same).
        """
        commit_error: Optional[BaseException] = None
        cancelled = False
        if self._in_transaction:
            try:
                _, cancelled = await self._write_to_the_end(_commit)
                self.commits += 1
            except BaseException as exc:
                commit_error = exc
            finally:
                self._in_transaction = False
        with self._gate_lock:
            group, self._group = self._group, []
        for waiter_loop, waiter in group:
            _settle(waiter_loop, waiter, error=commit_error)
        return commit_error, cancelled

    @asynccontextmanager
    async def write_section(self) -> AsyncIterator[None]:
        """Hold the write gate for the body; its writes are committed (possibly grouped) before this returns."""
        self._check_open()
        await self._acquire_gate()
        # A section opening the transaction is undone by rolling the transaction back; a section joining the
        # transaction of a pending group commit runs inside a savepoint, so that its failure spares the others.
        opens_transaction = not self._in_transaction

        def begin(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE" if opens_transaction else "SAVEPOINT section")

        try:
            # Once handed over, the statement runs even if this task is cancelled: wait for it, so that a
            # transaction or savepoint it opens is always rolled back below.
            _, cancelled = await self._write_to_the_end(begin)
        except BaseException:
            await self._finish_section(None)
            raise
        self._in_transaction = True
        self.sections += 1
        token = _current_section.set(_Section(self, writes=True))
        try:
            if cancelled:
                raise asyncio.CancelledError()
            yield
        except BaseException as exc:
            _current_section.reset(token)
            try:
                await self._write_to_the_end(_rollback_transaction if opens_transaction else _rollback_savepoint)
                if opens_transaction:
                    self._in_transaction = False
            except BaseException as rollback_error:  # the transaction cannot be trusted any more
                logger.error("Rolling back a failed section of %s failed: %s", self.path, rollback_error)
                await self._abort_transaction()
            await self._finish_section(exc)
            raise
        _current_section.reset(token)
        cancelled_in_release = False
        if not opens_transaction:
            try:
                _, cancelled_in_release = await self._write_to_the_end(_release_savepoint)
            except BaseException:
                await self._abort_transaction()
                await self._finish_section(None)
                raise
        await self._finish_section(None)
        if cancelled_in_release:  # the section's writes are in the group's transaction: they commit with it
            raise asyncio.CancelledError()

    async def _abort_transaction(self) -> None:
        """Roll the whole transaction back and fail its group. Never raises: its callers still hand the gate over,
        then raise their own error (a cancellation meanwhile included)."""

        def abort(conn: sqlite3.Connection) -> None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

        try:
            await self._write_to_the_end(abort)
        except BaseException as abort_error:
            logger.error("Rolling back the transaction of %s failed: %s", self.path, abort_error)
        finally:
            self._in_transaction = False
            error = SqliteStoreError(self.path, "The transaction was rolled back after an error")
            with self._gate_lock:
                group, self._group = self._group, []
            for loop, future in group:
                _settle(loop, future, error=error)

    async def close(self) -> None:
        """Wait for running sections, commit, then close every connection and stop the threads."""
        if self._closed:
            return
        if self.on_writer_loop():
            raise RuntimeError("The store cannot be closed from its own writer thread")
        await self._acquire_gate()
        try:
            # Sections waiting for a group commit get their answer; a cancellation meanwhile still closes the file.
            commit_error, _ = await self._commit_group()
            if commit_error is not None:
                logger.error("Committing the last writes to %s failed: %s", self.path, commit_error)
        finally:
            self._closed = True
            error = SqliteStoreError(self.path, "The store is closed")
            with self._gate_lock:
                waiters, self._gate_waiters = list(self._gate_waiters), deque()
                self._gate_owned = False
            for loop, future in waiters:
                _settle(loop, future, error=error)
            await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        self._shutdown_readers()
        self._call_blocking(self._conn.close)
        self._stop_writer_loop()

    def _shutdown_readers(self) -> None:
        self._readers.shutdown(wait=True)
        with self._reader_lock:
            conns, self._reader_conns = self._reader_conns, []
        for conn in conns:
            conn.close()
        with self._reader_lock:
            loops, self._reader_loops = self._reader_loops, []
        for loop in loops:
            loop.close()

    def close_sync(self) -> None:
        """Close without an event loop (nothing may be running on the store any more)."""
        if self._closed:
            return
        self._closed = True
        if self._in_transaction:
            self._call_blocking(lambda: _commit(self._conn))
        self._shutdown()


class _ReadOnlyDatabase(_Database):
    """A database file opened for reading only: reader threads with ``mode=ro`` connections, no writer thread.

    Writes are refused with :class:`SqliteReadOnlyError` where they would reach the writer: entering a write section
    and handing an operation to the writer thread. See the module docstring for how the file is opened.

    Raises:
        SqliteStoreError: The file does not exist, is a folder or cannot be read.
        SqliteDatabaseCorruptError: The file is empty, not a SQLite database, corrupt, or not an agentbolt store.
        SqliteSchemaVersionError: The file was written with another schema version.
    """

    def __init__(self, path: str, *, busy_timeout: float, cache_size_mb: float, reader_threads: int) -> None:
        self._init_readers(path, busy_timeout, cache_size_mb, reader_threads)
        self._uri, immutable = _read_only_uri(path)
        self._identity = _file_identity(path) if immutable else None
        self._absent_tables: Tuple[TableSpec, ...] = ()
        try:
            conn = self._connect_reader()
            try:
                tables = self._stored_tables(conn)
            finally:
                conn.close()
        except sqlite3.OperationalError as exc:
            if immutable or "unable to open" not in str(exc):
                raise _translate_error(exc, path) from exc
            raise SqliteStoreError(
                path,
                f"Cannot read the store in use (a -wal file lies next to it): SQLite reads it through its -shm file, "
                f"which can be neither opened nor created in its folder ({exc})",
            ) from exc
        except sqlite3.Error as exc:
            raise _translate_error(exc, path) from exc
        self._check_unchanged()
        if not tables:
            raise SqliteDatabaseCorruptError(path, "The SQLite file holds no agentbolt store (it has no tables)")
        self._absent_tables = tuple(spec for spec in _ADDED_TABLES if spec.table not in tables)
        self._check_complete(tables | {spec.table for spec in self._absent_tables})
        logger.debug("Opened %s read-only%s", path, " (immutable)" if immutable else "")

    def _connect_reader(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._uri, uri=True, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            _set_caches(conn, self._reader_cache_kib)
            # Empty stand-ins of the tables the file predates: unqualified names find the temp schema first.
            for spec in self._absent_tables:
                conn.execute(_create_table(spec, temp=True))
            conn.execute("PRAGMA query_only=ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_unchanged(self) -> None:
        """Raise :class:`SqliteStoreError` once a file opened ``immutable`` differs from the file at opening."""
        if self._identity is not None and _file_identity(self.path) != self._identity:
            raise SqliteStoreError(
                self.path,
                "Another process changed the file after it was opened read-only while no process used it; "
                "reopen the store to read it",
            )

    def _read_job(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return super()._read_job(fn)
        finally:
            self._check_unchanged()  # what was read from a file changing meanwhile may be torn: never return it

    def _refuse_write(self, operation: str) -> NoReturn:
        self._check_open()
        raise SqliteReadOnlyError(self.path, f"The store was opened read-only: {operation} would write to it")

    def on_writer_loop(self) -> bool:
        """Always False: there is no writer thread."""
        return False

    async def run_on_writer(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        """Refuse the write operation ``fn``."""
        self._refuse_write(getattr(fn, "__name__", "the operation"))

    @asynccontextmanager
    async def write_section(self) -> AsyncIterator[None]:
        """Refuse to open a write section (every collection write and snapshot read opens one)."""
        self._refuse_write("this section")
        yield

    async def close(self) -> None:
        """Close every reader connection and stop the reader threads."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown_readers)

    def close_sync(self) -> None:
        """Close without an event loop."""
        if self._closed:
            return
        self._closed = True
        self._shutdown_readers()


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    *,
    value: Any = None,
    error: Optional[BaseException] = None,
) -> None:
    """Complete ``future`` (of ``loop``) from any thread; nothing happens if it was cancelled or its loop is gone."""

    def complete() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    if loop.is_closed():
        return
    try:
        if asyncio.get_running_loop() is loop:
            complete()
            return
    except RuntimeError:
        pass
    with suppress(RuntimeError):  # the loop closed meanwhile
        loop.call_soon_threadsafe(complete)


def _commit(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _rollback_transaction(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _rollback_savepoint(conn: sqlite3.Connection) -> None:
    conn.execute("ROLLBACK TO section")
    conn.execute("RELEASE section")


def _release_savepoint(conn: sqlite3.Connection) -> None:
    conn.execute("RELEASE section")


def _atomically(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], statements: int) -> T:
    """Run a write of ``statements`` statements as one unit inside the current transaction.

    A single statement is atomic by itself and needs no savepoint.
    """
    if statements <= 1:
        return fn(conn)
    conn.execute("SAVEPOINT op")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK TO op")
        conn.execute("RELEASE op")
        raise
    conn.execute("RELEASE op")
    return result


class _Backed:
    """Routes a collection's work to the right connection for the calling task."""

    def __init__(self, database: _Database) -> None:
        self._db = database

    def _in_write_section(self) -> bool:
        section = _current_section.get()
        return section is not None and section.writes and section.database is self._db

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._in_write_section():
            return await self._db.write_call(fn)
        return await self._db.read_call(fn)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._in_write_section():
            return await self._db.write_call(fn)
        async with self._db.write_section():
            return await self._db.write_call(fn)


# ----------------------------------------------------------------------------------------------------------------
# Filters and sorting


def _within(name: str, values: List[Any]) -> Tuple[str, List[Any]]:
    if len(values) > _MAX_SQL_PARAMS:
        return f"{name} IN (SELECT value FROM json_each(?))", [orjson.dumps(values).decode()]
    return f"{name} IN ({', '.join('?' * len(values))})", values


_DIALECT = SqlDialect(placeholder="?", contains=lambda name: f"instr({name}, ?) > 0", within=_within)


# ----------------------------------------------------------------------------------------------------------------
# Collections


class SqliteCollection(SqlTable[M], _Backed, Collection[M], Generic[M]):
    """A collection of pydantic items stored as JSON rows with indexed field columns."""

    _dialect = _DIALECT

    def __init__(self, database: _Database, spec: TableSpec, tracker: Any = None) -> None:
        _Backed.__init__(self, database)
        Collection.__init__(self, tracker=tracker, name=spec.table)
        SqlTable.__init__(self, spec, spec.table)

    # -- encoding -------------------------------------------------------------------------------------------------

    def _encode_row(self, item: M) -> List[Any]:
        values: List[Any] = [getattr(item, c.name) for c in self._spec.columns]
        values.append(item.model_dump_json())  # the whole item: it fails on any string UTF-8 cannot hold
        return values

    def _decode(self, data: str) -> M:
        return cast(M, self._spec.item_type.model_validate_json(data))

    def _fetch(self, conn: sqlite3.Connection, key: Sequence[Any]) -> Optional[M]:
        row = conn.execute(f"SELECT data FROM {self._table} WHERE {self._pk_where}", tuple(key)).fetchone()
        return None if row is None else self._decode(row[0])

    # -- reads ----------------------------------------------------------------------------------------------------

    async def size(self) -> int:
        """Number of items."""
        async with self.tracking_context("size", self.collection_name):
            return await self._read(
                lambda conn: int(conn.execute(f"SELECT COUNT(*) FROM {self._spec.table}").fetchone()[0])
            )

    def _run_query(
        self, conn: sqlite3.Connection, query: SqlQuery, limit: int, offset: int, raw: bool, count: bool
    ) -> Tuple[List[Any], int]:
        """Matching items (their stored JSON when ``raw``) and the total (counted only when ``count``)."""
        plan = query.plan
        table = self._spec.table
        if query.in_sql:
            sql = f"SELECT data FROM {table} WHERE {plan.where} ORDER BY {query.order_sql}"
            params = list(plan.params)
            if limit >= 0 or offset > 0:
                sql += " LIMIT ? OFFSET ?"
                params += [limit, offset]
            rows = conn.execute(sql, params)
            items: List[Any] = [row[0].encode() for row in rows] if raw else [self._decode(row[0]) for row in rows]
            if not count or (limit < 0 and offset == 0):
                return items, offset + len(items)
            total = int(conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {plan.where}", plan.params).fetchone()[0])
            return items, total
        # Fallback for what SQL cannot express: narrow with SQL, finish in Python with the in-memory rules.
        rows = conn.execute(f"SELECT data FROM {table} WHERE {plan.where} ORDER BY ord", plan.params)
        return query.finish([self._decode(row[0]) for row in rows], limit, offset, raw)

    async def _query_page(
        self, query: SqlQuery, limit: int, offset: int, raw: bool, count: bool
    ) -> Tuple[List[Any], int]:
        return await self._read(lambda conn: self._run_query(conn, query, limit, offset, raw, count))

    # -- writes ---------------------------------------------------------------------------------------------------

    async def insert(self, items: Sequence[M]) -> None:
        """Insert new items; any duplicated primary key raises :class:`DuplicatedPrimaryKeyError`, inserting none."""
        self._check_items(items, unique=True)
        if not items:
            return
        rows = [self._row(item) for item in items]

        def job(conn: sqlite3.Connection) -> None:
            try:
                if len(rows) == 1:
                    conn.execute(self._insert_sql, rows[0])
                else:
                    _atomically(conn, lambda c: c.executemany(self._insert_sql, rows), len(rows))
            except sqlite3.IntegrityError as exc:
                for item in items:
                    key = self._key(item)
                    if self._fetch(conn, key) is not None:
                        raise self._exists_error(key) from exc
                raise

        async with self.tracking_context("insert", self.collection_name):
            await self._write(job)

    async def update(self, items: Sequence[M], update_fields: Optional[Sequence[str]] = None) -> Sequence[M]:
        """Update existing items (whole or ``update_fields`` only); a missing one raises ``ValueError``, updating none."""

        def update_one(c: sqlite3.Connection, item: M) -> M:
            key = self._key(item)
            if update_fields is None:
                new = item
            else:
                existing = self._fetch(c, key)
                if existing is None:
                    raise self._missing(key)
                new = self._merge(existing, item, update_fields)
            cursor = c.execute(self._update_sql, self._update_params(self._row(new), key))
            if cursor.rowcount == 0:
                raise self._missing(key)
            return new

        return await self._write_each("update", items, update_fields, update_one)

    async def upsert(self, items: Sequence[M], update_fields: Optional[Sequence[str]] = None) -> Sequence[M]:
        """Insert or update: ``None`` replaces, a list updates those fields, ``[]`` gets or inserts."""

        def upsert_one(c: sqlite3.Connection, item: M) -> M:
            if update_fields is None:
                c.execute(self._replace_sql, self._row(item))
                return item
            existing = self._fetch(c, self._key(item))
            if existing is None:
                c.execute(self._insert_sql, self._row(item))
                return item
            if not update_fields:
                return existing
            new = self._merge(existing, item, update_fields)
            c.execute(self._replace_sql, self._row(new))
            return new

        return await self._write_each("upsert", items, update_fields, upsert_one)

    async def _write_each(
        self,
        operation: str,
        items: Sequence[M],
        update_fields: Optional[Sequence[str]],
        write_one: Callable[[sqlite3.Connection, M], M],
    ) -> Sequence[M]:
        """Check the arguments, then run ``write_one`` on each item in one transaction (all or none)."""
        self._check_items(items)
        self._check_update_fields(update_fields)

        def job(conn: sqlite3.Connection) -> List[M]:
            return _atomically(conn, lambda c: [write_one(c, item) for item in items], len(items))

        async with self.tracking_context(operation, self.collection_name):
            return await self._write(job)

    async def delete(self, items: Sequence[M]) -> None:
        """Delete existing items; a missing one raises ``ValueError``, deleting none."""
        self._check_items(items)

        def job(conn: sqlite3.Connection) -> None:
            def apply(c: sqlite3.Connection) -> None:
                for item in items:
                    key = self._key(item)
                    if c.execute(f"DELETE FROM {self._table} WHERE {self._pk_where}", key).rowcount == 0:
                        raise self._missing(key)

            _atomically(conn, apply, len(items))

        async with self.tracking_context("delete", self.collection_name):
            await self._write(job)


class SqliteQueue(_Backed, Queue[T], Generic[T]):
    """A FIFO queue in a table whose positions only grow, so the order survives restarts."""

    def __init__(self, database: _Database, item_type: Type[T], table: str = "rollout_queue", tracker: Any = None):
        _Backed.__init__(self, database)
        Queue.__init__(self, tracker=tracker, name=table)
        self._item_type = item_type
        self._table = table

    def item_type(self) -> Type[T]:
        """Type of the queued items."""
        return self._item_type

    def _encode(self, item: T) -> str:
        if not isinstance(item, self._item_type):
            raise TypeError(f"{self._table} holds {self._item_type.__name__}, got {type(item).__name__}")
        return orjson.dumps(item).decode()

    async def has(self, item: T) -> bool:
        """Whether ``item`` is queued."""
        encoded = self._encode(item)
        async with self.tracking_context("has", self._table):
            return await self._read(
                lambda conn: (
                    conn.execute(f"SELECT 1 FROM {self._table} WHERE item = ? LIMIT 1", (encoded,)).fetchone()
                    is not None
                )
            )

    async def enqueue(self, items: Sequence[T]) -> Sequence[T]:
        """Append items at the tail."""
        encoded = [(self._encode(item),) for item in items]
        if not encoded:
            return list(items)
        async with self.tracking_context("enqueue", self._table):
            await self._write(
                lambda conn: _atomically(
                    conn, lambda c: c.executemany(f"INSERT INTO {self._table} (item) VALUES (?)", encoded), len(encoded)
                )
            )
        return list(items)

    def _head(self, conn: sqlite3.Connection, limit: int) -> List[Tuple[int, str]]:
        return conn.execute(f"SELECT pos, item FROM {self._table} ORDER BY pos LIMIT ?", (limit,)).fetchall()

    async def dequeue(self, limit: int = 1) -> Sequence[T]:
        """Pop up to ``limit`` items from the head."""
        if limit <= 0:
            return []

        def job(conn: sqlite3.Connection) -> List[T]:
            rows = self._head(conn, limit)
            if rows:
                conn.execute(f"DELETE FROM {self._table} WHERE pos <= ?", (rows[-1][0],))
            return [orjson.loads(item) for _, item in rows]

        async with self.tracking_context("dequeue", self._table):
            return await self._write(job)

    async def peek(self, limit: int = 1) -> Sequence[T]:
        """Up to ``limit`` items from the head, not removed."""
        if limit <= 0:
            return []
        async with self.tracking_context("peek", self._table):
            return await self._read(lambda conn: [orjson.loads(item) for _, item in self._head(conn, limit)])

    async def size(self) -> int:
        """Number of queued items."""
        async with self.tracking_context("size", self._table):
            return await self._read(lambda conn: int(conn.execute(f"SELECT COUNT(*) FROM {self._table}").fetchone()[0]))


class SqliteKeyValue(_Backed, KeyValue[K, V], Generic[K, V]):
    """A key-value map whose values are stored as JSON; read-modify-write helpers run as one statement group.

    Args:
        database: The database holding ``table``.
        table: The table of the map.
        tracker: Optional metrics backend.
        kept_when: SQL condition, whose one parameter is the key, under which a key may be stored (any key when
            ``None``): writing a key it refuses returns what writing a missing key would, and stores nothing.
    """

    def __init__(
        self,
        database: _Database,
        table: str = "span_sequence_ids",
        tracker: Any = None,
        kept_when: Optional[str] = None,
    ):
        _Backed.__init__(self, database)
        KeyValue.__init__(self, tracker=tracker, name=table)
        self._table = table
        self._guarded = kept_when is not None
        self._store_sql = (
            f"INSERT INTO {table} (key, value) SELECT ?, ? WHERE {kept_when or 1} "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        )

    def _load(self, conn: sqlite3.Connection, key: K) -> Tuple[bool, Any]:
        row = conn.execute(f"SELECT value FROM {self._table} WHERE key = ?", (key,)).fetchone()
        return (False, None) if row is None else (True, orjson.loads(row[0]))

    def _store(self, conn: sqlite3.Connection, key: K, value: Any) -> bool:
        """Write ``value`` under ``key``; False when the key may not be stored (nothing was written)."""
        encoded = orjson.dumps(value).decode()
        cursor = conn.execute(self._store_sql, (key, encoded, key) if self._guarded else (key, encoded))
        return cursor.rowcount > 0

    async def has(self, key: K) -> bool:
        """Whether ``key`` exists."""
        async with self.tracking_context("has", self._table):
            return await self._read(lambda conn: self._load(conn, key)[0])

    async def get(self, key: K, default: Optional[V] = None) -> Optional[V]:
        """Value of ``key`` or ``default``."""
        async with self.tracking_context("get", self._table):
            found, value = await self._read(lambda conn: self._load(conn, key))
            return value if found else default

    async def set(self, key: K, value: V) -> None:
        """Set ``key`` to ``value``."""
        async with self.tracking_context("set", self._table):
            await self._write(lambda conn: self._store(conn, key, value))

    async def inc(self, key: K, amount: V) -> V:
        """Add ``amount`` (a missing key counts as 0) and return the new value."""
        ensure_numeric(amount, description="amount")

        def job(conn: sqlite3.Connection) -> V:
            found, current = self._load(conn, key)
            new = (ensure_numeric(current, description=f"value of {key!r}") if found else 0) + amount  # type: ignore[operator]
            return cast(V, new if self._store(conn, key, new) else amount)

        async with self.tracking_context("inc", self._table):
            return await self._write(job)

    async def chmax(self, key: K, value: V) -> V:
        """Store ``max(current, value)`` and return it."""
        ensure_numeric(value, description="value")

        def job(conn: sqlite3.Connection) -> V:
            found, current = self._load(conn, key)
            if found and ensure_numeric(current, description=f"value of {key!r}") >= value:  # type: ignore[operator]
                return cast(V, current)
            self._store(conn, key, value)
            return value

        async with self.tracking_context("chmax", self._table):
            return await self._write(job)

    async def pop(self, key: K, default: Optional[V] = None) -> Optional[V]:
        """Remove ``key`` and return its value (or ``default``)."""

        def job(conn: sqlite3.Connection) -> Optional[V]:
            found, value = self._load(conn, key)
            if not found:
                return default
            conn.execute(f"DELETE FROM {self._table} WHERE key = ?", (key,))
            return cast(V, value)

        async with self.tracking_context("pop", self._table):
            return await self._write(job)

    async def size(self) -> int:
        """Number of keys."""
        async with self.tracking_context("size", self._table):
            return await self._read(lambda conn: int(conn.execute(f"SELECT COUNT(*) FROM {self._table}").fetchone()[0]))


def _close_dropped_database(db: _Database, pid: int) -> None:
    """Close the database of collections that were garbage-collected open.

    It is closed on a thread of its own: the last reference may go on one of the database's own threads, which
    closing stops and joins. Nothing is closed in a forked child, which has none of the parent's threads.
    """
    if os.getpid() != pid or db.closed:
        return
    logger.debug("Closing %s: its store was garbage-collected without being closed", db.path)
    threading.Thread(target=db.close_sync, name="agentbolt-sqlite-close", daemon=True).start()


class SqliteLightningCollections(LightningCollections):
    """All store collections in one SQLite file (see the module docstring for threads, durability, group commit).

    Args:
        path: Database file; created with the current schema when missing or empty (unless ``read_only``).
        synchronous: SQLite ``synchronous`` pragma. ``"NORMAL"`` (default) keeps every acknowledged write across a
            process crash or kill; ``"FULL"`` also across an operating-system crash or power loss.
        busy_timeout: Seconds to wait for a lock held by another connection before raising
            :class:`SqliteDatabaseLockedError`.
        cache_size_mb: Page cache of the writer connection; each reader gets a quarter of it.
        reader_threads: Number of reader threads (each with its own connection).
        tracker: Optional metrics backend.
        read_only: Open an existing store for reading only (see the module docstring): nothing is created, changed
            or migrated, no writer thread runs, and every write raises :class:`SqliteReadOnlyError`.

    Raises:
        SqliteStoreError: ``read_only`` and the file does not exist or cannot be read.
        SqliteDatabaseLockedError: The file is locked by someone else beyond ``busy_timeout``.
        SqliteDatabaseCorruptError: The file is not a SQLite database, is corrupt, or is not an agentbolt store
            (``read_only``: also an empty file).
        SqliteSchemaVersionError: The file uses a schema version this version does not know.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: SynchronousMode = "NORMAL",
        busy_timeout: float = 5.0,
        cache_size_mb: float = 64.0,
        reader_threads: int = 4,
        tracker: Any = None,
        read_only: bool = False,
    ) -> None:
        super().__init__(tracker=tracker)
        mode = str(synchronous).upper()
        if mode not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be one of OFF, NORMAL, FULL, EXTRA; got {synchronous!r}")
        if busy_timeout < 0:
            raise ValueError("busy_timeout must be >= 0")
        if reader_threads < 1:
            raise ValueError("reader_threads must be >= 1")
        self.path = os.fspath(path)
        if self.path == ":memory:" or self.path.startswith("file:"):
            raise ValueError(
                f"SQLite store path {self.path!r}: give a file path (the store keeps its data in one file, in WAL "
                "mode); for a store that keeps nothing use InMemoryLightningStore"
            )
        self._db: _Database
        if read_only:
            self._db = _ReadOnlyDatabase(
                self.path, busy_timeout=busy_timeout, cache_size_mb=cache_size_mb, reader_threads=reader_threads
            )
        else:
            _create_parent_folder(self.path)
            self._db = _Database(
                self.path,
                synchronous=cast(SynchronousMode, mode),
                busy_timeout=busy_timeout,
                cache_size_mb=cache_size_mb,
                reader_threads=reader_threads,
            )
        set_table_collections(self, lambda spec: SqliteCollection(self._db, spec, tracker))
        self.rollout_queue: SqliteQueue[str] = SqliteQueue(self._db, str, tracker=tracker)
        self.span_sequence_ids: SqliteKeyValue[str, int] = SqliteKeyValue(
            self._db, tracker=tracker, kept_when=rollout_stored_condition("?", "rollouts")
        )
        self._meta = _Backed(self._db)
        # Collections dropped without being closed (a notebook cell that opens the store run again) still close the
        # file and stop its threads, which hold the database but not the collections.
        weakref.finalize(self, _close_dropped_database, self._db, os.getpid()).atexit = False

    @property
    def read_only(self) -> bool:
        """Whether the file was opened for reading only (every write raises :class:`SqliteReadOnlyError`)."""
        return isinstance(self._db, _ReadOnlyDatabase)

    @property
    def commit_count(self) -> int:
        """Transactions committed since opening (lower than :attr:`section_count` when commits were grouped)."""
        return self._db.commits

    @property
    def section_count(self) -> int:
        """Write sections run since opening (explicit ``atomic`` sections and single writes)."""
        return self._db.sections

    @asynccontextmanager
    async def atomic(
        self,
        *,
        mode: AtomicMode = "rw",
        snapshot: bool = False,
        commit: bool = False,
        labels: Optional[Sequence[AtomicLabels]] = None,
        **kwargs: Any,
    ) -> AsyncIterator[SqliteLightningCollections]:
        """One atomic section.

        ``"w"``/``"rw"`` sections (and ``"r"`` with ``snapshot=True``) run in one SQLite transaction, isolated from
        every other section and rolled back if the body raises; this returns only once the writes are committed.
        Plain ``"r"`` sections read the last committed state without taking the write gate. Nested sections join
        the enclosing one. ``labels``, ``commit`` and ``rollout_ids`` (in ``kwargs``) need no special handling: one
        writer runs the sections one after the other, and one transaction covers every table.
        """
        current = _current_section.get()
        writes = mode != "r" or snapshot
        if current is not None and current.database is self._db and (current.writes or not writes):
            yield self
            return
        if not writes:
            token = _current_section.set(_Section(self._db, writes=False))
            try:
                yield self
            finally:
                _current_section.reset(token)
            return
        async with self._db.write_section():
            yield self

    async def claim_periodic_run(self, name: str, interval: float, now: float) -> bool:
        """Claim the periodic task ``name``: True for one caller per ``interval`` among all processes using the file.

        The claim is one conditional write to ``store_meta``; the write lock of the file makes it exclusive.
        """

        def claim(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value "
                "WHERE store_meta.value <= ?",
                (name, now, now - interval),
            )
            return cursor.rowcount > 0

        return await self._meta._write(claim)

    async def run_on_writer(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` on the writer thread's event loop.

        Coroutines running there reach SQLite without any thread hand-off, so a multi-step operation costs one
        hand-off in total. Use it for whole write operations; the caller's event loop is never blocked.
        """
        return await self._db.run_on_writer(fn, *args, **kwargs)

    async def run_on_reader(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` on a reader thread's event loop.

        Its reads reach SQLite without a hand-off each, so a read operation of several queries costs one hand-off in
        total. Use it for whole read operations that do not wait for anything else; the caller's loop is never blocked.
        """
        return await self._db.run_on_reader(fn, *args, **kwargs)

    async def close(self) -> None:
        """Commit what is pending and close every connection."""
        await self._db.close()

    def close_sync(self) -> None:
        """Close from synchronous code when no event loop runs the store any more."""
        self._db.close_sync()
