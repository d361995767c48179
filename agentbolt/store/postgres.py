"""The PostgreSQL store: every lifecycle rule of the collection-based store, in a database shared by many processes.

Once a call returns, its effect is committed in PostgreSQL. Any number of store objects (server workers, processes,
machines) may use the same database and schema at once: atomic sections take advisory locks, so a queued rollout is
claimed by exactly one of them; the watchdog scans once per debounce period among all of them; a rollout finishing
in one process wakes ``wait_for_rollouts`` in all of them (``LISTEN``/``NOTIFY``). See
:mod:`agentbolt.store.collection.postgres` for the layout, migrations and transactions, and ``docs/store-postgres.md``
for setup and operation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Optional

from agentbolt.store.base import LightningStoreCapabilities
from agentbolt.store.collection.postgres import (
    PostgresCommitUnknownError,
    PostgresConnectionError,
    PostgresLightningCollections,
    PostgresPermissionError,
    PostgresSchemaVersionError,
    PostgresStoreError,
    PostgresUnavailableError,
    redact_dsn,
)
from agentbolt.store.collection_based import CollectionBasedLightningStore

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "PostgresLightningStore",
    "PostgresStoreError",
    "PostgresConnectionError",
    "PostgresPermissionError",
    "PostgresSchemaVersionError",
    "PostgresUnavailableError",
    "PostgresCommitUnknownError",
]

logger = logging.getLogger(__name__)


class PostgresLightningStore(CollectionBasedLightningStore[PostgresLightningCollections]):
    """A LightningStore kept in PostgreSQL (psycopg 3, one connection pool per process and event loop).

    Safe to use from several event loops, threads, processes and machines at once. The object pickles (its pools do
    not): a copy in another process opens its own connections to the same data, which is why it is zero-copy and can
    be served by several server processes.

    Args:
        dsn: libpq connection string or URI, e.g. ``postgresql://agentbolt:secret@db.example:5432/agentbolt``.
        schema: Schema holding the store's tables; several stores can share one database under different schemas.
        pool_min_size: Connections each pool keeps open.
        pool_max_size: Most connections of each pool (per process and event loop).
        pool_timeout: Seconds a call waits for a free connection before failing.
        connect_timeout: Seconds allowed to open a connection.
        tracker: Optional metrics backend.
        scan_debounce_seconds: Minimum interval between two watchdog scans, among all processes sharing the schema
            (``<= 0`` scans before every call).
        read_snapshot: Run multi-read operations on one consistent snapshot.

    Raises:
        ValueError: Invalid schema name, pool sizes or timeouts (checked before connecting).
        TypeError: A pool size or timeout of the wrong type.
        PostgresConnectionError: The database cannot be reached or refuses the connection.
        PostgresPermissionError: The role may not create the schema or its tables.
        PostgresSchemaVersionError: The schema was written by a newer version of agentbolt.
    """

    _wait_poll_interval = 5.0
    """Notifications wake waiters; the poll only covers a listener that is reconnecting."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "agentbolt",
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        pool_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        tracker: Optional[MetricsBackend] = None,
        scan_debounce_seconds: float = 10.0,
        read_snapshot: bool = False,
    ) -> None:
        collections = PostgresLightningCollections(
            dsn,
            schema=schema,
            pool_min_size=pool_min_size,
            pool_max_size=pool_max_size,
            pool_timeout=pool_timeout,
            connect_timeout=connect_timeout,
            tracker=tracker,
        )
        super().__init__(
            collections, read_snapshot=read_snapshot, tracker=tracker, scan_debounce_seconds=scan_debounce_seconds
        )
        self.schema = schema
        collections.subscribe(self._on_notification)
        logger.info("Opened PostgreSQL store %s (schema %s)", redact_dsn(dsn), schema)

    def __getstate__(self) -> Dict[str, Any]:
        return {
            "collections": self.collections,
            "read_snapshot": self._read_snapshot,
            "scan_debounce_seconds": self._scan_debounce_seconds,
        }

    def __setstate__(self, state: Dict[str, Any]) -> None:
        CollectionBasedLightningStore.__init__(self, **state)
        self.schema = self.collections.schema
        self.collections.subscribe(self._on_notification)

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """Thread- and async-safe, and zero-copy: copies in other processes share the same data."""
        return LightningStoreCapabilities(thread_safe=True, async_safe=True, zero_copy=True, otlp_traces=False)

    @property
    def dsn(self) -> str:
        """The connection string."""
        return self.collections.dsn

    def _listen_for_changes(self) -> None:
        self.collections.ensure_listening()

    def _on_notification(self, payload: str) -> None:
        """A change committed by any process: wake the waiters it concerns (all of them after a reconnection)."""
        if payload.startswith("f:"):
            self._notify_finished([payload[2:]])
        elif payload == "q":
            self._notify_queued()
        elif payload == "*":
            with self._waiters_lock:
                rollout_ids = list(self._waiters)
            self._notify_finished(rollout_ids)
            self._notify_queued()

    async def close(self) -> None:
        """Close this process's connections (other processes using the same database are not affected)."""
        await self.collections.close()
        logger.info("Closed PostgreSQL store %s", redact_dsn(self.dsn))
