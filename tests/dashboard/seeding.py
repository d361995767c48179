"""Store content for the dashboard tests, written through the store's public API."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from agentbolt.semconv import AGL_ANNOTATION
from agentbolt.store.base import LightningStore
from agentbolt.types import EnqueueRolloutRequest, Span
from agentbolt.types.tracer import OtelResource, TraceStatus

SCRIPT_PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold?</b>'


def reward_span(rollout_id: str, attempt_id: str, sequence_id: int, value: float, **extra: Any) -> Span:
    """An ``emit_reward``-style annotation span."""
    now = time.time()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="ab" * 16,
        span_id=f"{sequence_id:016x}",
        parent_id=None,
        name=AGL_ANNOTATION,
        status=TraceStatus(status_code="OK"),
        attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value, **extra},
        events=[],
        links=[],
        start_time=now,
        end_time=now,
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


async def finish(
    store: LightningStore, rollout_id: str, worker: str, reward: Optional[float], status: str = "succeeded"
) -> None:
    """Start an attempt of a rollout on ``worker``, record a reward span, and end it with ``status``."""
    attempted = await store.start_attempt(rollout_id, worker_id=worker)
    attempt_id = attempted.attempt.attempt_id
    if reward is not None:
        sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
        await store.add_span(reward_span(rollout_id, attempt_id, sequence_id, reward))
    await store.update_attempt(rollout_id, attempt_id, status=status)  # type: ignore[arg-type]


async def seed_small(store: LightningStore) -> Dict[str, List[str]]:
    """Six rollouts: train/val, two workers, rewards 0..1, one failed, one queued, one with a script payload."""
    resources = await store.add_resources({})
    ids: Dict[str, List[str]] = {"train": [], "val": [], "queued": []}
    requests = [
        EnqueueRolloutRequest(
            input={"question": f"what is {i} + {i}?"}, mode="train", resources_id=resources.resources_id
        )
        for i in range(4)
    ]
    requests.append(EnqueueRolloutRequest(input={"question": "capital of France", "note": SCRIPT_PAYLOAD}, mode="val"))
    requests.append(EnqueueRolloutRequest(input="still waiting", mode="test"))
    rollouts = await store.enqueue_many_rollouts(requests)
    for i, rollout in enumerate(rollouts[:4]):
        await finish(store, rollout.rollout_id, "Worker-0" if i % 2 == 0 else "Worker-1", i / 4)
        ids["train"].append(rollout.rollout_id)
    await finish(store, rollouts[4].rollout_id, "Worker-1", None, status="failed")
    ids["val"].append(rollouts[4].rollout_id)
    ids["queued"].append(rollouts[5].rollout_id)
    return ids
