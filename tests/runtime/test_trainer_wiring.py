"""What the Trainer wires for an example: a store port of its own, gateways given as resources, quiet progress."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest
from support.fake_openai import FakeOpenAIConfig, FakeOpenAIServer

import agentbolt as agl
from agentbolt.store.sqlite import SqliteLightningStore
from runtime.agents import GatewayAgent

FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0}
TASKS: List[Dict[str, Any]] = [{"q": f"question {i}", "question": f"question {i}"} for i in range(3)]


def test_port_zero_picks_a_free_port_for_each_run(tmp_path: Path) -> None:
    strategy = agl.ClientServerExecutionStrategy(n_runners=2, server_port=0)
    for run in range(2):  # a second run gets a port again (the first one's may be taken meanwhile)
        store = SqliteLightningStore(str(tmp_path / f"store-{run}.db"))
        trainer = agl.Trainer(
            strategy=strategy,
            store=store,
            runner=FAST_RUNNER,
            algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
            initial_resources={"main_llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")},
        )
        trainer.dev(_no_llm_agent, [{"x": 1}, {"x": 2}], progress=False)
        assert strategy.server_port == 0
        rollouts = asyncio.run(store.query_rollouts())
        assert [r.status for r in rollouts] == ["succeeded", "succeeded"]


@agl.rollout
def _no_llm_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    return float(task["x"])


def test_port_zero_needs_both_roles_in_one_run() -> None:
    with pytest.raises(ValueError, match="server_port=0"):
        agl.ClientServerExecutionStrategy(role="algorithm", server_port=0)
    assert agl.Trainer(port=0).strategy.server_port == 0


def test_a_gateway_given_as_resource_records_into_the_runs_store(tmp_path: Path) -> None:
    store = SqliteLightningStore(str(tmp_path / "store.db"))
    with FakeOpenAIServer(FakeOpenAIConfig(token_ids=True)) as backend:
        proxy = agl.LLMProxy(
            model_list=[
                {
                    "model_name": "fixed",
                    "litellm_params": {"model": "hosted_vllm/fake-model", "api_base": backend.base_url},
                }
            ],
            launch_mode="thread",
        )
        trainer = agl.Trainer(
            strategy={"type": "cs", "server_port": 0, "n_runners": 2},
            store=store,
            runner=FAST_RUNNER,
            algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
            initial_resources={"fixed_llm": proxy},
        )
        trainer.dev(GatewayAgent(), TASKS, progress=False)
        assert not proxy.is_running()  # started for the run, stopped after it

    async def check() -> None:
        rollouts = await store.query_rollouts()
        assert len(rollouts) == len(TASKS) and {r.status for r in rollouts} == {"succeeded"}
        for rollout in rollouts:
            spans = await store.query_spans(rollout.rollout_id, "latest")
            recorded = [s for s in spans if s.name == "agentbolt.llm_call"]
            assert len(recorded) == 1, [s.name for s in spans]  # the gateway's record of the agent's one call
            assert recorded[0].attributes.get("prompt_token_ids")
        resources = await store.get_latest_resources()
        assert resources is not None and isinstance(resources.resources["fixed_llm"], agl.ProxyLLM)

    asyncio.run(check())


class _SelfReporting(agl.Baseline):
    @property
    def reports_progress(self) -> bool:
        return True


def test_fit_adds_no_rollout_lines_for_an_algorithm_that_reports_its_own(caplog: pytest.LogCaptureFixture) -> None:
    from agentbolt.algorithm.progress import PROGRESS_LOGGER_NAME

    assert agl.Baseline().reports_progress and not agl.Algorithm().reports_progress
    assert agl.GRPO(console=True).reports_progress and not agl.GRPO(console=False).reports_progress

    class Silent(agl.Algorithm):
        def __init__(self, reports: bool) -> None:
            self.reports = reports

        @property
        def reports_progress(self) -> bool:
            return self.reports

        async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
            store = self.get_store()
            resources = await store.add_resources(self.get_initial_resources() or {})
            rollout = await store.enqueue_rollout(
                input={"question": "q"}, mode="train", resources_id=resources.resources_id
            )
            await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=30)

    for reports, expected_lines in ((True, 0), (False, 1)):
        caplog.clear()
        trainer = agl.Trainer(
            strategy="shm",
            runner=FAST_RUNNER,
            algorithm=Silent(reports),
            initial_resources={"main_llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")},
        )
        with caplog.at_level(logging.INFO, logger=PROGRESS_LOGGER_NAME):
            trainer.fit(two_call_agent_without_llm, [{"question": "q"}])
        lines = [r for r in caplog.records if r.name == PROGRESS_LOGGER_NAME and r.getMessage().startswith("Rollout ")]
        assert len(lines) == expected_lines, [r.getMessage() for r in caplog.records]


@agl.rollout
def two_call_agent_without_llm(task: Dict[str, Any], llm: agl.LLM) -> float:
    return 1.0
