"""One store served by several processes: ``agentbolt store --workers 4`` over PostgreSQL and over SQLite.

Many clients dequeue concurrently through the shared port; every queued rollout must be claimed exactly once (one
attempt, one claimant), whichever worker process served each request.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List

import psutil
import pytest
from support.servers import free_port, start_store_process, wait_healthy

from agentbolt.store.http import LightningStoreClient, LightningStoreServer
from agentbolt.types import EnqueueRolloutRequest

from .conftest import drop_postgres_schema, postgres_schema, postgres_server

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


async def test_every_rollout_is_claimed_exactly_once_by_many_clients(backend_args: List[str]) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(None, port, ["--workers", str(WORKERS)], backend_args=backend_args)
    try:
        await asyncio.to_thread(wait_healthy, f"{endpoint}/v1/agl/health", server)
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
        server.send_signal(signal.SIGTERM)
        try:
            assert server.wait(timeout=60) == 0
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            raise


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
