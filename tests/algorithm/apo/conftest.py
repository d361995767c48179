"""Fixtures of the prompt-optimization tests: the scripted stand-in server, an agent calling it, a Trainer run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from apo_standin import CAPITALS, SEED_TEMPLATE, Script, create_app
from support.fake_openai import FakeOpenAIServer

import agentbolt as agl

_BASE_URL: Dict[str, str] = {}


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def standin(script: Script) -> Iterator[FakeOpenAIServer]:
    """The stand-in server (see apo_standin.py), reachable by the test agent."""
    with FakeOpenAIServer(app=create_app(script)) as server:
        _BASE_URL["url"] = server.base_url
        yield server
    _BASE_URL.pop("url", None)


@pytest.fixture
def optimizer_client(standin: FakeOpenAIServer) -> Any:
    """An AsyncOpenAI client of the stand-in; no SDK retries, so the optimizer's own retries are what runs."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=standin.base_url, api_key="stand-in", max_retries=0)


@agl.rollout
async def capital_agent(task: Dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    """Ask the stand-in's agent model; reward 1 for the bare city name."""
    from openai import AsyncOpenAI

    if task.get("crash"):
        raise RuntimeError("the agent crashed on purpose")
    client = AsyncOpenAI(base_url=_BASE_URL["url"], api_key="stand-in", max_retries=0)
    response = await client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": prompt_template.format(country=task["country"])}]
    )
    await client.close()
    answer = response.choices[0].message.content
    agl.emit_message(f"expected {CAPITALS[task['country']]}, got {answer}")
    return 1.0 if answer == CAPITALS[task["country"]] else 0.0


def capital_tasks(countries: List[str]) -> List[Dict[str, Any]]:
    return [{"country": c} for c in countries]


TRAIN = capital_tasks(["France", "Chile", "Egypt", "Spain", "Japan", "Italy"])
VAL = capital_tasks(["Kenya", "Peru", "Canada", "Norway"])


def fit(
    algorithm: agl.Algorithm,
    *,
    train: Optional[List[Dict[str, Any]]] = None,
    val: Optional[List[Dict[str, Any]]] = None,
    store: Any = None,
    initial_resources: Any = "seed",
    adapter: Any = None,
) -> Any:
    """Run ``algorithm`` on the capital agent in one process (shared-memory strategy); returns the store."""
    store = store if store is not None else agl.InMemoryLightningStore()
    resources = (
        {"prompt_template": agl.PromptTemplate(template=SEED_TEMPLATE, engine="f-string")}
        if initial_resources == "seed"
        else initial_resources
    )
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store,
        strategy=agl.SharedMemoryExecutionStrategy(n_runners=1),
        initial_resources=resources,
        adapter=adapter if adapter is not None else agl.TraceToMessages(),
        runner=agl.LitAgentRunner(tracer=agl.AgentOpsTracer(), poll_interval=0.02),
    )
    trainer.fit(capital_agent, train_dataset=TRAIN if train is None else train, val_dataset=VAL if val is None else val)
    return store


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "apo.sqlite"
