"""Trainer component construction (contract §12): specs, defaults, deprecations, errors."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import agentbolt as agl
from agentbolt.adapter import TracerTraceToTriplet, TraceToMessages
from agentbolt.execution import ClientServerExecutionStrategy, SharedMemoryExecutionStrategy
from agentbolt.runner import LitAgentRunner
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer, DummyTracer, OtelTracer
from agentbolt.trainer import build_component
from agentbolt.trainer.init_utils import instantiate_from_spec, load_class


def test_defaults() -> None:
    trainer = agl.Trainer()
    assert isinstance(trainer.tracer, AgentOpsTracer)
    assert isinstance(trainer.adapter, TracerTraceToTriplet)
    assert isinstance(trainer.strategy, ClientServerExecutionStrategy)
    assert trainer.strategy.n_runners == 1
    assert isinstance(trainer.store, InMemoryLightningStore) and trainer.store.capabilities["thread_safe"]
    assert isinstance(trainer.runner, LitAgentRunner) and trainer.runner.tracer is trainer.tracer
    assert trainer.algorithm is None and trainer.llm_proxy is None and trainer.hooks == ()


def test_strategy_specs_and_runner_sync() -> None:
    trainer = agl.Trainer(strategy="shm")
    assert isinstance(trainer.strategy, SharedMemoryExecutionStrategy)
    trainer = agl.Trainer(strategy={"type": "shm", "n_runners": 4, "main_thread": "algorithm"})
    assert trainer.n_runners == 4 and trainer.n_workers == 4
    trainer = agl.Trainer(n_runners=3, port=9911)
    assert isinstance(trainer.strategy, ClientServerExecutionStrategy)
    assert trainer.strategy.n_runners == 3 and trainer.strategy.server_port == 9911
    strategy = ClientServerExecutionStrategy(n_runners=2)
    trainer = agl.Trainer(strategy=strategy, port=9912)
    assert trainer.strategy is strategy and strategy.server_port == 9912 and trainer.n_runners == 2
    assert not isinstance(agl.Trainer(strategy="cs").store, type(None))


def test_component_specs() -> None:
    trainer = agl.Trainer(
        tracer=DummyTracer,
        adapter={"agent_match": "planner", "repair_hierarchy": False},
        runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.5},
        max_rollouts=7,
        strategy="shm",
    )
    assert isinstance(trainer.tracer, DummyTracer)
    assert isinstance(trainer.adapter, TracerTraceToTriplet)
    assert trainer.adapter.agent_match == "planner" and trainer.adapter.repair_hierarchy is False
    assert isinstance(trainer.runner, LitAgentRunner)
    assert trainer.runner._poll_interval == 0.5 and trainer.runner._max_rollouts == 7
    assert trainer.runner.tracer is trainer.tracer
    trainer = agl.Trainer(adapter="agentbolt.adapter.TraceToMessages", tracer=lambda: OtelTracer())
    assert isinstance(trainer.adapter, TraceToMessages) and isinstance(trainer.tracer, OtelTracer)


def test_sqlite_store_from_path(tmp_path: Path) -> None:
    from agentbolt.store.sqlite import SqliteLightningStore

    for spec in (str(tmp_path / "a.db"), f"sqlite:///{tmp_path / 'b.sqlite'}", tmp_path / "c.db"):
        trainer = agl.Trainer(store=spec, strategy="shm")
        assert isinstance(trainer.store, SqliteLightningStore)
    agl.Trainer(store=str(tmp_path / "runs" / "store.db"), strategy="shm")  # missing folders are created
    assert (tmp_path / "runs" / "store.db").is_file()


def test_deprecated_aliases_warn() -> None:
    with pytest.warns(DeprecationWarning):
        trainer = agl.Trainer(n_workers=2)
    assert trainer.n_runners == 2
    with pytest.warns(DeprecationWarning):
        trainer = agl.Trainer(max_tasks=5)
    assert trainer.max_rollouts == 5
    with pytest.warns(DeprecationWarning):
        trainer = agl.Trainer(triplet_exporter=TraceToMessages())
    assert isinstance(trainer.adapter, TraceToMessages)
    with pytest.warns(DeprecationWarning):
        agl.Trainer(dev=True)


def test_hooks_forms() -> None:
    hook = agl.Hook()
    assert agl.Trainer(hooks=hook).hooks == (hook,)
    assert agl.Trainer(hooks=[hook, hook]).hooks == (hook, hook)


def test_build_component_errors() -> None:
    with pytest.raises(ValueError, match="cannot be None"):
        build_component(None, expected_type=OtelTracer, spec_name="tracer")
    assert build_component(None, expected_type=OtelTracer, spec_name="tracer", allow_none=True) is None
    with pytest.raises(ValueError, match="Invalid tracer type"):
        build_component(42, expected_type=OtelTracer, spec_name="tracer")
    with pytest.raises(ValueError, match="Invalid tracer type"):
        build_component(dict, expected_type=OtelTracer, spec_name="tracer")
    with pytest.raises(TypeError, match="not a OtelTracer subclass"):
        build_component(lambda: 1, expected_type=OtelTracer, spec_name="tracer")
    with pytest.raises(ValueError, match="must have a 'type' key"):
        build_component({"x": 1}, expected_type=OtelTracer, spec_name="tracer")
    with pytest.raises(ValueError, match="Cannot import"):
        load_class("no_such_module_xyz.Thing")
    with pytest.raises(ValueError, match="full import path"):
        load_class("Thing")
    with pytest.raises(TypeError):
        instantiate_from_spec(3, spec_name="x")  # type: ignore[arg-type]


def test_invalid_strategy_settings() -> None:
    with pytest.raises(ValueError):
        SharedMemoryExecutionStrategy(main_thread="runner", n_runners=2)
    with pytest.raises(ValueError):
        SharedMemoryExecutionStrategy(main_thread="nobody")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ClientServerExecutionStrategy(role="boss")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ClientServerExecutionStrategy(main_process="runner", n_runners=2)


def test_client_server_strategy_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_SERVER_PORT", "10000")
    monkeypatch.setenv("AGL_SERVER_HOST", "10.1.2.3")
    monkeypatch.setenv("AGL_CURRENT_ROLE", "algorithm")
    monkeypatch.setenv("AGL_MANAGED_STORE", "0")
    strategy = ClientServerExecutionStrategy()
    assert (strategy.server_port, strategy.server_host, strategy.role, strategy.managed_store) == (
        10000,
        "10.1.2.3",
        "algorithm",
        False,
    )
    monkeypatch.setenv("AGL_SERVER_PORT", "not-a-port")
    with pytest.raises(ValueError, match="integer"):
        ClientServerExecutionStrategy()


def test_fit_with_shared_memory_and_no_algorithm_stops_on_max_rollouts() -> None:
    calls: list[Any] = []

    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        calls.append(task)
        return 1.0

    async def feed(store: Any) -> None:
        rid = (await store.add_resources({"p": agl.PromptTemplate(template="x", engine="f-string")})).resources_id
        for i in range(2):
            await store.enqueue_rollout(input=i, resources_id=rid)

    store = InMemoryLightningStore()
    import asyncio

    asyncio.run(feed(store))
    trainer = agl.Trainer(
        strategy={"type": "shm", "main_thread": "runner", "graceful_delay": 0.1},
        store=store,
        max_rollouts=2,
        runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 0},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(agent)
    assert sorted(calls) == [0, 1]
