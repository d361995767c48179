"""What only the PostgreSQL store does: migrations, start-up errors, cross-process wake-ups and watchdog, compact
payloads, and a PostgreSQL restart in the middle of a load served over HTTP.

The semantics every backend shares are in test_semantics.py (run on PostgreSQL too); these tests use the session's
real PostgreSQL server (see conftest.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Dict, List, Set

import orjson
import pytest
from support.servers import free_port

from agentbolt.store.http import LightningStoreClient, LightningStoreServer
from agentbolt.store.requests import QuerySpansRequest
from agentbolt.types import EnqueueRolloutRequest, Span

from .conftest import drop_postgres_schema, make_span, postgres_schema, postgres_server

postgres = pytest.importorskip("agentbolt.store.postgres")
collection = pytest.importorskip("agentbolt.store.collection.postgres")


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    name = postgres_schema()
    yield name
    drop_postgres_schema(name)


def open_store(schema: str, **kwargs: Any) -> Any:
    return postgres.PostgresLightningStore(postgres_server().dsn(), schema=schema, **kwargs)


def record_statements(monkeypatch: Any) -> List[str]:
    """The statements every PostgreSQL connection sends from now on (each is a round trip to the server)."""
    import psycopg

    sent: List[str] = []
    execute = psycopg.AsyncConnection.execute

    async def recording(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", recording)
    return sent


async def test_migrations_are_recorded_and_applied_once(schema: str) -> None:
    first = open_store(schema)
    assert first.collections.migrated_from == 0
    await first.close()
    second = open_store(schema)
    assert second.collections.migrated_from == collection.SCHEMA_VERSION
    await second.close()
    rows = postgres_server().psql(f"SELECT version, description FROM {schema}.schema_migrations ORDER BY version")
    assert rows.splitlines() == [f"{m.version}|{m.description}" for m in collection.MIGRATIONS]


async def test_a_schema_from_a_newer_version_is_refused_untouched(schema: str) -> None:
    (await _closed(open_store(schema)))
    server = postgres_server()
    server.psql(f"INSERT INTO {schema}.schema_migrations VALUES (999, 'from the future', 0)")
    with pytest.raises(postgres.PostgresSchemaVersionError, match=r"newer version of agentbolt.*999"):
        open_store(schema)
    assert server.psql(f"SELECT max(version) FROM {schema}.schema_migrations").strip() == "999"


async def test_payloads_written_as_jsonb_read_back_after_the_upgrade_to_json(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as version_2:
        version_2.setattr(collection, "MIGRATIONS", collection.MIGRATIONS[:2])
        version_2.setattr(collection, "SCHEMA_VERSION", 2)
        store = open_store(schema)
        rollout = await store.start_rollout({"question": "2+2", "hints": ["a", 1.5, None]}, metadata={"z": 1, "a": 2})
        await store.close()
    server = postgres_server()
    column_type = f"SELECT data_type FROM information_schema.columns WHERE table_schema = '{schema}' AND "
    assert server.psql(column_type + "table_name = 'rollouts' AND column_name = 'data'").strip() == "jsonb"
    store = open_store(schema)
    try:
        assert store.collections.migrated_from == 2
        assert server.psql(column_type + "column_name = 'data'").split() == ["json"] * 6
        read = await store.get_rollout_by_id(rollout.rollout_id)
        assert read is not None and read.input == rollout.input and read.metadata == {"z": 1, "a": 2}
    finally:
        await store.close()


async def test_nul_in_ids_and_names_is_a_clear_error_that_changes_nothing(schema: str) -> None:
    inner = open_store(schema)
    server = LightningStoreServer(inner, host="127.0.0.1", port=free_port())
    await server.start()
    client = LightningStoreClient(server.endpoint, retry_delays=(), health_retry_delays=())
    try:
        rollout = await inner.start_rollout("x")
        nul_name = make_span(rollout.rollout_id, rollout.attempt.attempt_id, 1, "s1", name="llm\x00call")
        for store in (inner, client):  # over HTTP: a 400 carrying the same message
            with pytest.raises(ValueError, match=r"cannot hold the NUL character"):
                await store.add_span(nul_name)
            with pytest.raises(ValueError, match=r"cannot hold the NUL character"):
                await store.update_resources("res\x00", {})
            with pytest.raises(ValueError, match=r"cannot hold the NUL character"):
                await store.update_worker("worker\x00")
        with pytest.raises(ValueError, match=r"cannot hold the NUL character"):
            await inner.get_rollout_by_id("ro-\x00")
        assert await client.get_rollout_by_id("ro-\x00") is None  # the client's lookups answer None on errors
        assert len(await inner.query_spans(rollout.rollout_id)) == 0
        assert await inner.get_rollout_by_id(rollout.rollout_id) is not None
    finally:
        await client.close()
        await server.stop()
        await inner.close()


async def test_wrong_dsn_is_one_clear_error_without_the_password() -> None:
    server = postgres_server()
    with pytest.raises(postgres.PostgresConnectionError, match='database "no_such_db" does not exist') as info:
        postgres.PostgresLightningStore(server.dsn("no_such_db", password="s3cret"))
    assert "s3cret" not in str(info.value) and "***" in str(info.value)
    with pytest.raises(postgres.PostgresConnectionError, match="Cannot connect"):
        postgres.PostgresLightningStore(f"host=127.0.0.1 port={free_port()} dbname=x connect_timeout=2")


async def test_missing_privileges_are_one_clear_error() -> None:
    server = postgres_server()
    role = "limited_" + uuid.uuid4().hex[:8]
    server.psql(f"CREATE ROLE {role} LOGIN")
    try:
        dsn = server.dsn().replace("user=agentbolt", f"user={role}")
        with pytest.raises(postgres.PostgresPermissionError, match=r"lacks a privilege.*Grant it CREATE"):
            postgres.PostgresLightningStore(dsn, schema=postgres_schema())
    finally:
        server.psql(f"DROP ROLE {role}")


async def test_invalid_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="Invalid schema name"):
        postgres.PostgresLightningStore("host=x", schema="drop table;")
    with pytest.raises(ValueError, match="Invalid pool sizes"):
        postgres.PostgresLightningStore("host=x", pool_min_size=5, pool_max_size=2)


async def test_span_payloads_do_not_repeat_indexed_fields(schema: str) -> None:
    store = open_store(schema)
    try:
        attempted = await store.start_rollout("x")
        added = make_span(attempted.rollout_id, attempted.attempt.attempt_id, 1, "s1", attributes={"k": "v" * 50})
        await store.add_span(added)
        keys = postgres_server().psql(
            f"SELECT string_agg(k, ',' ORDER BY k) FROM {schema}.spans, json_object_keys(data) k"
        )
        assert set(keys.strip().split(",")) == set(type(added).model_fields) - {
            "rollout_id",
            "attempt_id",
            "span_id",
            "sequence_id",
            "trace_id",
            "parent_id",
            "name",
            "start_time",
            "end_time",
        }
        assert (await store.query_spans(attempted.rollout_id)).items == [added]
    finally:
        await store.close()


async def test_updates_of_some_payload_fields_keep_the_others_and_their_key_order(schema: str) -> None:
    """A partial update writes its fields over the stored item, keeping the other fields, their key order and NULs."""
    store = open_store(schema)
    try:
        ordered = {"question": "q\x00", "context": {"zeta": 1, "alpha": 2}}
        attempted = await store.start_rollout(ordered, metadata={"zz": 1, "a": 2})
        rollout = attempted.model_copy(update={"metadata": {"y": "\x00", "b": {"d": 1, "c": 2}}, "input": "ignored"})
        async with store.collections.atomic(mode="rw", labels=["rollouts"]) as collections:
            (updated,) = await collections.rollouts.update([rollout], update_fields=["metadata"])
        read = await store.get_rollout_by_id(attempted.rollout_id)
        assert read is not None and read.input == ordered and list(read.input) == ["question", "context"]
        assert list(read.input["context"]) == ["zeta", "alpha"]
        assert read.metadata == {"y": "\x00", "b": {"d": 1, "c": 2}} and list(read.metadata["b"]) == ["d", "c"]
        assert updated.metadata == read.metadata and updated.input == ordered

        # An upsert of some payload fields merges into a stored item and inserts a new one whole.
        again = rollout.model_copy(update={"metadata": {"n": 2}, "status": "failed"})
        new = again.model_copy(update={"rollout_id": "ro-new"})
        async with store.collections.atomic(mode="rw", labels=["rollouts"]) as collections:
            merged, inserted = await collections.rollouts.upsert([again, new], update_fields=["metadata", "status"])
        assert merged.input == ordered and merged.metadata == {"n": 2} and merged.status == "failed"
        read = await store.get_rollout_by_id(attempted.rollout_id)
        assert read is not None and (read.input, read.metadata, read.status) == (ordered, {"n": 2}, "failed")
        assert inserted == new
        read_new = await store.get_rollout_by_id("ro-new")
        assert read_new is not None and read_new.input == "ignored" and read_new.metadata == {"n": 2}
    finally:
        await store.close()


async def test_a_dequeue_waits_only_for_sections_on_the_rollout_it_claims(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A dequeue locks the rollout it claims, not whole collections: writes of other rollouts run beside it."""
    store = open_store(schema)
    try:
        other = await store.start_rollout({"n": 0})
        first, second, third = [await store.enqueue_rollout({"n": n}) for n in (1, 2, 3)]
        held, release = asyncio.Event(), asyncio.Event()

        async def hold(rollout_id: str, cancel: bool) -> None:
            async with store.collections.atomic(
                mode="rw", labels=["rollouts", "attempts"], rollout_ids=[rollout_id]
            ) as collections:
                held.set()
                await release.wait()
                if cancel:
                    (rollout,) = await collections.rollouts.query(filter={"rollout_id": {"exact": rollout_id}})
                    await collections.rollouts.update([rollout.model_copy(update={"status": "cancelled"})])

        # A section writing another rollout is open: the dequeue does not wait for it.
        holding = asyncio.create_task(hold(other.rollout_id, cancel=False))
        await held.wait()
        claimed = await asyncio.wait_for(store.dequeue_rollout(worker_id="w1"), 10)
        assert claimed is not None and claimed.rollout_id == first.rollout_id
        release.set()
        await holding

        # A section on the next queued rollout is open: the dequeue claims its entry, waits for the section, then
        # reads what it committed (cancelled, so skipped) and claims the one after.
        held.clear()
        release.clear()
        holding = asyncio.create_task(hold(second.rollout_id, cancel=True))
        await held.wait()
        dequeue = asyncio.create_task(store.dequeue_rollout(worker_id="w2"))
        await asyncio.sleep(0.5)
        assert not dequeue.done()
        release.set()
        await holding
        claimed = await asyncio.wait_for(dequeue, 10)
        assert claimed is not None and claimed.rollout_id == third.rollout_id
        assert f"Skipping queued rollout {second.rollout_id}: it is cancelled" in caplog.text
        assert await store.dequeue_rollout(worker_id="w1") is None
        workers = {worker.worker_id: worker for worker in await store.query_workers()}
        assert workers["w2"].current_rollout_id == third.rollout_id and workers["w2"].status == "busy"
    finally:
        await store.close()


async def test_the_json_page_the_server_sends_is_the_stored_spans(schema: str) -> None:
    """query_spans over HTTP answers with JSON the collection joins from the columns and the payload's text."""
    store = open_store(schema)
    try:
        attempted = await store.start_rollout("x")
        rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
        tricky = {
            "text": 'caf\u00e9 \U0001f600 "q" \\ \n\t\u0001',
            "float": 0.1 + 0.2,
            "big": 2**53 + 1,
            "nested": [1.5e-300],
        }
        spans = [
            make_span(rollout_id, attempt_id, 1, "s1", attributes=tricky, parent_id="p", start_time=1732870000.123456),
            make_span(rollout_id, attempt_id, 2, "s2", attributes={}, end_time=None, name='n\u00e9 "q" \\ \n\t\u0001'),
            make_span(rollout_id, attempt_id, 3, "s3", attributes={}, start_time=0.1 + 0.2, end_time=1e-300),
        ]
        await store.add_many_spans(spans)
        query = QuerySpansRequest(rollout_id=rollout_id)
        page = orjson.loads(await store._query_spans_json(query))
        assert [Span.model_validate(item) for item in page["items"]] == spans
        assert (page["limit"], page["offset"], page["total"]) == (-1, 0, 3)
    finally:
        await store.close()


async def test_reads_by_key_and_attempt_updates_send_no_needless_statements(schema: str, monkeypatch: Any) -> None:
    """A read of one item sends no count, counting attempts reads no rows, and an attempt update reads the latest
    attempt once: each statement is a round trip to the server."""
    store = open_store(schema)
    try:
        attempted = await store.start_rollout("x")
        rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
        sent = record_statements(monkeypatch)
        rollout = await store.get_rollout_by_id(rollout_id)
        assert rollout is not None and rollout.attempt.attempt_id == attempt_id
        assert len(sent) == 2 and not any("count(" in statement for statement in sent)  # the rollout, its attempt

        sent.clear()
        await store.update_attempt(rollout_id, attempt_id, status="running")
        reads = [statement for statement in sent if statement.lstrip().startswith("SELECT rollout_id, attempt_id")]
        assert len(reads) == 1 and not any("count(" in statement for statement in sent)

        sent.clear()
        retried = await store.start_attempt(rollout_id)
        assert retried.attempt.sequence_id == 2  # attempts so far, counted without reading them
        assert not any("LIMIT" in statement and "attempts" in statement for statement in sent)
    finally:
        await store.close()


async def test_sections_confined_to_rollouts_overlap_only_across_rollouts(schema: str) -> None:
    """A section confined to rollouts runs beside one on another rollout; one on the same rollout, or one locking
    the whole labels, waits for it, and a section locking the whole labels holds off every confined one."""
    store = open_store(schema)
    collections = store.collections
    labels = ["attempts", "rollouts", "spans"]
    entered: List[str] = []

    async def enter(name: str, rollout_ids: Any) -> None:
        async with collections.atomic(mode="rw", labels=labels, rollout_ids=rollout_ids):
            entered.append(name)

    async def holding(rollout_ids: Any, held: asyncio.Event, release: asyncio.Event) -> None:
        async with collections.atomic(mode="rw", labels=labels, rollout_ids=rollout_ids):
            held.set()
            await release.wait()

    try:
        held, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.ensure_future(holding(["ro-a"], held, release))
        await asyncio.wait_for(held.wait(), 30)
        await asyncio.wait_for(enter("other rollout", ["ro-b", "ro-c"]), 30)  # while ro-a's section is open
        same = asyncio.ensure_future(enter("same rollout", ["ro-c", "ro-a"]))
        whole = asyncio.ensure_future(enter("whole labels", None))
        await asyncio.sleep(0.5)
        assert entered == ["other rollout"] and not same.done() and not whole.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(holder, same, whole), 30)
        assert sorted(entered[1:]) == ["same rollout", "whole labels"]

        entered.clear()
        held, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.ensure_future(holding(None, held, release))
        await asyncio.wait_for(held.wait(), 30)
        confined = asyncio.ensure_future(enter("confined", ["ro-d"]))
        await asyncio.sleep(0.5)
        assert entered == [] and not confined.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(holder, confined), 30)
        assert entered == ["confined"]
    finally:
        await store.close()


async def test_spans_of_different_rollouts_are_added_side_by_side(schema: str, monkeypatch: Any) -> None:
    """The lifecycle's writes (spans, attempt updates with or without a status change, creating rollouts, dequeuing)
    lock the rollouts they touch, not every rollout."""
    store = open_store(schema)
    try:
        attempted = await store.start_rollout("x")
        rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
        sent = record_statements(monkeypatch)
        await store.add_span(make_span(rollout_id, attempt_id, 1, "0000000000000001"))
        await store.update_attempt(rollout_id, attempt_id, metadata={"step": 1})
        await store.enqueue_rollout("y")
        await store.start_rollout("z")
        await store.update_attempt(rollout_id, attempt_id, status="failed")
        await store.start_rollout("z", worker_id="worker-1")
        assert await store.dequeue_rollout(worker_id="worker-1") is not None
        locks = [statement for statement in sent if "pg_advisory_xact_lock" in statement]
        shared = [True] * 6 + [True, False]  # the dequeue: its labels, then the rollout it claimed
        assert ["pg_advisory_xact_lock_shared" in statement for statement in locks] == shared
        assert locks[-1].count("pg_advisory_xact_lock(") == 1
    finally:
        await store.close()


async def test_a_dequeue_from_an_empty_queue_locks_only_the_workers(schema: str, monkeypatch: Any) -> None:
    """Idle runners ask often: their empty dequeues lock nobody else out, only write their own worker's record."""
    store = open_store(schema)
    try:
        sent = record_statements(monkeypatch)
        assert await store.dequeue_rollout(worker_id="worker-1") is None
        (lock,) = [statement for statement in sent if "pg_advisory_xact_lock" in statement]
        assert lock.count("pg_advisory_xact_lock_shared(") == 1 and "pg_advisory_xact_lock(" not in lock  # workers
        worker = await store.get_worker_by_id("worker-1")
        assert worker is not None and worker.status == "idle" and worker.last_dequeue_time is not None
    finally:
        await store.close()


async def test_a_dequeue_locks_the_rollouts_it_claims_in_the_claiming_statement(schema: str, monkeypatch: Any) -> None:
    """Each statement is a round trip. A dequeue that claims rollouts sends: the check that the queue holds one, the
    section's label locks, the claim (which also locks the claimed rollouts), for each claimed rollout its read, the
    count of its attempts, the new attempt and the rollout's update, then the worker's record (with a worker) and the
    commit."""
    store = open_store(schema)
    try:
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=n) for n in range(5)])
        assert await store.dequeue_rollout() is not None  # the first call of a store object runs the watchdog too
        sent = record_statements(monkeypatch)
        assert await store.dequeue_rollout() is not None
        assert len(sent) == 8, sent
        sent.clear()
        assert await store.dequeue_rollout(worker_id="worker-1") is not None
        assert len(sent) == 9, sent
        sent.clear()
        assert len(await store.dequeue_many_rollouts(limit=2)) == 2
        assert len(sent) == 12, sent
        assert not any(statement.startswith("SELECT pg_advisory_xact_lock(") for statement in sent)
    finally:
        await store.close()


async def test_rollout_lock_keys_are_the_same_in_sql_and_in_python(schema: str) -> None:
    """A claim locks its rollouts with keys PostgreSQL computes; every other section computes them in Python."""
    import psycopg

    store = open_store(schema)
    database = store.collections._db
    ids = ["ro-0123456789ab", "x", "caf\u00e9 \U0001f600", "quote ' and \\"]
    try:
        async with await psycopg.AsyncConnection.connect(postgres_server().dsn()) as conn:
            for rollout_id in ids:
                cursor = await conn.execute(f"SELECT {database.rollout_lock_key_sql('%s::text')}", (rollout_id,))
                assert (await cursor.fetchone())[0] == database.rollout_lock_key(rollout_id)
    finally:
        await store.close()


async def waiting_advisory_locks(count: int) -> None:
    """Return once ``count`` advisory lock requests wait in the session's PostgreSQL server."""
    sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    deadline = time.monotonic() + 30
    while int(await asyncio.to_thread(postgres_server().psql, sql)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} advisory locks are awaited"
        await asyncio.sleep(0.05)


async def test_a_dequeue_holding_a_rollout_does_not_wait_for_the_next_one(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Lock order: a dequeue skips a stale queue entry, whose rollout it locked, and goes on to the next entry. If
    a section holds that entry's rollout while it waits for the first one, waiting for it would be a deadlock: the
    dequeue leaves the entry queued instead, and both finish."""
    store = open_store(schema)
    released = asyncio.Event()
    tasks: List[asyncio.Future[Any]] = []
    try:
        first, second = await store.start_rollout("a"), await store.start_rollout("b")
        # The stale entry's rollout has the greater lock key: every section locks the other one first.
        stale, busy = sorted(
            [first.rollout_id, second.rollout_id],
            key=lambda rollout_id: collection._lock_key(schema, "rollout", rollout_id),
            reverse=True,
        )
        await store.update_rollout(stale, status="queuing")
        await store.update_rollout(busy, status="queuing")
        await store.update_rollout(stale, status="cancelled")  # its queue entry stays behind
        held = asyncio.Event()

        async def hold_stale() -> None:
            async with store.collections.atomic(mode="rw", labels=["rollouts"], rollout_ids=[stale]):
                held.set()
                await released.wait()

        async def touch_both() -> None:  # locks the busy rollout, then waits for the stale one
            async with store.collections.atomic(mode="rw", labels=["rollouts"], rollout_ids=[stale, busy]):
                pass

        holder = asyncio.ensure_future(hold_stale())
        tasks.append(holder)
        await asyncio.wait_for(held.wait(), 30)
        dequeue = asyncio.ensure_future(store.dequeue_rollout())  # claims the stale entry, waits for its rollout
        tasks.append(dequeue)
        await waiting_advisory_locks(1)
        both = asyncio.ensure_future(touch_both())
        tasks.append(both)
        await waiting_advisory_locks(2)
        released.set()
        await asyncio.wait_for(holder, 30)
        await asyncio.wait_for(both, 30)  # a deadlock would abort it (or the dequeue)
        assert await asyncio.wait_for(dequeue, 30) is None  # the busy rollout was not waited for
        assert f"Skipping queued rollout {stale}: it is cancelled" in caplog.text
        claimed = await store.dequeue_rollout()
        assert claimed is not None and claimed.rollout_id == busy
    finally:
        released.set()
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        await store.close()


async def test_concurrent_dequeues_claim_every_rollout_once(schema: str) -> None:
    """Many dequeue_many calls at once on one store, over a queue holding stale entries and entries queued twice,
    beside sections locking several rollouts: every rollout is claimed exactly once and no call fails (a deadlock
    would fail one)."""
    store = open_store(schema, pool_max_size=20)
    try:
        queued = [
            r.rollout_id
            for r in await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=n) for n in range(150)])
        ]
        for rollout_id in queued[::5]:
            await store.update_rollout(rollout_id, status="cancelled")  # stale entries: skipped by dequeues
        async with store.collections.atomic(mode="rw", labels=["rollout_queue"]) as collections:
            await collections.rollout_queue.enqueue(queued[1::7])  # queued twice
        claimed: List[str] = []
        done = asyncio.Event()

        async def dequeue_until_empty() -> None:
            while not done.is_set():
                got = await store.dequeue_many_rollouts(limit=4)
                claimed.extend(rollout.rollout_id for rollout in got)
                if not got and await store.collections.rollout_queue.size() == 0:
                    done.set()

        async def lock_pairs() -> None:  # sections on two rollouts at once, as a batch of spans takes
            n = 0
            while not done.is_set():
                pair = [queued[n % len(queued)], queued[(n * 7 + 3) % len(queued)]]
                await store.get_many_span_sequence_ids([(rollout_id, "at-x") for rollout_id in pair])
                n += 1

        await asyncio.wait_for(
            asyncio.gather(*(dequeue_until_empty() for _ in range(12)), lock_pairs(), lock_pairs()), 120
        )
        assert sorted(claimed) == sorted(set(queued) - set(queued[::5]))
    finally:
        await store.close()


async def test_stores_sharing_a_database_keep_every_rule_with_confined_sections(schema: str) -> None:
    """Four store objects (like four server processes) enqueue, claim, add spans and finish rollouts all at once:
    every rollout is claimed exactly once and ends with its spans, in order, and its final status."""
    stores = [open_store(schema) for _ in range(4)]
    per_producer, spans_per_rollout = 12, 3

    async def produce(store: Any, producer: int) -> List[str]:
        return [(await store.enqueue_rollout({"producer": producer, "i": i})).rollout_id for i in range(per_producer)]

    async def consume(store: Any) -> List[str]:
        claimed: List[str] = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2.0:
            attempted = await store.dequeue_rollout()
            if attempted is None:
                await asyncio.sleep(0.02)
                continue
            rollout_id, attempt_id = attempted.rollout_id, attempted.attempt.attempt_id
            for n in range(spans_per_rollout):
                sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
                await store.add_span(make_span(rollout_id, attempt_id, sequence_id, f"{n:016x}"))
            await store.update_attempt(rollout_id, attempt_id, metadata={"spans": spans_per_rollout})
            await store.update_attempt(rollout_id, attempt_id, status="succeeded")
            claimed.append(rollout_id)
            idle_since = time.monotonic()
        return claimed

    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(produce(s, k) for k, s in enumerate(stores)), *(consume(s) for s in stores)), 120
        )
        produced = [rollout_id for ids in results[:4] for rollout_id in ids]
        claimed = [rollout_id for ids in results[4:] for rollout_id in ids]
        assert len(produced) == 4 * per_producer and sorted(claimed) == sorted(produced)
        for rollout_id in produced:
            rollout = await stores[0].get_rollout_by_id(rollout_id)
            assert rollout is not None and rollout.status == "succeeded" and rollout.attempt.sequence_id == 1
            assert rollout.attempt.metadata == {"spans": spans_per_rollout}
            spans = await stores[0].query_spans(rollout_id)
            assert [span.sequence_id for span in spans] == list(range(1, spans_per_rollout + 1))
    finally:
        for store in stores:
            await store.close()


async def test_a_rollout_finished_elsewhere_wakes_waiters_without_polling(schema: str) -> None:
    waiting, finishing = open_store(schema), open_store(schema)  # two store objects, like two processes
    waiting._wait_poll_interval = 600.0  # only a notification can wake it before the deadline
    try:
        attempted = await finishing.start_rollout("x")
        waiter = asyncio.ensure_future(waiting.wait_for_rollouts(rollout_ids=[attempted.rollout_id], timeout=60))
        await asyncio.sleep(0.5)
        assert not waiter.done()
        await finishing.update_attempt(attempted.rollout_id, "latest", status="succeeded")
        (done,) = await asyncio.wait_for(waiter, timeout=60)
        assert done.status == "succeeded"
    finally:
        await waiting.close()
        await finishing.close()


async def test_a_rollout_queued_elsewhere_wakes_queue_waiters_without_polling(schema: str) -> None:
    waiting, queuing = open_store(schema), open_store(schema)  # two store objects, like two processes
    waiting._wait_poll_interval = 600.0  # only a notification can wake it before the deadline
    try:
        waiter = asyncio.ensure_future(waiting.wait_for_queued_rollouts(120))
        await asyncio.sleep(0.5)
        assert not waiter.done()
        await queuing.enqueue_rollout("x")
        assert await asyncio.wait_for(waiter, timeout=60) is True
    finally:
        await waiting.close()
        await queuing.close()


async def test_the_watchdog_runs_once_per_period_among_all_processes(schema: str) -> None:
    stores = [open_store(schema, scan_debounce_seconds=1.0) for _ in range(3)]  # like three server workers
    try:
        for store in stores:
            assert await store._should_scan_for_unhealthy_rollouts() is True  # the first scan of each object
        now = time.time()
        assert [await s.collections.claim_periodic_run("watchdog", 1.0, now) for s in stores] == [True, False, False]
        await asyncio.sleep(1.1)
        # A period later, each store's own debounce allows a scan, and exactly one of them wins it.
        assert sorted([await s._should_scan_for_unhealthy_rollouts() for s in stores]) == [False, False, True]
    finally:
        for store in stores:
            await store.close()


async def test_postgres_restart_mid_load_loses_nothing_and_applies_nothing_twice(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls in flight while PostgreSQL restarts fail or are retried; none is applied twice, none acknowledged lost."""
    caplog.set_level(logging.WARNING, logger="agentbolt.store.client")
    store = open_store(schema, pool_timeout=5.0)
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="asyncio")
    await server.start()
    client = LightningStoreClient(server.endpoint, retry_delays=(0.5, 1.0, 2.0, 4.0, 8.0))
    acked: List[int] = []
    failed: List[int] = []
    acked_spans: Set[str] = set()
    stop = asyncio.Event()

    async def enqueue_load() -> None:
        i = 0
        while not stop.is_set():
            try:
                await client.enqueue_many_rollouts([EnqueueRolloutRequest(input={"i": i})])
                acked.append(i)
            except Exception:
                failed.append(i)
            i += 1

    async def span_load() -> None:
        attempted = await client.start_rollout("spans")
        sequence = 0
        while not stop.is_set():
            sequence += 1
            span = make_span(attempted.rollout_id, attempted.attempt.attempt_id, sequence, f"s{sequence}")
            try:
                if await client.add_many_spans([span]):
                    acked_spans.add(span.span_id)
            except Exception:
                pass

    try:
        loads = [asyncio.ensure_future(enqueue_load()), asyncio.ensure_future(span_load())]
        while len(acked) < 50:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(postgres_server().restart, "immediate", 1.0)
        before = len(acked)
        while len(acked) < before + 50:  # the load goes on after the restart
            await asyncio.sleep(0.05)
            assert not any(load.done() for load in loads)
        stop.set()
        await asyncio.gather(*loads)
        inputs: Dict[int, int] = {}
        for rollout in await store.query_rollouts():
            if isinstance(rollout.input, dict):
                inputs[rollout.input["i"]] = inputs.get(rollout.input["i"], 0) + 1
        # The restart hit calls in flight: the server answered 503 (nothing applied) and the client sent them again.
        assert any("will retry" in record.getMessage() for record in caplog.records)
        assert all(count == 1 for count in inputs.values())  # nothing applied twice
        assert set(acked) <= set(inputs)  # nothing acknowledged lost
        assert set(inputs) <= set(acked) | set(failed)
        stored_spans = {
            span.span_id
            for span in await store.query_spans(
                (await store.query_rollouts(status_in=["running", "preparing"]))[0].rollout_id
            )
        }
        assert acked_spans <= stored_spans
    finally:
        stop.set()
        await client.close()
        await server.stop()
        await store.close()


async def _closed(store: Any) -> None:
    await store.close()


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 password=s3cret dbname",  # libpq cannot parse it
        "postgresql://agentbolt:s3cret@[::1/agentbolt",  # libpq's message quotes the whole URI
        "postgresql://agentbolt:s3cr%zzet@127.0.0.1/agentbolt",  # libpq's message quotes the bad token
    ],
)
def test_a_dsn_libpq_cannot_parse_is_refused_without_its_password(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agentbolt.cli.app import run

    with pytest.raises(postgres.PostgresConnectionError) as info:
        postgres.PostgresLightningStore(dsn)
    assert "s3cr" not in str(info.value) and "***" in str(info.value)
    assert run(["store", "--port", str(free_port()), "--backend", "postgres", "--dsn", dsn]) == 2
    err = capsys.readouterr().err
    assert "cannot open the store" in err and "s3cr" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://bob:pw1@pw2@db.example/agentbolt",  # libpq reads the password "pw1" and the host "pw2@db..."
        "postgresql://bob:pw1@pw2@pw3@db.example:5432/agentbolt?sslmode=require",
        "postgresql://bob:pw1@pw2/pw3@db.example/agentbolt",
        "postgresql://bob:pw1@pw2#pw3@db.example/agentbolt",
    ],
)
def test_a_uri_password_with_an_unescaped_at_sign_is_hidden_whole(dsn: str) -> None:
    password = dsn.split("//bob:")[1].rsplit("@", 1)[0]
    redacted = collection.redact_dsn(dsn)
    assert redacted.startswith("postgresql://bob:***@db.example")
    message = collection._redact(f'connection to server at "{dsn}" failed', dsn)
    assert message == redacted.join(['connection to server at "', '" failed'])
    assert "pw" not in redacted and "pw" not in message, password


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("agentbolt\n", "Invalid schema name"),
        ('a"b', "Invalid schema name"),
        ("a.b", "Invalid schema name"),
        ("x; DROP SCHEMA public CASCADE; --", "Invalid schema name"),
        ("s" * 54, "at most 53"),  # its notification channel would not fit PostgreSQL's 63-byte names
    ],
)
def test_schema_names_that_cannot_work_are_refused_before_connecting(schema: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        postgres.PostgresLightningStore("host=127.0.0.1 port=1 dbname=never_reached", schema=schema)


async def test_the_longest_and_mixed_case_schema_names_work(schema: str) -> None:
    for name in ("s" * 53, "Mixed_" + schema):
        store = open_store(name)
        try:
            rollout = await store.enqueue_rollout({"q": 1})
            waiter = asyncio.ensure_future(store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=30))
            await store.update_rollout(rollout.rollout_id, status="succeeded")
            assert [r.rollout_id for r in await waiter] == [rollout.rollout_id]
        finally:
            await store.close()
            postgres_server().psql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.parametrize(
    "options",
    [
        {"pool_timeout": 0},
        {"connect_timeout": -1},
        {"connect_timeout": float("inf")},
        {"pool_timeout": float("nan")},
        {"pool_min_size": 3, "pool_max_size": 2},
        {"pool_max_size": 0},
    ],
)
def test_out_of_range_pool_options_are_one_clear_error(options: Dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"pool|timeout"):
        postgres.PostgresLightningStore("host=127.0.0.1 port=1 dbname=never_reached", **options)


@pytest.mark.parametrize(
    "options",
    [{"pool_min_size": 1.5}, {"pool_max_size": "3"}, {"pool_min_size": True}, {"pool_timeout": "5"}],
)
def test_pool_options_of_the_wrong_type_are_one_clear_error(options: Dict[str, Any]) -> None:
    (name,) = options
    with pytest.raises(TypeError, match=f"{name} must be"):
        postgres.PostgresLightningStore("host=127.0.0.1 port=1 dbname=never_reached", **options)


def test_a_schema_that_cannot_be_migrated_is_left_as_it_was(schema: str) -> None:
    server = postgres_server()
    server.psql(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.rollouts (x integer)")
    with pytest.raises(postgres.PostgresStoreError, match='relation "rollouts" already exists'):
        open_store(schema)
    tables = server.psql(f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'")
    assert tables.split() == ["rollouts"]
    fresh = postgres_schema()
    role = "noschema_" + uuid.uuid4().hex[:8]
    server.psql(f"CREATE ROLE {role} LOGIN")
    try:
        with pytest.raises(postgres.PostgresPermissionError):
            postgres.PostgresLightningStore(server.dsn().replace("user=agentbolt", f"user={role}"), schema=fresh)
        assert server.psql(f"SELECT count(*) FROM pg_namespace WHERE nspname = '{fresh}'").strip() == "0"
    finally:
        server.psql(f"DROP ROLE {role}")


async def test_a_role_that_may_only_read_and_write_opens_an_up_to_date_schema(schema: str) -> None:
    await _closed(open_store(schema))
    server = postgres_server()
    role = "dml_" + uuid.uuid4().hex[:8]
    server.psql(
        f"CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA {schema} TO {role}; "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
    )
    try:
        store = postgres.PostgresLightningStore(server.dsn().replace("user=agentbolt", f"user={role}"), schema=schema)
        try:
            rollout = await store.enqueue_rollout({"q": 1})
            assert (await store.dequeue_rollout()).rollout_id == rollout.rollout_id  # type: ignore[union-attr]
        finally:
            await store.close()
    finally:
        server.psql(f"DROP OWNED BY {role}; DROP ROLE {role}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dsn", "host=127.0.0.1 dbname=x"], "--dsn only applies to --backend postgres"),
        (["--backend", "memory", "--dsn", "host=127.0.0.1 dbname=x"], "--dsn only applies to --backend postgres"),
        (["--backend", "sqlite", "--schema", "runs"], "--schema only applies to --backend postgres"),
        (["--backend", "memory", "--pool-size", "3"], "--pool-size only applies to --backend postgres"),
        (["--backend", "postgres", "--dsn", "host=127.0.0.1 dbname=x", "--path", "x.db"], "--path only applies"),
        (["--backend", "postgres", "--dsn", "host=127.0.0.1 dbname=x", "--workers", "0"], "'--workers'"),
        (["--backend", "postgres", "--dsn", "host=127.0.0.1 dbname=x", "--workers", "two"], "'--workers'"),
        (["--backend", "postgres", "--dsn", "host=127.0.0.1 dbname=x", "--pool-size", "0"], "'--pool-size'"),
        (["--backend", "postgres", "--dsn", "host=127.0.0.1 dbname=x", "--schema", "a.b"], "Invalid schema name"),
    ],
)
def test_contradictory_or_bad_postgres_options_exit_2(
    args: List[str], message: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentbolt.cli.app import run

    monkeypatch.chdir(tmp_path)
    assert run(["store", "--port", str(free_port()), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentbolt: error: ") and message in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no database file was created


def test_servers_migrating_one_fresh_schema_at_once_all_open_it(schema: str) -> None:
    import threading

    dsn = postgres_server().dsn()  # started here, not by the threads
    outcomes: List[Any] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        start.wait()
        try:
            outcomes.append(postgres.PostgresLightningStore(dsn, schema=schema).collections.migrated_from)
        except Exception as exc:  # recorded, then reported by the assertion below
            outcomes.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [0] + [collection.SCHEMA_VERSION] * 3
    rows = postgres_server().psql(f"SELECT version FROM {schema}.schema_migrations ORDER BY version")
    assert rows.split() == [str(m.version) for m in collection.MIGRATIONS]


async def test_calls_while_postgres_is_down_fail_cleanly_and_the_store_recovers(schema: str) -> None:
    server = postgres_server()
    store = postgres.PostgresLightningStore(
        server.dsn(password="s3cret"), schema=schema, pool_timeout=2.0, connect_timeout=2.0
    )
    try:
        before = await store.enqueue_rollout({"i": 0})
        server.stop("immediate")
        try:
            for _ in range(3):
                with pytest.raises(postgres.PostgresUnavailableError, match="nothing was applied") as info:
                    await store.enqueue_rollout({"i": 1})
                assert "s3cret" not in str(info.value)
        finally:
            server.start()
        after = await store.enqueue_rollout({"i": 2})
        claimed = [await store.dequeue_rollout(), await store.dequeue_rollout(), await store.dequeue_rollout()]
        assert [r.rollout_id if r else None for r in claimed] == [before.rollout_id, after.rollout_id, None]
    finally:
        await store.close()


async def test_successive_event_loops_do_not_hold_a_pool_each(schema: str) -> None:
    """A store used under ``asyncio.run`` again and again (or by threads whose loops end) opens a pool per loop; the
    pools of finished loops used to keep their connections until the server refused more ("too many clients")."""
    count_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )

    def server_connections() -> int:
        return int(postgres_server().psql(count_sql).strip())

    store = open_store(schema, pool_min_size=1, pool_max_size=2)
    before = await asyncio.to_thread(server_connections)

    def one_loop(index: int) -> None:
        async def work() -> None:
            await store.enqueue_rollout(input=index)
            claimed = await store.dequeue_rollout(worker_id="w")
            assert claimed is not None
            await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

        asyncio.run(work())

    try:
        for index in range(12):
            await asyncio.to_thread(one_loop, index)
        await asyncio.sleep(0.2)  # the server notices closed sockets at once; give its statistics a moment
        assert await asyncio.to_thread(server_connections) - before <= 2 + 1  # one pool (and the listener)
    finally:
        await store.close()
