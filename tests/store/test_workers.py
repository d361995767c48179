"""One store served by several processes: ``agentbolt store --workers 4`` over PostgreSQL and over SQLite.

Many clients dequeue concurrently through the shared port; every queued rollout must be claimed exactly once (one
attempt, one claimant), whichever worker process served each request.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List

import psutil
import pytest
from support.servers import free_port, start_store_process, wait_healthy, wait_serving

from agentbolt.cli.app import run
from agentbolt.cli.store import max_workers
from agentbolt.store.http import LightningStoreClient, LightningStoreServer
from agentbolt.types import EnqueueRolloutRequest, RolloutConfig
from agentbolt.utils.server_launcher import MAX_FAILED_STARTS

from .conftest import drop_postgres_schema, make_span, postgres_schema, postgres_server

ROLLOUTS = 120
CLIENTS = 8
WORKERS = 4


@pytest.fixture(params=["postgres", "sqlite"])
def backend_args(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[List[str]]:
    if request.param == "sqlite":
        yield ["--backend", "sqlite", "--path", str(tmp_path / "shared.db")]
        return
    schema = postgres_schema()
    yield ["--backend", "postgres", "--dsn", postgres_server().dsn(), "--schema", schema]
    drop_postgres_schema(schema)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "greater than or equal to 1"),
        ("-3", "greater than or equal to 1"),
        ("four", "valid integer"),
        ("2.5", "valid integer"),
        (str(max_workers() + 1), f"at most {max_workers()}"),
        ("100000", f"at most {max_workers()}"),
    ],
)
def test_bad_worker_counts_exit_2_with_one_line(
    value: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "never.db"
    args = ["store", "--port", str(free_port()), "--path", str(db), "--workers", value]
    assert run(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentbolt: error: ") and "--workers" in err and message in err, err
    assert len(err.splitlines()) == 1
    assert not db.exists()  # refused before the store is opened or any worker started


def _stop_cleanly(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server, which must exit with code 0 (killed, and the test failed, if it does not exit)."""
    server.send_signal(signal.SIGTERM)
    try:
        assert server.wait(timeout=60) == 0
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise


async def test_every_rollout_is_claimed_exactly_once_by_many_clients(backend_args: List[str]) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(None, port, ["--workers", str(WORKERS)], backend_args=backend_args)
    try:
        await asyncio.to_thread(wait_serving, server)
        workers = psutil.Process(server.pid).children()
        assert len(workers) == WORKERS, [w.pid for w in workers]
        setup = LightningStoreClient(endpoint)
        try:
            queued = []
            for start in range(0, ROLLOUTS, 50):
                batch = [EnqueueRolloutRequest(input={"i": i}) for i in range(start, min(start + 50, ROLLOUTS))]
                queued += [r.rollout_id for r in await setup.enqueue_many_rollouts(batch)]
        finally:
            await setup.close()

        claims: Dict[str, List[str]] = {}

        async def claimant(index: int) -> None:
            client = LightningStoreClient(endpoint)  # its own connections, spread over the workers
            try:
                empty = 0
                while empty < 3:  # a few empty answers in a row: the queue is drained
                    limit = 1 + index % 3
                    claimed = await client.dequeue_many_rollouts(limit=limit, worker_id=f"runner-{index}")
                    empty = 0 if claimed else empty + 1
                    for rollout in claimed:
                        claims.setdefault(rollout.rollout_id, []).append(f"runner-{index}")
                        assert rollout.attempt.sequence_id == 1
            finally:
                await client.close()

        await asyncio.gather(*(claimant(i) for i in range(CLIENTS)))
        assert sorted(claims) == sorted(queued)
        assert all(len(claimants) == 1 for claimants in claims.values()), {
            rid: c for rid, c in claims.items() if len(c) > 1
        }
        check = LightningStoreClient(endpoint)
        try:
            stats = await check.statistics()
            assert stats["total_rollouts"] == ROLLOUTS and stats["total_attempts"] == ROLLOUTS
            assert len(await check.query_rollouts(status_in=["queuing"])) == 0
        finally:
            await check.close()
        assert len({w.pid for w in psutil.Process(server.pid).children()}) == WORKERS
    finally:
        _stop_cleanly(server)


async def test_a_zero_copy_store_is_served_from_several_processes() -> None:
    postgres = pytest.importorskip("agentbolt.store.postgres")
    schema = postgres_schema()
    store = postgres.PostgresLightningStore(postgres_server().dsn(), schema=schema)
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="mp", n_workers=2)
    await server.start()
    client = LightningStoreClient(server.endpoint)
    try:
        created = await client.enqueue_rollout({"served by": "workers"})
        assert (await store.get_rollout_by_id(created.rollout_id)) is not None  # the same data as in this process
        claimed = await client.dequeue_rollout(worker_id="w")
        assert claimed is not None and claimed.rollout_id == created.rollout_id
    finally:
        await client.close()
        await server.stop()
        await store.close()
        drop_postgres_schema(schema)


async def test_workers_exit_when_the_main_process_is_killed(tmp_path: Path) -> None:
    """kill -9 of the main process leaves no worker serving on its own: the port is free for a new server."""
    port = free_port()
    db = tmp_path / "orphans.db"
    server = start_store_process(db, port, ["--workers", "2"], stderr=subprocess.DEVNULL)
    try:
        await asyncio.to_thread(wait_serving, server)
        workers = psutil.Process(server.pid).children()
        assert len(workers) == 2
    finally:
        server.kill()
        server.wait()
    _, alive = await asyncio.to_thread(psutil.wait_procs, workers, 60)
    for process in alive:  # leave nothing behind, whatever the outcome
        process.kill()
    assert not alive, [p.pid for p in alive]
    again = start_store_process(db, port, stderr=subprocess.DEVNULL)
    try:
        await asyncio.to_thread(wait_healthy, f"http://127.0.0.1:{port}/v1/agl/health", again)
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=60) == 0


async def test_kill_9_of_one_worker_under_load_loses_nothing_acknowledged(backend_args: List[str]) -> None:
    """One of three workers is killed with SIGKILL while clients claim rollouts and add spans: the others keep
    serving, a new worker takes its place, no rollout is claimed twice and every acknowledged span is stored."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(None, port, ["--workers", "3"], backend_args=backend_args, stderr=subprocess.DEVNULL)
    try:
        await asyncio.to_thread(wait_serving, server)
        first_workers = psutil.Process(server.pid).children()
        setup = LightningStoreClient(endpoint)
        try:
            batch = [EnqueueRolloutRequest(input={"i": i}) for i in range(60)]
            queued = [r.rollout_id for r in await setup.enqueue_many_rollouts(batch)]
        finally:
            await setup.close()

        claims: Dict[str, List[str]] = {}
        acked_spans: Dict[str, List[str]] = {}
        killed = asyncio.Event()

        async def claimant(index: int) -> None:
            client = LightningStoreClient(endpoint)
            try:
                empty = 0
                while empty < 3:
                    try:
                        claimed = await client.dequeue_rollout(worker_id=f"runner-{index}")
                    except Exception:  # the answer was lost with the killed worker
                        continue
                    empty = 0 if claimed is not None else empty + 1
                    if claimed is None:
                        continue
                    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
                    claims.setdefault(rid, []).append(f"runner-{index}")
                    if len(claims) == 15 and not killed.is_set():
                        killed.set()
                        first_workers[0].kill()
                    spans = [make_span(rid, aid, k + 1, f"{rid}-s{k}") for k in range(3)]
                    with contextlib.suppress(Exception):
                        added = await client.add_many_spans(spans)
                        acked_spans[rid] = [s.span_id for s in added]
            finally:
                await client.close()

        await asyncio.gather(*(claimant(i) for i in range(6)))
        assert killed.is_set()
        assert all(len(claimants) == 1 for claimants in claims.values()), claims
        check = LightningStoreClient(endpoint)
        try:
            for rid, span_ids in acked_spans.items():
                stored = {s.span_id for s in await check.query_spans(rid)}
                assert set(span_ids) <= stored, rid
            assert len(await check.query_rollouts(status_in=["queuing"])) == 0
            unseen = set(queued) - set(claims)  # claimed by a request whose answer was lost: running, not requeued
            for rollout in await check.query_rollouts(rollout_id_in=sorted(unseen)) if unseen else []:
                assert rollout.status in ("preparing", "running"), rollout
        finally:
            await check.close()
        await asyncio.to_thread(first_workers[0].wait, 60)
        replaced = False
        for _ in range(600):  # the launcher checks its workers periodically
            pids = {w.pid for w in psutil.Process(server.pid).children()}
            if len(pids) == 3 and first_workers[0].pid not in pids:
                replaced = True
                break
            await asyncio.sleep(0.1)
        assert replaced, pids
    finally:
        _stop_cleanly(server)


async def test_waits_on_any_worker_are_woken_by_writes_served_by_another(backend_args: List[str]) -> None:
    """Clients waiting on their own connections (spread over the workers) are answered when a rollout is queued and
    when it finishes, whichever worker served the write."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(None, port, ["--workers", "3"], backend_args=backend_args, stderr=subprocess.DEVNULL)
    clients = [LightningStoreClient(endpoint, long_waits=True) for _ in range(7)]
    writer, waiters = clients[0], clients[1:]
    try:
        await asyncio.to_thread(wait_serving, server)
        queue_waits = [asyncio.ensure_future(c.wait_for_queued_rollouts(timeout=120)) for c in waiters]
        await asyncio.sleep(0.5)  # let the waits reach the workers (the answer is the same if they come later)
        rollout = await writer.enqueue_rollout({"task": 1})
        assert await asyncio.gather(*queue_waits) == [True] * len(waiters)

        finish_waits = [
            asyncio.ensure_future(c.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=120)) for c in waiters
        ]
        await asyncio.sleep(0.5)
        claimed = await writer.dequeue_rollout(worker_id="runner")
        assert claimed is not None and claimed.rollout_id == rollout.rollout_id
        await writer.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        for finished in await asyncio.gather(*finish_waits):
            assert [(r.rollout_id, r.status) for r in finished] == [(rollout.rollout_id, "succeeded")]
    finally:
        for client in clients:
            await client.close()
        _stop_cleanly(server)


async def test_timeouts_fire_once_after_the_workers_are_killed(tmp_path: Path) -> None:
    """Every worker that served the start of a rollout is killed with SIGKILL: the workers that replace them take
    over the watchdog, and the rollout's timeout is applied exactly once (one retry, one new attempt)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(tmp_path / "watchdog.db", port, ["--workers", "2"], stderr=subprocess.DEVNULL)
    client = LightningStoreClient(endpoint)
    try:
        await asyncio.to_thread(wait_serving, server)
        config = RolloutConfig(timeout_seconds=0.5, max_attempts=2, retry_condition=["timeout"])
        started = await client.start_rollout({"task": "slow"}, config=config)
        first_workers = psutil.Process(server.pid).children()
        for worker in first_workers:
            worker.kill()
        await asyncio.to_thread(psutil.wait_procs, first_workers, 60)
        retried = None
        for _ in range(1200):  # each call lets the watchdog scan (once per debounce period among the workers)
            with contextlib.suppress(Exception):  # while no worker is up yet
                retried = await client.get_rollout_by_id(started.rollout_id)
                if retried is not None and retried.status == "requeuing":
                    break
            await asyncio.sleep(0.1)
        assert retried is not None and retried.status == "requeuing", retried
        attempts = await client.query_attempts(started.rollout_id)
        assert [a.status for a in attempts] == ["timeout"]
        claimed = await client.dequeue_rollout(worker_id="runner")
        assert claimed is not None and claimed.attempt.sequence_id == 2
        assert len(await client.query_attempts(started.rollout_id)) == 2
    finally:
        await client.close()
        _stop_cleanly(server)


async def test_a_worker_that_cannot_reopen_the_store_stops_the_server_with_one_error_line(tmp_path: Path) -> None:
    """The database file is replaced by one that is no database, then a worker is killed: its replacements cannot
    open the store, and after a few failed starts the whole server stops with a non-zero exit code."""
    port = free_port()
    db = tmp_path / "replaced.db"
    server = start_store_process(db, port, ["--workers", "2"])
    try:
        await asyncio.to_thread(wait_serving, server)
        workers = psutil.Process(server.pid).children()
        broken = tmp_path / "broken.db"
        broken.write_bytes(b"not a database " * 100)
        broken.replace(db)  # the running workers keep the old file open; a new one opens this
        workers[0].kill()
        _, stderr = await asyncio.to_thread(server.communicate, None, 300)
        assert server.returncode == 1, stderr.decode()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    last_line = stderr.decode().splitlines()[-1]
    assert last_line.startswith(
        f"agentbolt: error: the server stopped: server worker 0 failed to start {MAX_FAILED_STARTS} times in a row"
    )
    assert f"Not an SQLite database (database file: {db})" in last_line
    _, alive = await asyncio.to_thread(psutil.wait_procs, workers, 60)
    assert not alive
