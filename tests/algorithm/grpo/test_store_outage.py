"""GRPO's waits and store calls ride out a restart of the store server instead of ending the run.

The store is a real ``agentbolt store`` subprocess on SQLite, killed and restarted on the same file while the
algorithm waits for its rollouts.
"""

from __future__ import annotations

import asyncio

import pytest
from support.servers import StoreServerProcess

from agentbolt.algorithm.grpo.algorithm import GRPO
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.store.outage import DEFAULT_STORE_OUTAGE_TIMEOUT


@pytest.fixture
def server(store_server_process: StoreServerProcess) -> StoreServerProcess:
    return store_server_process


async def _finish(endpoint: str) -> None:
    """Claim and succeed every queued rollout, as a runner would."""
    client = LightningStoreClient(endpoint)
    try:
        while (attempted := await client.dequeue_rollout(worker_id="w")) is not None:
            await client.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="succeeded")
    finally:
        await client.close()


def test_the_outage_tolerance_defaults_to_the_runners() -> None:
    assert GRPOConfig().store_outage_timeout == DEFAULT_STORE_OUTAGE_TIMEOUT


async def test_a_wait_rides_out_a_store_restart_and_returns_the_finished_rollouts(server: StoreServerProcess) -> None:
    algorithm = GRPO(rollout_timeout=60.0, store_outage_timeout=30.0)
    store = LightningStoreClient(server.endpoint)
    try:
        rollout_ids = [(await store.enqueue_rollout(input={"i": i})).rollout_id for i in range(2)]
        wait = asyncio.create_task(algorithm._wait(store, rollout_ids))
        await asyncio.sleep(0.5)  # the wait is polling the store
        ended = server.outage("kill", 3.0)
        await asyncio.to_thread(ended.join)
        assert not server.errors
        assert not wait.done(), "the wait gave up during the outage"
        await _finish(server.endpoint)
        finished = await asyncio.wait_for(wait, 30)
        assert sorted(finished) == sorted(rollout_ids)
        assert {rollout.status for rollout in finished.values()} == {"succeeded"}
    finally:
        await store.close()
