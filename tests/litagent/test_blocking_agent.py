"""A decorated synchronous agent that blocks runs off the event loop: heartbeats keep flowing while it blocks."""

from __future__ import annotations

import asyncio
import time
from typing import List

import agentbolt as agl
from agentbolt.runner import LitAgentRunner
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import OtelTracer
from agentbolt.types import PromptTemplate

WORKER = "Worker-0"


async def test_blocking_sync_agent_does_not_stall_heartbeats() -> None:
    store = InMemoryLightningStore()
    loop = asyncio.get_running_loop()
    observed: List[float] = []

    def heartbeat_time() -> float:
        worker = asyncio.run_coroutine_threadsafe(store.get_worker_by_id(WORKER), loop).result(timeout=10)
        return worker.last_heartbeat_time if worker is not None and worker.last_heartbeat_time else 0.0

    @agl.rollout
    def blocking_agent(task: str, prompt_template: PromptTemplate) -> float:
        # Blocks its thread until the store has seen two more heartbeats, which the runner sends from the event
        # loop. Were the agent run on the loop, no heartbeat could arrive and this would give up at the deadline.
        deadline = time.monotonic() + 30
        observed.append(heartbeat_time())
        while len(set(observed)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
            observed.append(heartbeat_time())
        return 1.0 if len(set(observed)) >= 3 else 0.0

    runner: LitAgentRunner[str] = LitAgentRunner(
        tracer=OtelTracer(), max_rollouts=1, poll_interval=0.05, heartbeat_interval=0.05,
        heartbeat_launch_mode="asyncio",
    )  # fmt: skip
    resources = await store.add_resources({"prompt": PromptTemplate(template="{x}", engine="f-string")})
    rollout = await store.enqueue_rollout(input="task", mode="train", resources_id=resources.resources_id)
    with runner.run_context(agent=blocking_agent, store=store):
        await asyncio.wait_for(runner.iter(), timeout=60)

    finished = await store.get_rollout_by_id(rollout.rollout_id)
    assert finished is not None and finished.status == "succeeded"
    rewards = [agl.get_reward_value(span) for span in await store.query_spans(rollout.rollout_id)]
    assert 1.0 in rewards
    assert len(set(observed)) >= 3
