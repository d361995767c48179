"""SQLite collections and store: schema, durability across reopen, group commit, bad files, parity with memory."""

from __future__ import annotations

import asyncio
import gc
import random
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

from agentbolt.store.collection.memory import InMemoryLightningCollections
from agentbolt.store.collection.sqlite import (
    SCHEMA_VERSION,
    SqliteDatabaseCorruptError,
    SqliteDatabaseLockedError,
    SqliteLightningCollections,
    SqliteSchemaVersionError,
    SqliteStoreError,
)
from agentbolt.types import Attempt, ResourcesUpdate, Rollout, Span, Worker
from agentbolt.types.tracer import OtelResource, TraceStatus

# ---------------------------------------------------------------------------------------------------------------------
# helpers


def make_span(rollout_id: str, attempt_id: str, span_id: str, sequence_id: int, **fields: Any) -> Span:
    values: Dict[str, Any] = dict(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id=fields.pop("trace_id", "t" * 32),
        span_id=span_id,
        parent_id=fields.pop("parent_id", None),
        name=fields.pop("name", "llm"),
        status=TraceStatus(status_code="OK"),
        attributes=fields.pop("attributes", {"k": 1}),
        events=[],
        links=[],
        start_time=fields.pop("start_time", 1.0),
        end_time=fields.pop("end_time", 2.0),
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )
    values.update(fields)
    return Span(**values)


@pytest.fixture
async def sqlite_collections(tmp_path: Path):
    collections = SqliteLightningCollections(tmp_path / "store.db")
    yield collections
    await collections.close()


def rows(path: Path, sql: str, params: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Read committed data with an independent connection (what another process would see)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------------------------------
# schema and files


async def test_new_file_gets_schema_version_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    collections = SqliteLightningCollections(path)
    await collections.close()
    assert rows(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert rows(path, "PRAGMA journal_mode") == [("wal",)]
    tables = {r[0] for r in rows(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"rollouts", "attempts", "spans", "resources", "workers", "rollout_queue", "span_sequence_ids"} <= tables
    indexes = {r[0] for r in rows(path, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"spans_pk", "spans_rollout_id_sequence_id", "attempts_pk"} <= indexes


async def test_missing_folders_of_a_new_file_are_created(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "exp1" / "store.db"
    collections = SqliteLightningCollections(path)
    await collections.close()
    assert rows(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


def test_a_folder_that_cannot_be_created_is_named_in_the_error(tmp_path: Path) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(SqliteStoreError, match=f"Cannot create the folder {blocker}/exp1 of the database"):
        SqliteLightningCollections(blocker / "exp1" / "store.db")
    assert blocker.read_text() == "a file where the folder should be"


async def queued_file_edited(path: Path, statement: str, *params: Any) -> None:
    """A store file holding one queued rollout, then changed by one SQL statement (as another version left it)."""
    collections = SqliteLightningCollections(path)
    await collections.rollout_queue.enqueue(["ro-1"])
    await collections.close()
    conn = sqlite3.connect(path)
    conn.execute(statement, params)
    conn.commit()
    conn.close()


async def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    await queued_file_edited(path, "UPDATE schema_version SET version = ?", SCHEMA_VERSION + 1)
    with pytest.raises(SqliteSchemaVersionError, match=r"newer schema version") as info:
        SqliteLightningCollections(path)
    assert str(path) in str(info.value)
    assert rows(path, "SELECT item FROM rollout_queue") == [('"ro-1"',)]


async def test_a_file_written_before_the_shared_watchdog_claim_gains_its_table(tmp_path: Path) -> None:
    path = tmp_path / "older.db"
    await queued_file_edited(path, "DROP TABLE store_meta")  # the layout of files written before the table existed
    reopened = SqliteLightningCollections(path)
    try:
        assert await reopened.claim_periodic_run("watchdog", 10.0, 100.0) is True
        assert await reopened.rollout_queue.peek() == ["ro-1"]
    finally:
        await reopened.close()
    assert rows(path, "SELECT key, value FROM store_meta") == [("watchdog", 100.0)]
    assert rows(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


async def test_the_watchdog_runs_once_per_period_among_processes_sharing_the_file(tmp_path: Path) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore

    path = tmp_path / "shared.db"
    stores = [SqliteLightningStore(path, scan_debounce_seconds=1.0) for _ in range(3)]  # like three server workers
    try:
        for store in stores:
            assert await store._should_scan_for_unhealthy_rollouts() is True  # the first scan of each object
        now = 1000.0
        claims = [await s.collections.claim_periodic_run("watchdog", 1.0, now) for s in stores]
        assert claims == [True, False, False]
        # A period later exactly one of them wins the next claim.
        later = [await s.collections.claim_periodic_run("watchdog", 1.0, now + 1.0) for s in stores]
        assert later == [True, False, False]
        # Through the stores' own debounce: once it lets each of them try again, exactly one scans.
        await asyncio.sleep(1.1)
        assert sorted([await s._should_scan_for_unhealthy_rollouts() for s in stores]) == [False, False, True]
    finally:
        for store in stores:
            await store.close()


async def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (x TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    with pytest.raises(SqliteDatabaseCorruptError, match="not an agentbolt store"):
        SqliteLightningCollections(path)
    assert rows(path, "SELECT x FROM notes") == [("keep me",)]


@pytest.mark.parametrize("content", [b"this is not a database at all\n" * 200, b"x", b"SQLite"])
async def test_non_sqlite_file_gives_clear_error_and_is_untouched(tmp_path: Path, content: bytes) -> None:
    # SQLite itself takes a file shorter than its header for a new database and writes over it.
    path = tmp_path / "garbage.db"
    path.write_bytes(content)
    with pytest.raises(SqliteDatabaseCorruptError) as info:
        SqliteLightningCollections(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


async def test_corrupt_pages_surface_as_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    collections = SqliteLightningCollections(path)
    await collections.spans.insert(
        [make_span("ro-1", "at-1", f"s{i}", i, attributes={"x": "y" * 500}) for i in range(400)]
    )
    await collections.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(3 * page, len(data) - page, page):  # keep the schema pages, smash the rest
        data[offset : offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(SqliteDatabaseCorruptError) as info:
        reopened = SqliteLightningCollections(path)
        try:
            await reopened.spans.query(filter={"rollout_id": {"exact": "ro-1"}})
        finally:
            await reopened.close()
    assert str(path) in str(info.value)


async def test_locked_file_gives_clear_error_without_changes(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    collections = SqliteLightningCollections(path)
    await collections.rollout_queue.enqueue(["ro-a", "ro-b"])
    await collections.close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sqlite3, sys, time
                conn = sqlite3.connect({str(path)!r}, isolation_level=None)
                conn.execute("BEGIN EXCLUSIVE")
                print("locked", flush=True)
                sys.stdin.readline()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(SqliteDatabaseLockedError) as info:
            SqliteLightningCollections(path, busy_timeout=0.2)
        assert str(path) in str(info.value)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=10)
    reopened = SqliteLightningCollections(path)
    try:
        assert await reopened.rollout_queue.peek(10) == ["ro-a", "ro-b"]
    finally:
        await reopened.close()


async def test_synchronous_full_is_applied(tmp_path: Path) -> None:
    collections = SqliteLightningCollections(tmp_path / "full.db", synchronous="FULL")
    try:
        async with collections.atomic():  # reads inside a write section use the writing connection
            level = await collections.rollouts._read(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        assert level == 2  # FULL
        await collections.rollout_queue.enqueue(["ro-1"])
        assert await collections.rollout_queue.peek() == ["ro-1"]
    finally:
        await collections.close()


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteLightningCollections(tmp_path / "a.db", synchronous="SOMETIMES")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reader_threads"):
        SqliteLightningCollections(tmp_path / "a.db", reader_threads=0)


# ---------------------------------------------------------------------------------------------------------------------
# transactions


async def test_concurrent_sections_are_grouped_and_acknowledged_only_after_commit(tmp_path: Path) -> None:
    path = tmp_path / "group.db"
    collections = SqliteLightningCollections(path)
    seen_committed: List[bool] = []

    async def section(i: int) -> None:
        async with collections.atomic(mode="rw", labels=["rollouts", "rollout_queue"]) as c:
            await c.rollouts.insert([Rollout(rollout_id=f"ro-{i:03d}", input=i, start_time=float(i))])
            await c.rollout_queue.enqueue([f"ro-{i:03d}"])
            await c.span_sequence_ids.inc("ro-counted", 1)
        # Acknowledged: an independent connection must already see it.
        seen_committed.append(
            rows(path, "SELECT COUNT(*) FROM rollouts WHERE rollout_id = ?", (f"ro-{i:03d}",)) == [(1,)]
        )

    try:
        await collections.rollouts.insert([Rollout(rollout_id="ro-counted", input=None, start_time=0.0)])
        sections_before, commits_before = collections.section_count, collections.commit_count
        await asyncio.gather(*(section(i) for i in range(60)))
        assert seen_committed == [True] * 60
        assert collections.section_count - sections_before == 60
        assert 1 <= collections.commit_count - commits_before < 60  # grouped
        assert await collections.span_sequence_ids.get("ro-counted") == 60
        assert await collections.rollout_queue.size() == 60
    finally:
        await collections.close()


async def test_failed_section_is_rolled_back_while_its_group_commits(
    sqlite_collections: SqliteLightningCollections,
) -> None:
    c = sqlite_collections
    await c.rollouts.insert([Rollout(rollout_id="bad", input=None, start_time=0.0)])

    async def good(i: int) -> None:
        async with c.atomic() as cols:
            await cols.rollout_queue.enqueue([f"good-{i}"])

    async def bad() -> None:
        async with c.atomic() as cols:
            await cols.rollout_queue.enqueue(["bad"])
            await cols.span_sequence_ids.set("bad", 1)
            raise RuntimeError("boom")

    results = await asyncio.gather(good(0), bad(), good(1), return_exceptions=True)
    assert isinstance(results[1], RuntimeError)
    assert await c.rollout_queue.peek(10) == ["good-0", "good-1"]
    assert not await c.span_sequence_ids.has("bad")


async def test_a_section_cancelled_while_its_transaction_opens_leaves_the_writer_usable(tmp_path: Path) -> None:
    # The writer thread is kept busy, so the section's BEGIN is still queued when its task is cancelled; the BEGIN
    # runs afterwards all the same, and must not leave a transaction open behind the next section's back.
    collections = SqliteLightningCollections(tmp_path / "cancelled.db")
    try:
        await collections.rollouts.insert([Rollout(rollout_id="ro", input=None, start_time=0.0)])

        async def section(name: str) -> None:
            async with collections.atomic() as c:
                await c.rollout_queue.enqueue([name])

        collections._db._loop.call_soon_threadsafe(time.sleep, 0.3)
        cancelled = asyncio.create_task(section("cancelled"))
        await asyncio.sleep(0.1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await section("after")
        assert await collections.rollout_queue.peek(10) == ["after"]
    finally:
        await collections.close()


async def test_sections_cancelled_at_any_moment_never_break_the_ones_that_finish(tmp_path: Path) -> None:
    collections = SqliteLightningCollections(tmp_path / "cancelled-many.db")
    rng = random.Random(7)
    finished: List[str] = []

    async def section(name: str) -> None:
        async with collections.atomic() as c:
            await c.rollout_queue.enqueue([name])
            await c.rollout_queue.enqueue([f"{name}/second"])
        finished.append(name)

    try:
        for round_ in range(30):
            tasks = [asyncio.create_task(section(f"r{round_}-{i}")) for i in range(8)]
            await asyncio.sleep(rng.random() * 0.002)
            for task in rng.sample(tasks, 3):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await section("last")
        queued = await collections.rollout_queue.peek(1000)
        # Every section that finished is stored; a cancelled one is stored whole or not at all.
        firsts = [name for name in queued if not name.endswith("/second")]
        assert set(finished) <= set(firsts)
        assert queued == [item for name in firsts for item in (name, f"{name}/second")]
        assert firsts[-1] == "last"
    finally:
        await collections.close()


async def test_a_group_is_committed_when_the_section_that_was_to_commit_it_gives_up(tmp_path: Path) -> None:
    # The first section finishes while a second waits at the gate, so it leaves its commit to the second; the second
    # is cancelled before it gets the gate. The first must still be committed and answered.
    collections = SqliteLightningCollections(tmp_path / "left.db")
    in_body, finish = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with collections.atomic() as c:
            await c.rollout_queue.enqueue(["first"])
            in_body.set()
            await finish.wait()

    async def second() -> None:
        async with collections.atomic() as c:
            await c.rollout_queue.enqueue(["second"])

    try:
        first_task = asyncio.create_task(first())
        await in_body.wait()
        second_task = asyncio.create_task(second())
        await asyncio.sleep(0.05)  # the second section waits at the gate
        finish.set()
        await asyncio.sleep(0)  # the first section ends and hands the gate to the second...
        second_task.cancel()  # ...which gives up before it runs
        await asyncio.wait_for(first_task, timeout=10)
        with pytest.raises(asyncio.CancelledError):
            await second_task
        assert rows(tmp_path / "left.db", "SELECT COUNT(*) FROM rollout_queue") == [(1,)]
        assert await collections.rollout_queue.peek(10) == ["first"]
    finally:
        await collections.close()


async def test_duplicate_insert_inserts_nothing(sqlite_collections: SqliteLightningCollections) -> None:
    from agentbolt.store.collection.base import DuplicatedPrimaryKeyError

    c = sqlite_collections
    await c.rollouts.insert([Rollout(rollout_id="ro-1", input=1, start_time=1.0)])
    with pytest.raises(DuplicatedPrimaryKeyError):
        await c.rollouts.insert(
            [Rollout(rollout_id="ro-2", input=2, start_time=2.0), Rollout(rollout_id="ro-1", input=3, start_time=3.0)]
        )
    with pytest.raises(DuplicatedPrimaryKeyError):
        await c.rollouts.insert(
            [Rollout(rollout_id="ro-3", input=2, start_time=2.0), Rollout(rollout_id="ro-3", input=3, start_time=3.0)]
        )
    assert [r.rollout_id for r in await c.rollouts.query()] == ["ro-1"]
    with pytest.raises(ValueError, match=r"Item does not exist with primary key\(s\): rollout_id='ro-9'"):
        await c.rollouts.update(
            [Rollout(rollout_id="ro-1", input=5, start_time=1.0), Rollout(rollout_id="ro-9", input=0, start_time=0.0)]
        )
    assert (await c.rollouts.get({"rollout_id": {"exact": "ro-1"}})).input == 1  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        await c.rollouts.insert([Worker(worker_id="w")])  # type: ignore[list-item]


async def test_reopen_keeps_queue_order_counters_and_items(tmp_path: Path) -> None:
    path = tmp_path / "reopen.db"
    first = SqliteLightningCollections(path)
    await first.rollouts.insert([Rollout(rollout_id="ro-a", input=None, start_time=0.0)])
    await first.rollout_queue.enqueue(["ro-c", "ro-a", "ro-b"])
    assert await first.rollout_queue.dequeue() == ["ro-c"]
    await first.span_sequence_ids.chmax("ro-a", 7)
    assert await first.span_sequence_ids.inc("ro-a", 1) == 8
    await first.workers.upsert([Worker(worker_id="w1", status="busy")])
    await first.close()

    second = SqliteLightningCollections(path)
    try:
        await second.rollout_queue.enqueue(["ro-d"])
        assert await second.rollout_queue.peek(10) == ["ro-a", "ro-b", "ro-d"]
        assert await second.span_sequence_ids.inc("ro-a", 1) == 9
        assert await second.span_sequence_ids.chmax("ro-a", 3) == 9
        worker = await second.workers.get({"worker_id": {"exact": "w1"}})
        assert worker is not None and worker.status == "busy"
    finally:
        await second.close()


async def test_close_acknowledges_sections_waiting_for_a_group_commit(tmp_path: Path) -> None:
    path = tmp_path / "closing.db"
    collections = SqliteLightningCollections(path)

    async def section(i: int) -> None:
        async with collections.atomic() as c:
            await c.rollout_queue.enqueue([f"ro-{i:02d}"])

    sections = [asyncio.create_task(section(i)) for i in range(20)]
    await asyncio.sleep(0)  # every section is queued at the write gate before close() is
    await asyncio.wait_for(asyncio.gather(collections.close(), *sections), timeout=60)
    reopened = SqliteLightningCollections(path)
    try:
        assert await reopened.rollout_queue.peek(50) == [f"ro-{i:02d}" for i in range(20)]
    finally:
        await reopened.close()


async def test_closed_store_rejects_calls(tmp_path: Path) -> None:
    collections = SqliteLightningCollections(tmp_path / "closed.db")
    await collections.close()
    with pytest.raises(RuntimeError, match="closed"):
        await collections.rollouts.size()


def test_collections_dropped_without_closing_close_their_file_and_stop_their_threads(tmp_path: Path) -> None:
    path = tmp_path / "dropped.db"

    def store_threads() -> Set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name.startswith("agentbolt-sqlite")}

    threads_before = store_threads()
    collections = SqliteLightningCollections(path)

    async def use(opened: SqliteLightningCollections) -> None:
        async with opened.atomic() as c:
            await c.rollout_queue.enqueue(["ro-kept"])
        assert await opened.rollout_queue.peek(1) == ["ro-kept"]  # a read starts a reader thread

    asyncio.run(use(collections))
    assert store_threads() - threads_before
    del collections
    gc.collect()
    deadline = time.monotonic() + 30
    while store_threads() - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not store_threads() - threads_before
    assert not Path(f"{path}-wal").exists()  # the last connection closed, which checkpoints and removes the log

    async def reopen() -> None:
        reopened = SqliteLightningCollections(path)
        try:
            assert await reopened.rollout_queue.peek(1) == ["ro-kept"]
        finally:
            await reopened.close()

    asyncio.run(reopen())


# ---------------------------------------------------------------------------------------------------------------------
# parity with the in-memory collections


def _dataset(seed: int) -> Dict[str, List[Any]]:
    rng = random.Random(seed)
    statuses = ["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]
    rollouts = [
        Rollout(
            rollout_id=f"ro-{rng.randrange(16**4):04x}{i}",
            input={"n": i},
            start_time=float(rng.choice([1, 2, 3, 4])),
            end_time=rng.choice([None, 5.0, 6.0]),
            mode=rng.choice([None, "train", "val"]),
            resources_id=rng.choice([None, "rs-1", "rs-2"]),
            status=rng.choice(statuses),  # type: ignore[arg-type]
        )
        for i in range(40)
    ]
    attempts = [
        Attempt(
            rollout_id=r.rollout_id,
            attempt_id=f"at-{j}{rng.randrange(100)}",
            sequence_id=j + 1,
            start_time=float(rng.choice([1, 2, 3])),
            status=rng.choice(["preparing", "running", "failed", "succeeded", "timeout"]),  # type: ignore[arg-type]
            worker_id=rng.choice([None, "w-1", "w-2"]),
            last_heartbeat_time=rng.choice([None, 1.5, 2.5]),
        )
        for r in rollouts[:25]
        for j in range(rng.randrange(1, 4))
    ]
    spans = [
        make_span(
            a.rollout_id,
            a.attempt_id,
            f"sp-{k}",
            rng.randrange(1, 6),
            name=rng.choice(["llm", "tool", "reward", "agentbolt.reward"]),
            parent_id=rng.choice([None, "sp-0", "sp-1"]),
            trace_id=rng.choice(["t" * 32, "a" * 32]),
            start_time=rng.choice([None, 1.0, 2.0]),
            attributes={"k": rng.randrange(3)},
        )
        for a in attempts
        for k in range(rng.randrange(0, 5))
    ]
    workers = [
        Worker(
            worker_id=f"w-{i}",
            status=rng.choice(["idle", "busy", "unknown"]),  # type: ignore[arg-type]
            last_idle_time=rng.choice([None, 3.0, 1.0]),
            current_rollout_id=rng.choice([None, "ro-x"]),
        )
        for i in range(12)
    ]
    resources = [
        ResourcesUpdate(
            resources_id=f"rs-{i}",
            create_time=1.0,
            update_time=float(rng.randrange(4)),
            version=rng.randrange(1, 3),
            resources={},
        )
        for i in range(8)
    ]
    return {"rollouts": rollouts, "attempts": attempts, "spans": spans, "workers": workers, "resources": resources}


PARITY_QUERIES: Dict[str, List[Dict[str, Any]]] = {
    "rollouts": [
        {},
        {"filter": {"status": {"within": ["running", "queuing"]}}},
        {"filter": {"status": {"within": []}}},
        {"filter": {"status": {"exact": "failed"}, "rollout_id": {"contains": "a"}, "_aggregate": "or"}},
        {
            "filter": {"rollout_id": {"contains": "1", "within": ["x"]}, "_aggregate": "or"},
            "sort": {"name": "start_time", "order": "desc"},
        },
        {"filter": {"rollout_id": {"contains": "1"}, "_must": {"status": {"within": ["running", "failed"]}}}},
        {"sort": {"name": "end_time", "order": "asc"}, "limit": 7, "offset": 3},
        {"sort": {"name": "end_time", "order": "desc"}},
        {"sort": {"name": "mode", "order": "asc"}},
        {"sort": {"name": "resources_id", "order": "desc"}, "limit": 0},
        {"sort": {"name": "status", "order": "asc"}, "offset": 38},
        {"filter": {"mode": {"exact": "train"}}, "sort": {"name": "rollout_id", "order": "asc"}},
        {"filter": {"input": {"exact": {"n": 3}}}},  # not a column: evaluated in Python
        {"filter": {"status": {"exact": 1}}},  # type mismatch: same answer as Python
        {"sort": {"name": "input", "order": "asc"}},  # no column: sorted in Python
        {"sort": {"name": "nope", "order": "asc"}},  # unknown field -> ValueError
        {"limit": -2},  # invalid -> ValueError
        {"offset": -1},
    ],
    "attempts": [
        {"filter": {"rollout_id": {"exact": "ro-x"}}},
        {"sort": {"name": "sequence_id", "order": "desc"}},
        {"filter": {"worker_id": {"within": ["w-1", None]}}, "sort": {"name": "worker_id", "order": "asc"}},
        {
            "filter": {"status": {"within": ["failed", "timeout"]}, "worker_id": {"exact": "w-2"}},
            "sort": {"name": "last_heartbeat_time", "order": "asc"},
        },
        {"filter": {"sequence_id": {"exact": 2.0}}},
        {"filter": {"sequence_id": {"within": [1, True]}}, "sort": {"name": "start_time", "order": "desc"}, "limit": 5},
    ],
    "spans": [
        {"sort": {"name": "sequence_id", "order": "asc"}},
        {
            "filter": {"name": {"contains": "reward"}, "parent_id": {"exact": "sp-0"}, "_aggregate": "or"},
            "sort": {"name": "sequence_id", "order": "desc"},
        },
        {"filter": {"parent_id": {"contains": "sp"}, "trace_id": {"exact": "a" * 32}}},
        {"sort": {"name": "parent_id", "order": "asc"}},
        {"sort": {"name": "start_time", "order": "desc"}, "limit": 10, "offset": 5},
        {"filter": {"attributes": {"contains": "k"}}},
        {"filter": {"name": {"contains": ""}}},
        {"filter": {"name": {"contains": 3}}},
    ],
    "workers": [
        {
            "filter": {"status": {"within": ["idle", "busy"]}, "worker_id": {"contains": "1"}, "_aggregate": "or"},
            "sort": {"name": "last_idle_time", "order": "desc"},
        },
        {"sort": {"name": "current_rollout_id", "order": "desc"}},
    ],
    "resources": [
        {"sort": {"name": "update_time", "order": "desc"}},
        {"filter": {"resources_id": {"exact": "rs-3", "contains": "rs"}}},
        {"sort": {"name": "version", "order": "asc"}, "limit": 3},
    ],
}


async def _outcome(collection: Any, query: Dict[str, Any], use_get: bool) -> Any:
    try:
        if use_get:
            item = await collection.get(query.get("filter"), query.get("sort"))
            return None if item is None else item.model_dump()
        result = await collection.query(
            query.get("filter"), query.get("sort"), query.get("limit", -1), query.get("offset", 0)
        )
        return (result.total, [item.model_dump() for item in result])
    except (ValueError, TypeError) as exc:
        return type(exc).__name__


@pytest.mark.parametrize("seed", [0, 1])
async def test_query_parity_with_memory_collections(tmp_path: Path, seed: int) -> None:
    data = _dataset(seed)
    memory = InMemoryLightningCollections()
    sqlite = SqliteLightningCollections(tmp_path / "parity.db")
    try:
        for name, items in data.items():
            for target in (memory, sqlite):
                collection = getattr(target, name)
                await collection.insert(items[: len(items) // 2])
                await collection.insert(items[len(items) // 2 :])
        # Updates and replacements keep each item's position in insertion order.
        for target in (memory, sqlite):
            changed = data["rollouts"][3].model_copy(update={"status": "cancelled"})
            await target.rollouts.upsert([changed])
            await target.rollouts.update([data["rollouts"][5]], update_fields=["status"])
            await target.workers.delete([data["workers"][0]])
        checked = 0
        for name, queries in PARITY_QUERIES.items():
            for query in queries:
                for use_get in (False, True):
                    expected = await _outcome(getattr(memory, name), query, use_get)
                    actual = await _outcome(getattr(sqlite, name), query, use_get)
                    assert actual == expected, (name, query, use_get)
                    checked += 1
        assert checked == 2 * sum(len(q) for q in PARITY_QUERIES.values())
    finally:
        await sqlite.close()


async def test_upsert_modes_match_memory(tmp_path: Path) -> None:
    memory = InMemoryLightningCollections()
    sqlite = SqliteLightningCollections(tmp_path / "upsert.db")
    try:
        outcomes: List[List[Any]] = []
        for target in (memory, sqlite):
            w = target.workers
            got: List[Any] = []
            got.append([x.model_dump() for x in await w.upsert([Worker(worker_id="a", status="idle")])])
            got.append(
                [
                    x.model_dump()
                    for x in await w.upsert(
                        [Worker(worker_id="a", status="busy", last_idle_time=4.0)], update_fields=["status"]
                    )
                ]
            )
            got.append(
                [
                    x.model_dump()
                    for x in await w.upsert([Worker(worker_id="a"), Worker(worker_id="b")], update_fields=[])
                ]
            )
            got.append(
                [
                    x.model_dump()
                    for x in await w.update(
                        [Worker(worker_id="b", last_busy_time=2.0)], update_fields=["last_busy_time"]
                    )
                ]
            )
            try:
                await w.update([Worker(worker_id="a")], update_fields=["bogus"])
            except ValueError as exc:
                got.append(type(exc).__name__)
            got.append([x.model_dump() for x in await w.query()])
            kv = target.span_sequence_ids
            await target.rollouts.insert([Rollout(rollout_id="r", input=None, start_time=0.0)])
            got.append([await kv.inc("unknown", 2), await kv.chmax("unknown", 3), await kv.has("unknown")])
            got.append(
                [
                    await kv.inc("r", 2),
                    await kv.chmax("r", 1),
                    await kv.chmax("r", 10),
                    await kv.pop("r"),
                    await kv.pop("r", -1),
                ]
            )
            try:
                await kv.inc("r", True)  # type: ignore[arg-type]
            except TypeError as exc:
                got.append(type(exc).__name__)
            q = target.rollout_queue
            await q.enqueue(["x", "y", "x"])
            got.append([await q.has("x"), await q.dequeue(0), await q.dequeue(2), await q.peek(5), await q.size()])
            try:
                await q.has(3)  # type: ignore[arg-type]
            except TypeError as exc:
                got.append(type(exc).__name__)
            outcomes.append(got)
        assert outcomes[0] == outcomes[1]
    finally:
        await sqlite.close()


async def test_large_within_filter(sqlite_collections: SqliteLightningCollections) -> None:
    ids = [f"ro-{i}" for i in range(1500)]
    await sqlite_collections.rollouts.insert([Rollout(rollout_id=i, input=None, start_time=0.0) for i in ids[::3]])
    result = await sqlite_collections.rollouts.query(filter={"rollout_id": {"within": ids}})
    assert result.total == 500


# ---------------------------------------------------------------------------------------------------------------------
# the store


async def test_store_capabilities_and_statistics(tmp_path: Path) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore

    store = SqliteLightningStore(tmp_path / "caps.db")
    try:
        assert store.capabilities == {"thread_safe": True, "async_safe": True, "zero_copy": False, "otlp_traces": False}
        rollout = await store.start_rollout({"q": 1})
        await store.add_span(make_span(rollout.rollout_id, rollout.attempt.attempt_id, "s1", 1))
        stats = await store.statistics()
        assert stats["name"] == "SqliteLightningStore"
        assert (stats["total_rollouts"], stats["total_attempts"], stats["total_spans"]) == (1, 1, 1)
    finally:
        await store.close()


async def test_store_reopen_resumes_queue_attempts_watchdog_resources_and_counters(tmp_path: Path) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore
    from agentbolt.types import RolloutConfig

    path = tmp_path / "resume.db"
    store = SqliteLightningStore(path, scan_debounce_seconds=0)
    watched_config = RolloutConfig(unresponsive_seconds=0.2, max_attempts=2, retry_condition=["unresponsive"])
    await store.add_resources({})
    latest = await store.update_resources("rs-latest", {})
    first = await store.enqueue_rollout({"n": 1})
    watched = await store.enqueue_rollout({"n": 2}, config=watched_config)
    queued = [await store.enqueue_rollout({"n": n}) for n in range(3, 6)]
    assert (await store.dequeue_rollout(worker_id="w1")).rollout_id == first.rollout_id  # type: ignore[union-attr]
    running = await store.dequeue_rollout(worker_id="w2")
    assert running is not None and running.rollout_id == watched.rollout_id
    sequence_ids = await store.get_many_span_sequence_ids([(running.rollout_id, running.attempt.attempt_id)] * 3)
    await store.add_span(make_span(running.rollout_id, running.attempt.attempt_id, "s1", sequence_ids[-1]))
    assert (await store.get_latest_attempt(running.rollout_id)).status == "running"  # type: ignore[union-attr]
    await store.close()

    await asyncio.sleep(0.3)  # the running attempt goes silent for longer than unresponsive_seconds
    store = SqliteLightningStore(path, scan_debounce_seconds=0)
    try:
        assert (await store.get_latest_resources()).resources_id == latest.resources_id  # type: ignore[union-attr]
        # The watchdog resumed from the stored heartbeat: unresponsive, then requeued behind the waiting rollouts.
        attempt = await store.get_latest_attempt(watched.rollout_id)
        assert attempt is not None and attempt.status == "unresponsive"
        assert (await store.get_rollout_by_id(watched.rollout_id)).status == "requeuing"  # type: ignore[union-attr]
        claimed = [await store.dequeue_rollout() for _ in range(5)]
        assert [c.rollout_id if c else None for c in claimed] == [
            *(r.rollout_id for r in queued),
            watched.rollout_id,
            None,
        ]
        assert claimed[3] is not None and claimed[3].attempt.sequence_id == 2
        # Sequence ids are never reissued.
        assert await store.get_next_span_sequence_id(watched.rollout_id, "any") == sequence_ids[-1] + 1
    finally:
        await store.close()


async def test_store_is_usable_from_several_threads_and_loops(tmp_path: Path) -> None:
    import threading

    from agentbolt.store.sqlite import SqliteLightningStore

    store = SqliteLightningStore(tmp_path / "threads.db")
    errors: List[BaseException] = []

    def worker(k: int) -> None:
        async def run() -> None:
            for i in range(20):
                rollout = await store.start_rollout({"thread": k, "i": i})
                await store.add_span(make_span(rollout.rollout_id, rollout.attempt.attempt_id, "s", 1))
                await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    await asyncio.gather(*(store.enqueue_rollout({"main": i}) for i in range(20)))
    for thread in threads:
        await asyncio.to_thread(thread.join)
    try:
        assert errors == []
        succeeded = await store.query_rollouts(status_in=["succeeded"])
        assert len(succeeded) == 60
        assert len(await store.query_rollouts(status_in=["queuing"])) == 20
    finally:
        await store.close()


async def test_store_acknowledges_only_committed_writes(tmp_path: Path) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore

    path = tmp_path / "ack.db"
    store = SqliteLightningStore(path)
    try:

        async def enqueue(i: int) -> None:
            rollout = await store.enqueue_rollout({"i": i})
            assert rows(path, "SELECT status FROM rollouts WHERE rollout_id = ?", (rollout.rollout_id,)) == [
                ("queuing",)
            ]

        await asyncio.gather(*(enqueue(i) for i in range(40)))
        assert store.collections.commit_count <= store.collections.section_count
    finally:
        await store.close()


async def test_operations_hand_work_over_once_and_never_run_sqlite_on_the_callers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from agentbolt.store.collection import sqlite as sqlite_module
    from agentbolt.store.sqlite import SqliteLightningStore

    sqlite_threads: List[int] = []
    guard = sqlite_module._Database._guard

    def recording_guard(self: Any, fn: Any, conn: sqlite3.Connection) -> Any:
        sqlite_threads.append(threading.get_ident())
        return guard(self, fn, conn)

    monkeypatch.setattr(sqlite_module._Database, "_guard", recording_guard)
    store = SqliteLightningStore(tmp_path / "hops.db")
    database = store.collections._db
    reader_jobs: List[str] = []
    submit = database._readers.submit

    def counting_submit(fn: Any, *args: Any) -> Any:
        reader_jobs.append(fn.__name__)
        return submit(fn, *args)

    monkeypatch.setattr(database._readers, "submit", counting_submit)
    try:
        started = await store.start_rollout({"x": 1})
        await store.enqueue_rollout({"x": 2})
        await store.add_resources({})

        async def jobs_of(call: Any) -> List[str]:
            reader_jobs.clear()
            await call
            return list(reader_jobs)

        # Reads of several queries run as a whole on one reader thread.
        assert await jobs_of(store.get_rollout_by_id(started.rollout_id)) == ["_run_read_operation"]
        assert await jobs_of(store.query_rollouts()) == ["_run_read_operation"]
        assert await jobs_of(store.get_latest_resources()) == ["_run_read_operation"]
        # Dequeue checks the queue on the writer thread's own read-only connection.
        claimed = await jobs_of(store.dequeue_rollout())
        assert claimed == []
        assert (await store.get_rollout_by_id(started.rollout_id)) is not None
        assert threading.get_ident() not in sqlite_threads
    finally:
        await store.close()


async def test_reads_on_the_writer_thread_see_only_committed_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collections = SqliteLightningCollections(tmp_path / "committed.db")
    seen: List[Any] = []

    def no_hand_off(*args: Any) -> Any:
        raise AssertionError("a read on the writer thread was handed to a reader thread")

    monkeypatch.setattr(collections._db._readers, "submit", no_hand_off)

    async def write_slowly() -> None:
        async with collections.atomic(mode="rw") as c:
            await c.rollouts.insert([Rollout(rollout_id="ro-pending", input=1, start_time=1.0)])
            await asyncio.sleep(0.3)

    async def read_meanwhile() -> None:
        await asyncio.sleep(0.1)
        async with collections.atomic(mode="r") as c:
            seen.append(await c.rollouts.get(filter={"rollout_id": {"exact": "ro-pending"}}))

    try:
        await asyncio.gather(collections.run_on_writer(write_slowly), collections.run_on_writer(read_meanwhile))
        assert seen == [None]  # the write's transaction was still open
        await collections.run_on_writer(read_meanwhile)
        assert seen[1] is not None and seen[1].rollout_id == "ro-pending"
    finally:
        await collections.close()
