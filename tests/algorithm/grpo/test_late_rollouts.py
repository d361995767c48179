"""Cancelling the rollouts that missed the wait never overwrites one that finished in the meantime."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Dict, List

import pytest

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import Rollout


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[agl.LightningStore]:
    if request.param == "memory":
        yield agl.InMemoryLightningStore()
        return
    store = SqliteLightningStore(str(tmp_path / "store.db"))
    try:
        yield store
    finally:
        await store.close()


async def test_a_rollout_that_succeeds_after_the_wait_is_not_cancelled(store: agl.LightningStore) -> None:
    algorithm = GRPO(rollout_timeout=1.0)

    async def wait_ends_then_one_rollout_succeeds(
        store: agl.LightningStore, rollout_ids: List[str]
    ) -> Dict[str, Rollout]:
        done = await store.dequeue_rollout(worker_id="w")
        running = await store.dequeue_rollout(worker_id="w")
        assert done is not None and running is not None
        await store.update_attempt(done.rollout_id, done.attempt.attempt_id, status="succeeded")
        return {}  # the wait timed out just before the first one finished; the second is still running

    algorithm._wait = wait_ends_then_one_rollout_succeeds  # type: ignore[assignment,method-assign]
    outcomes = await algorithm._run_rollouts(
        store,
        [{"task": 1}],
        mode="train",
        step=1,
        resources_id=None,
        copies=2,  # type: ignore[arg-type]
    )
    assert [o.status for o in outcomes] == ["succeeded", "late"]
    stored = [await store.get_rollout_by_id(o.rollout_id) for o in outcomes]
    assert [r.status for r in stored if r is not None] == ["succeeded", "cancelled"]
