"""kill -9 of a real ``agentbolt store`` server (SQLite or PostgreSQL backend) in the middle of a write load loses
nothing acknowledged.

After a restart on the same data: every acknowledged rollout, attempt, span and resource snapshot is there, the queue
keeps its order, and a running attempt whose heartbeat stopped is marked unresponsive by the watchdog and retried.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from support.servers import free_port, start_store_process, wait_healthy

from agentbolt.store.client_server import LightningStoreClient
from agentbolt.types import EnqueueRolloutRequest, RolloutConfig, Span
from agentbolt.types.tracer import OtelResource, TraceStatus

from .conftest import drop_postgres_schema, postgres_schema, postgres_server

UNRESPONSIVE_SECONDS = 1.0


def span(rollout_id: str, attempt_id: str, span_id: str, sequence_id: int) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="0" * 32,
        span_id=span_id,
        parent_id=None,
        name="llm",
        status=TraceStatus(status_code="OK"),
        attributes={"i": sequence_id},
        events=[],
        links=[],
        start_time=time.time(),
        end_time=time.time(),
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


class Acknowledged:
    """What the server confirmed before it was killed."""

    def __init__(self) -> None:
        self.queued: List[str] = []
        self.spans: Dict[Tuple[str, str], List[str]] = {}
        self.resources: List[str] = []
        self.resources_in_flight: Optional[str] = None


async def enqueue_load(client: LightningStoreClient, acked: Acknowledged) -> None:
    i = 0
    while True:  # one sequential writer: acknowledgement order is queue order
        rollouts = await client.enqueue_many_rollouts(
            [EnqueueRolloutRequest(input={"i": i}), EnqueueRolloutRequest(input={"i": i + 1})]
        )
        acked.queued.extend(r.rollout_id for r in rollouts)
        i += 2


async def span_load(client: LightningStoreClient, acked: Acknowledged, worker: int) -> None:
    while True:
        attempted = await client.start_rollout({"worker": worker})
        key = (attempted.rollout_id, attempted.attempt.attempt_id)
        acked.spans[key] = []
        for batch in range(3):
            spans = [span(*key, f"s{batch}-{k}", batch * 4 + k + 1) for k in range(4)]
            added = await client.add_many_spans(spans)
            acked.spans[key].extend(s.span_id for s in added)


async def resources_load(client: LightningStoreClient, acked: Acknowledged) -> None:
    i = 0
    while True:
        resources_id = f"rs-load-{i:05d}"
        acked.resources_in_flight = resources_id
        await client.update_resources(resources_id, {})
        acked.resources.append(resources_id)
        i += 1


@pytest.fixture(params=["sqlite", "postgres"])
def backend_args(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[List[str]]:
    """Command-line arguments of the store's backend: a SQLite file, or a fresh schema of the test PostgreSQL."""
    if request.param == "sqlite":
        yield ["--backend", "sqlite", "--path", str(tmp_path / "durable.db")]
        return
    server = postgres_server()
    schema = postgres_schema()
    yield ["--backend", "postgres", "--dsn", server.dsn(), "--schema", schema]
    drop_postgres_schema(schema)


async def test_kill_9_loses_no_acknowledged_write_and_resumes(backend_args: List[str]) -> None:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = start_store_process(None, port, backend_args=backend_args)
    acked = Acknowledged()
    try:
        await asyncio.to_thread(wait_healthy, f"{endpoint}/v1/agl/health", server)
        client = LightningStoreClient(endpoint, retry_delays=(), health_retry_delays=())
        try:
            watched_config = RolloutConfig(
                unresponsive_seconds=UNRESPONSIVE_SECONDS, max_attempts=2, retry_condition=["unresponsive"]
            )
            watched = await client.enqueue_rollout({"watched": True}, config=watched_config)
            running = await client.dequeue_rollout(worker_id="runner-1")
            assert running is not None and running.rollout_id == watched.rollout_id
            await client.add_span(span(running.rollout_id, running.attempt.attempt_id, "heartbeat", 1))
            last_heartbeat = time.monotonic()

            async def heartbeats() -> None:  # the watched attempt stays alive until the kill, however long the load
                nonlocal last_heartbeat
                for sequence_id in range(2, 1_000_000):
                    await asyncio.sleep(UNRESPONSIVE_SECONDS / 5)
                    beat = span(running.rollout_id, running.attempt.attempt_id, f"heartbeat-{sequence_id}", sequence_id)
                    await client.add_span(beat)
                    last_heartbeat = time.monotonic()

            tasks = [
                asyncio.create_task(heartbeats()),
                asyncio.create_task(enqueue_load(client, acked)),
                asyncio.create_task(resources_load(client, acked)),
                *(asyncio.create_task(span_load(client, acked, w)) for w in range(4)),
            ]
            while len(acked.queued) < 200 or len(acked.resources) < 20 or sum(map(len, acked.spans.values())) < 200:
                await asyncio.sleep(0.02)
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            os.kill(server.pid, signal.SIGKILL)  # in the middle of the load
            server.wait(timeout=30)
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, Exception) for r in results)  # every load loop was cut off
        finally:
            await client.close()

        # The watched attempt stays silent for longer than unresponsive_seconds before the store comes back.
        await asyncio.sleep(max(0.0, UNRESPONSIVE_SECONDS + 0.3 - (time.monotonic() - last_heartbeat)))
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        server = start_store_process(None, port, backend_args=backend_args)
        await asyncio.to_thread(wait_healthy, f"{endpoint}/v1/agl/health", server)
        client = LightningStoreClient(endpoint)
        try:
            # Resources: every acknowledged snapshot; the latest is the last acknowledged one or the one in flight.
            for resources_id in acked.resources:
                assert await client.get_resources_by_id(resources_id) is not None, resources_id
            latest = await client.get_latest_resources()
            assert latest is not None and latest.resources_id in {acked.resources[-1], acked.resources_in_flight}

            # Spans and attempts of every acknowledged batch.
            for (rollout_id, attempt_id), span_ids in acked.spans.items():
                attempt = await client.get_latest_attempt(rollout_id)
                assert attempt is not None and attempt.attempt_id == attempt_id
                stored = {s.span_id for s in await client.query_spans(rollout_id, attempt_id)}
                assert set(span_ids) <= stored, rollout_id
                if span_ids:
                    assert attempt.status == "running"

            # The watchdog resumed: the silent attempt is unresponsive and its rollout waits for a retry.
            attempt = await client.get_latest_attempt(watched.rollout_id)
            assert attempt is not None and attempt.sequence_id == 1 and attempt.status == "unresponsive"

            # Queue order is kept, nothing acknowledged is lost, and the retry comes after them.
            drained: List[Any] = []
            while batch := await client.dequeue_many_rollouts(limit=50, worker_id="runner-2"):
                drained.extend(batch)
            drained_ids = [r.rollout_id for r in drained]
            acknowledged = set(acked.queued)
            assert [rid for rid in drained_ids if rid in acknowledged] == acked.queued
            retry = next(r for r in drained if r.rollout_id == watched.rollout_id)
            assert retry.attempt.sequence_id == 2
            assert drained_ids.index(watched.rollout_id) > drained_ids.index(acked.queued[-1])
        finally:
            await client.close()
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.mark.parametrize("content", [b"not a database\n" * 100])
def test_server_refuses_corrupt_file_once_with_clear_message(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(content)
    server = start_store_process(path, free_port())
    try:
        _, stderr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode not in (0, None)
    assert str(path) in stderr.decode()
    assert path.read_bytes() == content
