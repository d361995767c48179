"""Run tasks as rollouts through a store and read back what each produced (for algorithms written in examples)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence

import agentbolt as agl
from agentbolt.store.utils import wait_for_finished_rollouts


@dataclass
class FinishedRollout:
    """One rollout of a batch: which task it ran, whether it succeeded, its final reward and its spans.

    ``reward`` is 0.0 for a rollout that failed, did not finish in time or emitted no reward.
    """

    task_index: int
    rollout_id: str
    succeeded: bool
    reward: float
    spans: List[agl.Span]


async def roll_out(
    store: agl.LightningStore,
    tasks: Sequence[Any],
    *,
    resources_id: str,
    mode: str,
    timeout: float,
    repeats: int = 1,
) -> List[FinishedRollout]:
    """Enqueue every task ``repeats`` times with the resources ``resources_id``, wait up to ``timeout`` seconds for
    all of them, and return them in enqueue order (each task's repeats together)."""
    enqueued = []
    for index, task in enumerate(tasks):
        for _ in range(repeats):
            rollout = await store.enqueue_rollout(input=task, mode=mode, resources_id=resources_id)  # type: ignore[arg-type]
            enqueued.append((index, rollout.rollout_id))
    finished = await wait_for_finished_rollouts(store, [rollout_id for _, rollout_id in enqueued], timeout=timeout)
    results = []
    for index, rollout_id in enqueued:
        spans = list(await store.query_spans(rollout_id, "latest"))
        succeeded = rollout_id in finished and finished[rollout_id].status == "succeeded"
        reward = agl.find_final_reward(spans) if succeeded else None
        results.append(FinishedRollout(index, rollout_id, succeeded, float(reward or 0.0), spans))
    return results
