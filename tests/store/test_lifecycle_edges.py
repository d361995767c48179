"""Lifecycle edge cases on every backend: late spans of ended attempts, and sorting by incomparable values."""

from __future__ import annotations

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.types import RolloutConfig

from .conftest import make_span, raises_store_error

RETRY_ON_FAILURE = RolloutConfig(max_attempts=3, retry_condition=["failed", "timeout", "unresponsive"])


@pytest.mark.parametrize("ended", ["failed", "timeout"])
async def test_late_span_of_an_ended_attempt_leaves_the_rollout_queued_for_a_retry(
    store: LightningStore, ended: str
) -> None:
    rollout = await store.enqueue_rollout("x", config=RETRY_ON_FAILURE)
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    await store.update_attempt(rollout.rollout_id, "latest", status=ended)

    late = make_span(rollout.rollout_id, claimed.attempt.attempt_id, 1, "late")
    assert await store.add_span(late) is not None  # stored all the same

    current = await store.get_rollout_by_id(rollout.rollout_id)
    assert current is not None and current.status == "requeuing"
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == ended
    retry = await store.dequeue_rollout()
    assert retry is not None and retry.rollout_id == rollout.rollout_id and retry.attempt.sequence_id == 2


async def test_sorting_by_incomparable_values_names_the_field(store: LightningStore) -> None:
    await store.enqueue_rollout({"question": 1})
    await store.enqueue_rollout({"question": 2})
    with raises_store_error(store, TypeError, match="'input'"):
        await store.query_rollouts(sort_by="input")
