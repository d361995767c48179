"""``SqliteLightningStore(path, read_only=True)``: reads a store in place, live writers included, and never writes.

Every test uses real SQLite files. "Unchanged" means the same bytes and the same folder listing (no ``-wal`` or
``-shm`` file created next to a closed store).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, List, Tuple

import pytest
from support.servers import StoreServerProcess

from agentbolt.store.client_server import LightningStoreClient
from agentbolt.store.collection.sqlite import SCHEMA_VERSION
from agentbolt.store.sqlite import (
    SqliteDatabaseCorruptError,
    SqliteLightningStore,
    SqliteReadOnlyError,
    SqliteSchemaVersionError,
    SqliteStoreError,
)
from agentbolt.types import EnqueueRolloutRequest, MetricsRecord, Rollout, RolloutConfig
from store.conftest import numbered_span as make_span


async def add_rollout(store: Any, spans: int) -> str:
    """A finished rollout whose ``spans`` spans were added in one batch (all or none are visible)."""
    started = await store.start_rollout(input={"spans": spans})
    rollout_id, attempt_id = started.rollout_id, started.attempt.attempt_id
    await store.add_many_spans([make_span(rollout_id, attempt_id, i) for i in range(1, spans + 1)])
    await store.update_attempt(rollout_id, attempt_id, status="succeeded")
    return rollout_id


def state(path: Path) -> Tuple[str, List[str]]:
    """The file's checksum and what its folder holds."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(p.name for p in path.parent.iterdir())


async def closed_store(path: Path, rollouts: int = 2) -> Path:
    """A store file holding ``rollouts`` rollouts of 3 spans each, closed (no -wal or -shm file next to it)."""
    store = SqliteLightningStore(path)
    try:
        for _ in range(rollouts):
            await add_rollout(store, 3)
    finally:
        await store.close()
    return path


def edited(path: Path, *statements: str) -> Path:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path


# ---------------------------------------------------------------------------------------------------------------------
# reading while others write


async def test_reads_what_a_live_store_commits_while_it_keeps_writing(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    writer = SqliteLightningStore(path)
    first = await add_rollout(writer, 5)
    reader = SqliteLightningStore(path, read_only=True)
    try:
        assert [r.rollout_id for r in await reader.query_rollouts()] == [first]

        async def keep_writing() -> List[str]:
            return [await add_rollout(writer, 5) for _ in range(20)]

        writing = asyncio.create_task(keep_writing())
        seen = [0]
        while not writing.done():
            rollouts = await reader.query_rollouts()
            assert len(rollouts) >= seen[-1]  # commits only ever add up
            seen.append(len(rollouts))
            for rollout in rollouts:  # a batch of spans is committed at once: never seen in part
                assert len(await reader.query_spans(rollout.rollout_id)) in (0, 5)
            await asyncio.sleep(0)
        written = await writing
        assert len(set(seen) - {0}) > 1  # the reads ran while the writer wrote
        # Every acknowledged write is visible at once, and the writer kept going without waiting for the reader.
        assert {r.rollout_id for r in await reader.query_rollouts()} == {first, *written}
        assert [len(await reader.query_spans(rid)) for rid in written] == [5] * len(written)
        assert await writer.get_latest_attempt(written[-1]) == await reader.get_latest_attempt(written[-1])
    finally:
        await reader.close()
        await writer.close()


async def test_reads_what_a_store_server_process_commits_while_it_serves(tmp_path: Path) -> None:
    path = tmp_path / "served.db"
    server = StoreServerProcess(path)
    await asyncio.to_thread(server.start)
    client = LightningStoreClient(server.endpoint)
    reader = None
    try:
        first = await add_rollout(client, 4)
        reader = SqliteLightningStore(path, read_only=True)
        acknowledged = [first]
        for _ in range(5):
            acknowledged.append(await add_rollout(client, 4))
            stored = {r.rollout_id: r for r in await reader.query_rollouts()}
            assert set(acknowledged) <= set(stored)
            assert stored[acknowledged[-1]].status == "succeeded"
            assert len(await reader.query_spans(acknowledged[-1])) == 4
        with pytest.raises(SqliteReadOnlyError):
            await reader.enqueue_rollout(input={})
        assert len(await client.query_rollouts()) == len(acknowledged)  # the server is unaffected
    finally:
        if reader is not None:
            await reader.close()
        await client.close()
        await asyncio.to_thread(server.stop)


async def test_a_closed_store_is_read_without_creating_anything_next_to_it(tmp_path: Path) -> None:
    path = await closed_store(tmp_path / "store.db")
    before = state(path)
    store = SqliteLightningStore(path, read_only=True)
    try:
        assert len(await store.query_rollouts()) == 2
        assert state(path) == before
    finally:
        await store.close()
    assert state(path) == before


async def test_a_closed_store_changed_by_a_later_writer_refuses_reads_until_reopened(tmp_path: Path) -> None:
    path = await closed_store(tmp_path / "store.db", rollouts=1)
    reader = SqliteLightningStore(path, read_only=True)
    try:
        writer = SqliteLightningStore(path)
        await add_rollout(writer, 3)
        assert len(await reader.query_rollouts()) == 1  # the file as it was opened, the new write still in the WAL
        await writer.close()  # moves the write into the file
        with pytest.raises(SqliteStoreError, match="Another process changed the file") as info:
            await reader.query_rollouts()
        assert str(path) in str(info.value)
    finally:
        await reader.close()
    reopened = SqliteLightningStore(path, read_only=True)
    try:
        assert len(await reopened.query_rollouts()) == 2
    finally:
        await reopened.close()


needs_file_modes = pytest.mark.skipif(
    os.geteuid() == 0, reason="root ignores file modes, so a 0555 folder cannot stop its writes"
)


def left_open(path: Path) -> Path:
    """A store file whose process ended without closing it: its last commits are only in the -wal file."""
    code = textwrap.dedent(
        f"""
        import asyncio, os
        from agentbolt.store.sqlite import SqliteLightningStore

        async def main():
            store = SqliteLightningStore({str(path)!r})
            for index in range(3):
                await store.enqueue_rollout(input={{"index": index}})
            os._exit(0)

        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert path.with_name(path.name + "-wal").stat().st_size > 0
    return path


@needs_file_modes
async def test_a_store_left_open_in_a_read_only_folder_is_read_with_its_last_commits(tmp_path: Path) -> None:
    path = left_open(tmp_path / "store.db")
    for file in tmp_path.iterdir():
        file.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        before = state(path), path.with_name(path.name + "-wal").read_bytes()
        store = SqliteLightningStore(path, read_only=True)
        try:
            assert len(await store.query_rollouts()) == 3
        finally:
            await store.close()
        assert (state(path), path.with_name(path.name + "-wal").read_bytes()) == before
    finally:
        tmp_path.chmod(0o755)


@needs_file_modes
async def test_a_store_in_use_whose_shm_file_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    path = left_open(tmp_path / "store.db")
    path.with_name(path.name + "-shm").unlink()
    tmp_path.chmod(0o555)
    try:
        before = state(path)
        with pytest.raises(SqliteStoreError, match="-shm file, which can be neither opened nor created") as info:
            SqliteLightningStore(path, read_only=True)
        assert str(path) in str(info.value)
        assert state(path) == before
    finally:
        tmp_path.chmod(0o755)


# ---------------------------------------------------------------------------------------------------------------------
# writes are refused


def _writes(store: SqliteLightningStore, rollout: Rollout, attempt_id: str) -> List[Callable[[], Awaitable[Any]]]:
    """Every writing method of the store, and writes through its collections."""
    collections = store.collections
    rollout_id = rollout.rollout_id
    span = make_span(rollout_id, attempt_id, 99)

    async def atomic_section() -> None:
        async with collections.atomic(mode="rw"):
            pass

    return [
        lambda: store.start_rollout(input={}),
        lambda: store.enqueue_rollout(input={}),
        lambda: store.enqueue_many_rollouts([EnqueueRolloutRequest(input={})]),
        lambda: store.dequeue_rollout(worker_id="w"),
        lambda: store.dequeue_many_rollouts(limit=2, worker_id="w"),
        lambda: store.start_attempt(rollout_id),
        lambda: store.add_span(span),
        lambda: store.add_many_spans([span]),
        lambda: store.add_spans_with_new_sequence_ids([span]),
        lambda: store.get_next_span_sequence_id(rollout_id, attempt_id),
        lambda: store.get_many_span_sequence_ids([(rollout_id, attempt_id)]),
        lambda: store.add_resources({}),
        lambda: store.update_resources("rs-1", {}),
        lambda: store.update_rollout(rollout_id, status="failed"),
        lambda: store.update_attempt(rollout_id, attempt_id, status="failed"),
        lambda: store.update_worker("w"),
        lambda: store.add_metrics([MetricsRecord(run_id="run", step=1, time=1.0, values={"loss": 1.0})]),
        lambda: collections.rollouts.delete([rollout]),
        lambda: collections.rollout_queue.enqueue([rollout_id]),
        lambda: collections.span_sequence_ids.inc(rollout_id, 1),
        lambda: collections.claim_periodic_run("watchdog", 0.0, time.time()),
        atomic_section,
    ]


async def test_every_write_raises_and_leaves_the_file_unchanged(tmp_path: Path) -> None:
    path = await closed_store(tmp_path / "store.db", rollouts=1)
    before = state(path)
    store = SqliteLightningStore(path, read_only=True)
    try:
        (rollout,) = await store.query_rollouts()
        attempt = await store.get_latest_attempt(rollout.rollout_id)
        assert attempt is not None
        for write in _writes(store, rollout, attempt.attempt_id):
            with pytest.raises(SqliteReadOnlyError, match="opened read-only") as info:
                await write()
            assert str(path) in str(info.value)
        assert await store.get_rollout_by_id(rollout.rollout_id) == rollout  # still readable afterwards
    finally:
        await store.close()
    assert state(path) == before


async def test_writes_refused_while_a_live_store_writes_change_no_row(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    writer = SqliteLightningStore(path)
    rollout_id = await add_rollout(writer, 2)
    reader = SqliteLightningStore(path, read_only=True)
    try:
        counts = [await reader.collections.rollouts.size(), await reader.collections.spans.size()]
        with pytest.raises(SqliteReadOnlyError):
            await reader.enqueue_rollout(input={})
        with pytest.raises(SqliteReadOnlyError):
            await reader.add_span(make_span(rollout_id, "at-none", 9))
        assert [await writer.collections.rollouts.size(), await writer.collections.spans.size()] == counts
    finally:
        await reader.close()
        await writer.close()


async def test_the_watchdog_never_runs_on_a_read_only_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    writer = SqliteLightningStore(path)
    await writer.enqueue_rollout(input={}, config=RolloutConfig(timeout_seconds=0.05))
    running = await writer.dequeue_rollout(worker_id="w")
    assert running is not None
    await writer.close()
    await asyncio.sleep(0.1)  # the attempt is overdue
    before = state(path)
    reader = SqliteLightningStore(path, read_only=True, scan_debounce_seconds=0)
    try:
        attempt = await reader.get_latest_attempt(running.rollout_id)
        assert attempt is not None and attempt.status == running.attempt.status
    finally:
        await reader.close()
    assert state(path) == before
    reopened = SqliteLightningStore(path)  # a writable store's watchdog gives its verdict on the first call
    try:
        attempt = await reopened.get_latest_attempt(running.rollout_id)
        assert attempt is not None and attempt.status == "timeout"
    finally:
        await reopened.close()


# ---------------------------------------------------------------------------------------------------------------------
# files that cannot be read


def test_a_missing_file_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "store.db"
    with pytest.raises(SqliteStoreError, match="No such file") as info:
        SqliteLightningStore(path, read_only=True)
    assert str(path) in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "error", "message"),
    [
        (b"", SqliteDatabaseCorruptError, "The file is empty"),
        (b"not a database\n" * 100, SqliteDatabaseCorruptError, "Not an SQLite database"),
    ],
)
def test_a_file_that_is_not_a_database_is_an_error_and_unchanged(
    tmp_path: Path, content: bytes, error: type, message: str
) -> None:
    path = tmp_path / "store.db"
    path.write_bytes(content)
    with pytest.raises(error, match=message) as info:
        SqliteLightningStore(path, read_only=True)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content and [p.name for p in tmp_path.iterdir()] == ["store.db"]


def test_a_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SqliteStoreError, match="Path is a directory"):
        SqliteLightningStore(tmp_path, read_only=True)


@pytest.mark.parametrize(
    ("statements", "error", "message"),
    [
        (["CREATE TABLE notes (x TEXT)"], SqliteDatabaseCorruptError, "not an agentbolt store"),
        (["PRAGMA user_version = 1"], SqliteDatabaseCorruptError, "holds no agentbolt store"),
    ],
)
def test_a_sqlite_file_that_is_not_a_store_is_an_error_and_unchanged(
    tmp_path: Path, statements: List[str], error: type, message: str
) -> None:
    path = edited(tmp_path / "other.db", *statements)
    before = state(path)
    with pytest.raises(error, match=message) as info:
        SqliteLightningStore(path, read_only=True)
    assert str(path) in str(info.value)
    assert state(path) == before


@pytest.mark.parametrize(("version", "word"), [(SCHEMA_VERSION + 1, "a newer"), (0, "an unknown older")])
async def test_another_schema_version_is_an_error_and_unchanged(tmp_path: Path, version: int, word: str) -> None:
    path = edited(await closed_store(tmp_path / "store.db"), f"UPDATE schema_version SET version = {version}")
    before = state(path)
    with pytest.raises(SqliteSchemaVersionError, match=f"{word} schema version {version}") as info:
        SqliteLightningStore(path, read_only=True)
    assert str(path) in str(info.value)
    assert state(path) == before


async def test_a_file_written_before_the_added_tables_is_read_as_is(tmp_path: Path) -> None:
    """A writable opening would add ``metrics`` and ``store_meta``; reading needs neither, so nothing is added."""
    path = edited(await closed_store(tmp_path / "older.db"), "DROP TABLE metrics", "DROP TABLE store_meta")
    before = state(path)
    store = SqliteLightningStore(path, read_only=True)
    try:
        assert len(await store.query_rollouts()) == 2
        assert list(await store.query_metrics()) == []  # as after the table was added
    finally:
        await store.close()
    assert state(path) == before


async def test_read_snapshot_is_refused(tmp_path: Path) -> None:
    path = await closed_store(tmp_path / "store.db", rollouts=0)
    with pytest.raises(ValueError, match="read_snapshot"):
        SqliteLightningStore(path, read_only=True, read_snapshot=True)
