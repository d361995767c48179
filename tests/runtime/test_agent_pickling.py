"""Decorated agents pickle, so they reach child processes started with ``spawn`` or ``forkserver``."""

from __future__ import annotations

import multiprocessing
import pickle
import subprocess
import sys
import time
from pathlib import Path

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


SPAWNED_RUN = """
import asyncio, multiprocessing, sys
import agentbolt as agl

@agl.rollout
def agent(task, prompt_template):
    return float(task) / 10

if __name__ == "__main__":
    multiprocessing.set_start_method(sys.argv[1])
    store = agl.InMemoryLightningStore()
    trainer = agl.Trainer(
        algorithm=agl.Baseline(polling_interval=0.1), tracer=agl.OtelTracer(), strategy="cs", store=store, port=0,
        initial_resources={"p": agl.PromptTemplate(template="x", engine="f-string")},
    )
    trainer.dev(agent, [3, 5], progress=False)
    rollouts = asyncio.run(store.query_rollouts())
    rewards = [agl.find_final_reward(asyncio.run(store.query_spans(r.rollout_id))) for r in rollouts]
    print("dev ok", sorted(r.status for r in rollouts), sorted(rewards), flush=True)
"""


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_client_server_run_works_under_the_start_method(start_method: str, tmp_path: Path) -> None:
    """The runner processes get the agent, tracer and runner pickled (macOS and Windows default to spawn)."""
    script = tmp_path / "train.py"
    script.write_text(SPAWNED_RUN)
    result = subprocess.run(
        [sys.executable, str(script), start_method], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert "dev ok ['succeeded', 'succeeded'] [0.3, 0.5]" in result.stdout, result.stderr[-3000:]
