"""Functional agents refuse resources that are not a mapping and non-bool options, naming what they got."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import agentbolt as agl
from agentbolt.litagent.decorator import FunctionalLitAgent
from agentbolt.types import LLM, Attempt, AttemptedRollout

LOCAL = LLM(endpoint="http://127.0.0.1:9/v1", model="local")


def _attempted() -> AttemptedRollout:
    now = time.time()
    return AttemptedRollout(
        rollout_id="ro-abc",
        input="task",
        start_time=now,
        mode="train",
        attempt=Attempt(rollout_id="ro-abc", attempt_id="at-xyz", sequence_id=1, start_time=now),
    )


def _sync_agent(task: Any, llm: LLM) -> float:
    return 1.0


async def _async_agent(task: Any, llm: LLM) -> float:
    return 1.0


@pytest.mark.parametrize("resources", [[LOCAL], (LOCAL,), "main", None])
def test_rollout_with_resources_that_are_not_a_mapping_raises_type_error_naming_the_type(resources: Any) -> None:
    agent = agl.llm_rollout(_sync_agent)
    with pytest.raises(
        TypeError, match=rf"resources must be NamedResources \(a mapping .*got {type(resources).__name__}$"
    ):
        agent.rollout("t", resources, _attempted())


def test_async_rollout_with_a_list_of_resources_raises_type_error() -> None:
    agent = agl.llm_rollout(_async_agent)
    with pytest.raises(TypeError, match=r"resources must be NamedResources .*got list"):
        asyncio.run(agent.training_rollout_async("t", [LOCAL], _attempted()))  # type: ignore[arg-type]


def test_rollout_with_a_mapping_of_resources_still_injects_the_llm() -> None:
    agent = agl.llm_rollout(lambda task, llm: llm)
    assert agent.rollout("t", {"main": LOCAL}, _attempted()) is LOCAL


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_llm_rollout_refuses_a_strip_proxy_that_is_not_a_bool(value: Any) -> None:
    with pytest.raises(TypeError, match=rf"strip_proxy must be True or False, got {type(value).__name__} {value!r}"):
        agl.llm_rollout(strip_proxy=value)
    with pytest.raises(TypeError, match="strip_proxy must be True or False"):
        agl.llm_rollout(_sync_agent, strip_proxy=value)


def test_functional_lit_agent_refuses_a_strip_proxy_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="strip_proxy must be True or False, got str 'no'"):
        FunctionalLitAgent(_sync_agent, strip_proxy="no")  # type: ignore[arg-type]


def test_strip_proxy_false_is_accepted() -> None:
    assert isinstance(agl.llm_rollout(strip_proxy=False)(_sync_agent), FunctionalLitAgent)
