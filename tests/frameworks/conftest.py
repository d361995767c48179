"""Fixtures: the tool-calling tiny model served in-process, and Trainer.dev runs through the LLM gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving
from support.servers import free_port

import agentbolt as agl
from agentbolt.serving.server import InferenceServer
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import Span

from .tool_model import build_tool_calling_model

FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0}


@pytest.fixture(scope="session")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceServer]:
    """``agentbolt serve``'s server in this process, on the model that calls ``add`` once and then answers."""
    with serving(build_tool_calling_model(tmp_path_factory.mktemp("tool-model"))) as server:
        yield server


def run_dev(
    agent: Any, tasks: Sequence[Dict[str, Any]], server: InferenceServer, tmp_path: Path, strategy: str = "cs"
) -> List[List[Span]]:
    """Run ``agent`` with ``Trainer.dev`` through the gateway, as a user would; return each rollout's spans.

    The gateway (``LLMProxy``) sits in front of the served model and the agent gets it as a ``ProxyLLM`` resource,
    bound to each attempt. Every rollout must succeed.
    """
    store = SqliteLightningStore(str(tmp_path / "store.db"))
    model_list = [{"model_name": "tiny", "litellm_params": {"model": "agentbolt/tiny", "api_base": server.base_url}}]
    proxy = agl.LLMProxy(model_list=model_list, launch_mode="thread")
    trainer = agl.Trainer(
        store=store,
        strategy={"type": "cs", "server_port": free_port(), "n_runners": 1} if strategy == "cs" else strategy,
        runner=FAST_RUNNER,
        algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
        llm_proxy=proxy,
        initial_resources={"main_llm": proxy.as_resource()},
    )
    trainer.dev(agent, list(tasks), progress=False)

    async def collect() -> List[List[Span]]:
        try:
            rollouts = await store.query_rollouts()
            assert [r.status for r in rollouts] == ["succeeded"] * len(tasks)
            return [list(await store.query_spans(r.rollout_id, "latest")) for r in rollouts]
        finally:
            await store.close()

    return asyncio.run(collect())
