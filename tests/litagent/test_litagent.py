"""LitAgent: rollout API dispatch, async detection, back references."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from agentbolt.litagent import LitAgent
from agentbolt.litagent.litagent import is_v0_1_rollout_api
from agentbolt.types import Attempt, AttemptedRollout, NamedResources, PromptTemplate, Rollout, RolloutRawResult


def _rollout(mode: str = "train") -> AttemptedRollout:
    now = time.time()
    return AttemptedRollout(
        rollout_id="ro-1",
        input={"q": 1},
        start_time=now,
        mode=mode,  # type: ignore[arg-type]
        attempt=Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=now),
    )


RESOURCES: NamedResources = {"prompt": PromptTemplate(template="Q: {q}", engine="f-string")}


class SyncAgent(LitAgent[dict]):
    def rollout(self, task: dict, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        return float(task["q"]) + (0.5 if rollout.mode == "train" else 0.0)


class AsyncAgent(LitAgent[dict]):
    async def rollout_async(self, task: dict, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        return float(task["q"]) * 2


class TrainingOnlyAsyncAgent(LitAgent[dict]):
    async def training_rollout_async(self, task: dict, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        return 3.0


class Holder:
    """Stands in for a trainer or runner: the agent only keeps a weak reference and reads ``tracer``."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer


def test_sync_agent_variants_delegate_to_rollout() -> None:
    agent = SyncAgent()
    assert not agent.is_async()
    assert agent.training_rollout({"q": 1}, RESOURCES, _rollout()) == 1.5
    assert agent.validation_rollout({"q": 1}, resources=RESOURCES, rollout=_rollout("val")) == 1.0


async def test_async_agent_variants_delegate_to_rollout_async() -> None:
    agent = AsyncAgent()
    assert agent.is_async()
    assert await agent.training_rollout_async({"q": 2}, RESOURCES, _rollout()) == 4.0
    assert await agent.validation_rollout_async({"q": 2}, RESOURCES, _rollout("val")) == 4.0
    assert TrainingOnlyAsyncAgent().is_async()
    with pytest.raises(NotImplementedError):
        await TrainingOnlyAsyncAgent().validation_rollout_async({}, RESOURCES, _rollout("val"))


async def test_base_class_requires_an_implementation() -> None:
    agent: LitAgent[Any] = LitAgent()
    with pytest.raises(NotImplementedError, match="must implement"):
        agent.training_rollout({}, RESOURCES, _rollout())
    with pytest.raises(NotImplementedError, match="must implement"):
        await agent.rollout_async({}, RESOURCES, _rollout())
    agent.on_rollout_start({}, None, None)  # type: ignore[arg-type]  # deprecated no-op hooks
    agent.on_rollout_end({}, None, None, None)  # type: ignore[arg-type]


def test_trained_agents_is_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="agent_match"):
        agent = SyncAgent(trained_agents="planner")
    assert agent.trained_agents == "planner"
    assert SyncAgent().trained_agents is None


def test_trainer_and_runner_are_weak_references() -> None:
    agent = SyncAgent()
    with pytest.raises(ValueError, match=r"Trainer has not been set for this agent\."):
        agent.get_trainer()
    with pytest.raises(ValueError, match=r"Runner has not been set for this agent\."):
        _ = agent.runner

    trainer, runner = Holder("trainer-tracer"), Holder("runner-tracer")
    agent.set_trainer(trainer)  # type: ignore[arg-type]
    agent.set_runner(runner)  # type: ignore[arg-type]
    assert agent.trainer is trainer and agent.get_runner() is runner
    assert agent.tracer == "runner-tracer"
    runner.tracer = None
    assert agent.get_tracer() == "trainer-tracer"

    del runner
    gc.collect()
    with pytest.raises(ValueError, match="no longer valid"):
        agent.get_runner()
    assert agent.get_tracer() == "trainer-tracer"  # falls back to the trainer
    del trainer
    gc.collect()
    with pytest.raises(ValueError, match="no longer valid"):
        agent.get_trainer()


def test_v0_1_signature_detection() -> None:
    def old(task: Any, rollout_id: str) -> None: ...

    def new(task: Any, llm: Any) -> None: ...

    assert is_v0_1_rollout_api(old)
    assert not is_v0_1_rollout_api(new)
