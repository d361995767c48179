"""Trainer.dev end to end: real OpenAI SDK agent, fake OpenAI backend, both execution strategies."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest
from support.fake_openai import FakeOpenAIConfig, FakeOpenAIServer

import agentbolt as agl
from agentbolt.adapter import TracerTraceToTriplet, TraceToMessages
from agentbolt.emitter import find_final_reward
from agentbolt.store.sqlite import SqliteLightningStore
from runtime.agents import echo_agent

TASKS: List[Dict[str, Any]] = [{"question": f"what is {i} + {i}?"} for i in range(3)]
FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0}


@pytest.fixture(scope="module")
def fake_openai() -> Any:
    with FakeOpenAIServer(FakeOpenAIConfig(token_ids=True)) as server:
        yield server


def _run_dev(strategy: Any, store: Any, fake_openai: FakeOpenAIServer) -> None:
    trainer = agl.Trainer(
        n_runners=2 if strategy != "shm" else 1,
        strategy=strategy,
        store=store,
        runner=FAST_RUNNER,
        algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
        initial_resources={"main_llm": agl.LLM(endpoint=fake_openai.base_url, model="fake-model")},
    )
    trainer.dev(echo_agent, TASKS)


async def _check_store(store: agl.LightningStore) -> None:
    rollouts = await store.query_rollouts()
    assert len(rollouts) == len(TASKS)
    assert {r.status for r in rollouts} == {"succeeded"}
    for rollout in rollouts:
        spans = list(await store.query_spans(rollout.rollout_id, "latest"))
        names = [s.name for s in spans]
        assert names.count("openai.chat.completion") == 4, names
        assert find_final_reward(spans) == 1.0
        sequence_ids = [s.sequence_id for s in spans]
        assert sequence_ids == sorted(sequence_ids) and len(set(sequence_ids)) == len(sequence_ids)
        llm_spans = [s for s in spans if s.name == "openai.chat.completion"]
        for span in llm_spans:
            assert isinstance(span.attributes.get("prompt_token_ids"), list)
            assert isinstance(span.attributes.get("response_token_ids"), list)
        triplets = TracerTraceToTriplet().adapt(spans)
        assert len(triplets) == 4
        assert triplets[-1].reward == 1.0
        assert all(t.prompt["token_ids"] and t.response["token_ids"] for t in triplets)
        conversations = TraceToMessages().adapt(spans)
        tool_conversations = [c for c in conversations if c["tools"]]
        assert tool_conversations, "the tool-call turns must carry their tool definitions"
        assert any(
            m.get("role") == "assistant" and m.get("tool_calls") for c in tool_conversations for m in c["messages"]
        )


@pytest.mark.parametrize("strategy", ["shm", "cs"])
def test_dev_runs_agent_and_records_everything(
    strategy: str, tmp_path: Path, fake_openai: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteLightningStore(str(tmp_path / "store.db"))
    strategy_spec: Any = strategy
    if strategy == "cs":
        from support.servers import free_port

        strategy_spec = {"type": "cs", "server_port": free_port(), "n_runners": 2}
    with caplog.at_level(logging.INFO, logger="agentbolt"):
        _run_dev(strategy_spec, store, fake_openai)
    try:
        asyncio.run(_check_store(store))
    finally:
        asyncio.run(store.close())
    assert any("Finished with status succeeded" in r.getMessage() for r in caplog.records)


def test_dev_rejects_training_algorithms() -> None:
    class Slow(agl.Algorithm):
        def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
            return None

    trainer = agl.Trainer(algorithm=Slow(), strategy="shm")
    with pytest.raises(TypeError, match="FastAlgorithm"):
        trainer.dev(echo_agent, TASKS)


class _NeedsNoResources(agl.LitAgent[Any]):
    def training_rollout(self, task: Any, resources: Any, rollout: Any) -> float:
        assert resources == {}
        return 1.0


def test_an_agent_needing_no_resources_runs_with_empty_initial_resources(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.InMemoryLightningStore()
    trainer = agl.Trainer(
        strategy="shm",
        store=store,
        runner=FAST_RUNNER,
        algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
        initial_resources={},
    )
    with caplog.at_level(logging.WARNING, logger="agentbolt"):
        trainer.dev(_NeedsNoResources(), TASKS[:2])
    assert {r.status for r in asyncio.run(store.query_rollouts())} == {"succeeded"}
    assert not [r for r in caplog.records if "No initial resources" in r.getMessage()]


async def test_baseline_without_resources_says_how_to_give_them(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.InMemoryLightningStore()
    algorithm = agl.Baseline(polling_interval=0.05, span_verbosity="none")
    algorithm.set_store(store)
    with caplog.at_level(logging.WARNING, logger="agentbolt"):
        running = asyncio.ensure_future(algorithm.run(train_dataset=TASKS[:1]))
        for _ in range(100):  # no runner: the rollout stays queued, and the algorithm has spoken by now
            if await store.query_rollouts():
                break
            await asyncio.sleep(0.02)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    warnings = [r.getMessage() for r in caplog.records if "No initial resources" in r.getMessage()]
    assert len(warnings) == 1 and "initial_resources" in warnings[0]


def test_fit_without_an_algorithm_says_the_datasets_are_not_used(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.InMemoryLightningStore()

    async def queue_one() -> None:
        resources_id = (await store.add_resources({})).resources_id
        await store.enqueue_rollout(input={"n": 1}, resources_id=resources_id)

    asyncio.run(queue_one())
    trainer = agl.Trainer(strategy="shm", store=store, runner={**FAST_RUNNER, "max_rollouts": 1})
    with caplog.at_level(logging.WARNING, logger="agentbolt.trainer"):
        trainer.fit(_NeedsNoResources(), [{"n": 2}], progress=False)  # ends when the runner's one rollout is done
    (warning,) = [r.getMessage() for r in caplog.records if "without an algorithm" in r.getMessage()]
    assert "train_dataset not used" in warning and "Ctrl-C" in warning


def test_dev_ends_when_runner_threads_reach_max_rollouts_before_the_tasks_are_done() -> None:
    store = agl.InMemoryLightningStore()
    trainer = agl.Trainer(
        strategy={"type": "shm", "main_thread": "algorithm", "graceful_delay": 0.5},
        n_runners=2,
        max_rollouts=1,
        store=store,
        runner=FAST_RUNNER,
        algorithm=agl.Baseline(polling_interval=0.05, span_verbosity="none"),
        initial_resources={},
    )
    running = threading.Thread(target=trainer.dev, args=(_NeedsNoResources(), TASKS * 2), daemon=True)
    running.start()
    running.join(30)
    assert not running.is_alive(), "Trainer.dev waits for rollouts no runner is left to run"
    statuses = sorted(r.status for r in asyncio.run(store.query_rollouts()))
    assert statuses.count("succeeded") == 2 and "running" not in statuses
