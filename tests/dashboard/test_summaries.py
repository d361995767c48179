"""What the rollout list answers an operator with, on a real store server over a SQLite file: how long rollouts that
have not ended have been going, and answers bounded by the page size whatever the agents stored."""

from __future__ import annotations

import time
from pathlib import Path
from typing import AsyncIterator, Tuple

import httpx
import pytest
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.sqlite import SqliteLightningStore


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Tuple[SqliteLightningStore, httpx.AsyncClient]]:
    store = SqliteLightningStore(tmp_path / "store.db")
    server = LightningStoreServer(store, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl", timeout=60) as http:
            yield store, http
    finally:
        await server.stop()


async def test_a_rollout_that_has_not_ended_shows_how_long_it_has_been_going_and_sorts_by_it(
    served: Tuple[SqliteLightningStore, httpx.AsyncClient],
) -> None:
    store, http = served
    stuck = await store.start_rollout(input="never ends", worker_id="Worker-0")
    waiting = await store.enqueue_rollout(input="still queued")
    done = await store.start_rollout(input="quick", worker_id="Worker-1")
    await store.update_attempt(done.rollout_id, done.attempt.attempt_id, status="succeeded")

    asked_at = time.time()
    answer = await http.get("/dashboard/rollouts", params={"sort_by": "duration", "sort_order": "desc"})
    assert answer.status_code == 200, answer.text
    items = {item["rollout_id"]: item for item in answer.json()["items"]}
    # Measured by the server's clock: at least the time that had passed when the page was asked for.
    assert items[stuck.rollout_id]["duration"] >= asked_at - stuck.start_time
    assert items[waiting.rollout_id]["duration"] >= asked_at - waiting.start_time
    assert items[stuck.rollout_id]["end_time"] is None
    # The rollout that has been going longest is the first a "longest first" sort shows: the one stuck running.
    order = [item["rollout_id"] for item in answer.json()["items"]]
    assert order == [stuck.rollout_id, waiting.rollout_id, done.rollout_id]


async def test_a_page_of_summaries_leaves_out_the_metadata_of_attempts(
    served: Tuple[SqliteLightningStore, httpx.AsyncClient],
) -> None:
    store, http = served
    blob = {"log": "x" * 1_000_000}
    for i in range(3):
        started = await store.start_rollout(input=f"task {i}", worker_id="Worker-0")
        await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="failed", metadata=blob)

    answer = await http.get("/dashboard/rollouts")
    assert answer.status_code == 200
    assert len(answer.content) < 100_000, "a page is a summary, whatever an attempt's metadata holds"
    attempt = answer.json()["items"][0]["attempt"]
    assert attempt["worker_id"] == "Worker-0" and "metadata" not in attempt
    # The rollout page still reads it, from the attempts of that one rollout.
    attempts = await http.get(f"/rollouts/{attempt['rollout_id']}/attempts")
    assert attempts.json()["items"][0]["metadata"] == blob
