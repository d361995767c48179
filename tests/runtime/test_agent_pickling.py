"""Decorated agents pickle, so they reach child processes started with ``spawn`` or ``forkserver``."""

from __future__ import annotations

import multiprocessing
import pickle
import time

import pytest

import agentbolt as agl
from agentbolt.litagent.decorator import FunctionalLitAgent
from runtime.picklable_agents import (
    PROMPT,
    doubling_agent,
    identity,
    run_rollout,
    tripling,
    tripling_agent,
    unstripped_agent,
)


def _rollout(task: int) -> agl.Rollout:
    return agl.Rollout(rollout_id="ro-1", input=task, start_time=time.time())


def test_decorated_module_level_function_pickles_by_reference() -> None:
    # The module's `doubling_agent` is the agent, so pickle finds the agent by name, as it finds functions.
    restored = pickle.loads(pickle.dumps(doubling_agent))
    assert restored is doubling_agent
    assert restored.rollout(4, {"prompt": PROMPT}, _rollout(4)) == 8.0
    assert pickle.loads(pickle.dumps(unstripped_agent)) is unstripped_agent


def test_agent_made_by_a_call_pickles_its_function_and_settings() -> None:
    restored = pickle.loads(pickle.dumps(tripling_agent))
    assert restored is not tripling_agent
    assert isinstance(restored, FunctionalLitAgent)
    assert restored.__wrapped__ is tripling
    assert restored.rollout(2, {"prompt": PROMPT}, _rollout(2)) == 6.0
    for strip_proxy in (True, False):
        agent = agl.llm_rollout(strip_proxy=strip_proxy)(identity)
        assert pickle.loads(pickle.dumps(agent))._strip_proxy is strip_proxy


def test_local_agent_still_refuses_to_pickle() -> None:
    @agl.rollout
    def local_agent(task: int, prompt_template: agl.PromptTemplate) -> float:
        return 0.0

    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(local_agent)


def test_spawned_child_unpickles_and_runs_the_agent() -> None:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=run_rollout, args=(doubling_agent, 21, results))
    process.start()
    try:
        assert results.get(timeout=60) == 42.0
        process.join(30)
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            process.kill()
            process.join()
