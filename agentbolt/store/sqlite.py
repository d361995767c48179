"""The durable store: every lifecycle rule of the collection-based store, persisted in one SQLite file.

Once a call returns, its effect is committed to the database file and survives a crash or ``kill -9`` of the process;
reopening the file resumes everything: the queue keeps its order, running attempts keep their timestamps (so the
watchdog later marks them timed out or unresponsive and retries them per their ``RolloutConfig``), the latest
resources stay the latest, and span sequence ids are never issued twice. See
:mod:`agentbolt.store.collection.sqlite` for the storage layout, threads and group commit.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Literal, Optional

from agentbolt.store.base import LightningStoreCapabilities
from agentbolt.store.collection.sqlite import (
    SqliteDatabaseCorruptError,
    SqliteDatabaseLockedError,
    SqliteLightningCollections,
    SqliteReadOnlyError,
    SqliteSchemaVersionError,
    SqliteStoreError,
    SynchronousMode,
)
from agentbolt.store.collection_based import CollectionBasedLightningStore

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "SqliteLightningStore",
    "SqliteStoreError",
    "SqliteDatabaseLockedError",
    "SqliteDatabaseCorruptError",
    "SqliteSchemaVersionError",
    "SqliteReadOnlyError",
]

logger = logging.getLogger(__name__)


class SqliteLightningStore(CollectionBasedLightningStore[SqliteLightningCollections]):
    """A LightningStore persisted in a SQLite database file (WAL mode, group commit).

    Safe to share between coroutines of several event loops and threads; SQLite work never runs on an event loop.

    Args:
        path: Database file, created when missing (unless ``read_only``). Reopening an existing file resumes its
            content.
        tracker: Optional metrics backend.
        scan_debounce_seconds: Minimum interval between two watchdog scans, among all processes using the file
            (``<= 0`` scans before every call).
        synchronous: ``"NORMAL"`` (default) keeps every acknowledged write across a process crash or ``kill -9``;
            ``"FULL"`` also across an operating-system crash or power loss, at the cost of one fsync per commit.
        busy_timeout: Seconds to wait for a lock held by another process before raising
            :class:`SqliteDatabaseLockedError`.
        cache_size_mb: SQLite page cache of the writer connection (each reader gets a quarter). Spans are never
            cached by the store itself, so this bounds the memory used for data.
        reader_threads: Threads (each with its own connection) serving reads.
        read_snapshot: Run multi-read operations on a consistent snapshot (serialised with writes).
        read_only: Only read an existing store file, never writing to it, also while other processes (an
            ``agentbolt store`` server) write to it: nothing is created, changed or migrated, no writer thread runs,
            the watchdog never runs (its verdicts are writes), and every writing method raises
            :class:`SqliteReadOnlyError`. Each read sees the last committed state (see
            :mod:`agentbolt.store.collection.sqlite` for how the file is opened). ``synchronous`` does not apply
            and ``read_snapshot`` is refused.

    Raises:
        ValueError: ``read_only`` with ``read_snapshot``.
        SqliteStoreError: ``read_only`` and the file does not exist or cannot be read.
        SqliteDatabaseLockedError: Another process holds a write lock beyond ``busy_timeout``.
        SqliteDatabaseCorruptError: The file is not a SQLite database, is corrupt, or is not an agentbolt store
            (``read_only``: also an empty file).
        SqliteSchemaVersionError: The file was written with an unknown (newer) schema version.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        tracker: Optional[MetricsBackend] = None,
        scan_debounce_seconds: float = 10.0,
        synchronous: SynchronousMode = "NORMAL",
        busy_timeout: float = 5.0,
        cache_size_mb: float = 64.0,
        reader_threads: int = 4,
        read_snapshot: bool = False,
        read_only: bool = False,
    ) -> None:
        if read_only and read_snapshot:
            raise ValueError("read_snapshot needs the writer connection, which a read_only store does not have")
        collections = SqliteLightningCollections(
            path,
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            cache_size_mb=cache_size_mb,
            reader_threads=reader_threads,
            tracker=tracker,
            read_only=read_only,
        )
        super().__init__(
            collections, read_snapshot=read_snapshot, tracker=tracker, scan_debounce_seconds=scan_debounce_seconds
        )
        self.path = collections.path
        logger.info("Opened SQLite store %s%s", self.path, " read-only" if read_only else "")

    @property
    def read_only(self) -> bool:
        """Whether the store was opened with ``read_only=True``."""
        return self.collections.read_only

    async def _healthcheck(self) -> None:
        if self.read_only:
            return  # the watchdog's verdicts are writes: the processes writing the store run it
        await super()._healthcheck()

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """Thread- and async-safe; data is copied (not zero-copy); no OTLP endpoint of its own."""
        return LightningStoreCapabilities(thread_safe=True, async_safe=True, zero_copy=False, otlp_traces=False)

    async def close(self) -> None:
        """Commit what is pending and close the database. Calls after closing raise :class:`SqliteStoreError`."""
        await self.collections.close()
        logger.info("Closed SQLite store %s", self.path)


_WRITER_OPERATIONS = (
    "start_rollout",
    "enqueue_rollout",
    "enqueue_many_rollouts",
    "dequeue_rollout",
    "dequeue_many_rollouts",
    "start_attempt",
    "add_span",
    "add_many_spans",
    "add_otel_span",
    "get_next_span_sequence_id",
    "get_many_span_sequence_ids",
    "add_resources",
    "update_resources",
    "update_rollout",
    "update_attempt",
    "update_worker",
    "_scan_for_unhealthy_rollouts",
)
"""Operations that write: each runs as a whole on the database's writer thread (see ``run_on_writer``)."""


_READER_OPERATIONS = ("get_rollout_by_id", "query_rollouts", "get_latest_resources")
"""Operations that read more than once: each runs as a whole on a reader thread (see ``run_on_reader``), unless
``read_snapshot`` makes its reads one transaction of the writer."""


def _run_whole(name: str, thread: Literal["writer", "reader"]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """The store operation ``name`` run as a whole on the writer thread or on a reader thread."""
    implementation = getattr(CollectionBasedLightningStore, name)

    @functools.wraps(implementation)
    async def operation(self: SqliteLightningStore, *args: Any, **kwargs: Any) -> Any:
        if thread == "writer":
            return await self.collections.run_on_writer(implementation, self, *args, **kwargs)
        if self._read_snapshot:
            return await implementation(self, *args, **kwargs)
        return await self.collections.run_on_reader(implementation, self, *args, **kwargs)

    return operation


for _name in _WRITER_OPERATIONS:
    setattr(SqliteLightningStore, _name, _run_whole(_name, "writer"))
for _name in _READER_OPERATIONS:
    setattr(SqliteLightningStore, _name, _run_whole(_name, "reader"))
