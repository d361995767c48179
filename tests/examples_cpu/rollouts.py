"""Running an example's agent for a few rollouts through ``Trainer.dev`` and reading back what was stored."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence

import agentbolt as agl
from agentbolt.emitter import find_reward_spans, get_rewards_from_span
from agentbolt.store.sqlite import SqliteLightningStore

FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 1.0}


@dataclass
class StoredRollout:
    """One finished rollout: its task, status, reward dimensions (the last reward span's) and span names."""

    task: Dict[str, Any]
    mode: str
    status: str
    rewards: Dict[str, float]
    span_names: List[str]


def run_rollouts(
    agent: agl.LitAgent[Any],
    llm: agl.LLM,
    store_path: Path,
    train: Sequence[Dict[str, Any]] = (),
    val: Sequence[Dict[str, Any]] = (),
) -> List[StoredRollout]:
    """Run ``agent`` on the tasks with ``llm`` as ``main_llm`` (one runner, a SQLite store) and read them back."""
    trainer = agl.Trainer(
        n_runners=1,
        port=0,  # a free port: never another process's store on the default 4747
        store=store_path,
        runner=FAST_RUNNER,
        algorithm=agl.Baseline(polling_interval=0.05, span_verbosity="none"),
        initial_resources={"main_llm": llm},
    )
    trainer.dev(agent, list(train) or None, val_dataset=list(val) or None, progress=False)
    return asyncio.run(_read(store_path))


async def _read(store_path: Path) -> List[StoredRollout]:
    store = SqliteLightningStore(store_path)
    try:
        out = []
        for rollout in await store.query_rollouts():
            spans = list(await store.query_spans(rollout.rollout_id, "latest"))
            reward_spans = find_reward_spans(spans)
            rewards = {r.name: float(r.value) for r in get_rewards_from_span(reward_spans[-1])} if reward_spans else {}
            out.append(
                StoredRollout(
                    task=dict(rollout.input),
                    mode=str(rollout.mode),
                    status=str(rollout.status),
                    rewards=rewards,
                    span_names=[s.name for s in spans],
                )
            )
        return out
    finally:
        await store.close()
