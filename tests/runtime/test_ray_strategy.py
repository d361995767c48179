"""The Ray execution strategy on a local multi-process Ray cluster (a head node and a worker node).

Runners are Ray actors; the store and the algorithm stay in the test process. Covers: rollouts completing on the
actors, a killed actor restarted with its rollout retried by the store's watchdog, placement by custom resources,
clear failures (unplaceable actors, a broken runner), selection by name, and a run of the demo agent on a tiny model.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

pytest.importorskip("ray", reason="the Ray strategy needs the 'ray' package (pip install 'agentbolt[ray]')")

from support.ray_cluster import WORKER_NODE_RESOURCE, LocalRayCluster, local_ray_cluster
from support.servers import REPO

import agentbolt as agl
from agentbolt.emitter.object import get_object_value
from agentbolt.execution.ray import RayExecutionStrategy, RunnerActorFailure
from agentbolt.instrumentation.openai import SPAN_NAME as OPENAI_SPAN
from agentbolt.store.memory import InMemoryLightningStore
from runtime.ray_agents import CrashFirstAttemptAgent, FailingBundle, IdleBundle, PidAgent
from runtime.test_faults import FAST_RUNNER, EnqueueAndWait

RUNTIME_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    with local_ray_cluster() as running:
        yield running


def _strategy(cluster: LocalRayCluster, **kwargs: Any) -> RayExecutionStrategy:
    options: Dict[str, Any] = {
        "address": cluster.address,
        "num_cpus_per_runner": 1,
        "runtime_env": RUNTIME_ENV,
        "graceful_timeout": 5.0,
        "poll_interval": 0.2,
    }
    options.update(kwargs)
    return RayExecutionStrategy(**options)


def _run(store: Any, coroutine_fn: Any) -> Any:
    return asyncio.run(coroutine_fn(store))


def test_rollouts_complete_on_runner_actors(cluster: LocalRayCluster) -> None:
    store = InMemoryLightningStore()
    algorithm = EnqueueAndWait()
    strategy = _strategy(cluster, n_runners=2)
    trainer = agl.Trainer(algorithm=algorithm, store=store, strategy=strategy, runner=FAST_RUNNER, initial_resources={})
    trainer.fit(PidAgent(), [{"i": i} for i in range(6)])

    async def check(store: Any) -> None:
        pids = set()
        for rollout_id in algorithm.rollout_ids:
            rollout = await store.get_rollout_by_id(rollout_id)
            assert rollout is not None and rollout.status == "succeeded"
            spans = await store.query_spans(rollout_id)
            pids |= {get_object_value(s)["pid"] for s in spans if s.name == "agentlightning.object"}
        assert pids and os.getpid() not in pids
        assert pids <= {info["pid"] for info in strategy.actor_info.values()}

    _run(store, check)
    assert sorted(strategy.actor_info) == [0, 1]
    assert strategy.restarts == {} and strategy.given_up == []


def test_killed_runner_actor_is_restarted_and_its_rollout_retried(cluster: LocalRayCluster, tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    config = agl.RolloutConfig(unresponsive_seconds=3.0, max_attempts=3, retry_condition=["unresponsive"])
    algorithm = EnqueueAndWait(config=config)
    strategy = _strategy(cluster, n_runners=1, max_restarts=2)
    trainer = agl.Trainer(algorithm=algorithm, store=store, strategy=strategy, runner=FAST_RUNNER, initial_resources={})
    marker = tmp_path / "crashed"
    trainer.fit(CrashFirstAttemptAgent(), [{"crash": str(marker)}, {"i": 1}])

    assert strategy.restarts == {0: 1} and strategy.given_up == []
    assert int(marker.read_text()) != strategy.actor_info[0]["pid"]  # the killed process was replaced

    async def check(store: Any) -> None:
        first = await store.get_rollout_by_id(algorithm.rollout_ids[0])
        assert first is not None and first.status == "succeeded"
        attempts = list(await store.query_attempts(algorithm.rollout_ids[0]))
        assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
        second = await store.get_rollout_by_id(algorithm.rollout_ids[1])
        assert second is not None and second.status == "succeeded"

    _run(store, check)


class EnqueueOnceActorsStarted(EnqueueAndWait):
    """Enqueue only after ``count`` runner actors have started, so that a quick run still records all of them."""

    def __init__(self, strategy: RayExecutionStrategy, count: int) -> None:
        super().__init__()
        self.strategy = strategy
        self.count = count

    async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        deadline = time.monotonic() + 60
        while len(self.strategy.actor_info) < self.count and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await super().run(train_dataset, val_dataset)


def test_runners_asking_for_a_custom_resource_are_placed_on_the_node_that_has_it(cluster: LocalRayCluster) -> None:
    strategy = _strategy(cluster, n_runners=2, resources_per_runner={WORKER_NODE_RESOURCE: 1})
    algorithm = EnqueueOnceActorsStarted(strategy, count=2)
    trainer = agl.Trainer(algorithm=algorithm, strategy=strategy, runner=FAST_RUNNER, initial_resources={})
    trainer.fit(PidAgent(), [{"i": 0}])
    nodes = {info["node_id"] for info in strategy.actor_info.values()}
    assert len(strategy.actor_info) == 2 and len(nodes) == 1

    # A runner asking for the head's resources only would land elsewhere: the head has no agent_node.
    head_strategy = _strategy(cluster, n_runners=1, num_cpus_per_runner=3)  # only the head has 3 free CPUs
    agl.Trainer(algorithm=EnqueueAndWait(), strategy=head_strategy, runner=FAST_RUNNER, initial_resources={}).fit(
        PidAgent(), [{"i": 1}]
    )
    assert head_strategy.actor_info[0]["node_id"] not in nodes


def test_runners_that_cannot_be_placed_fail_the_run_naming_the_resources(cluster: LocalRayCluster) -> None:
    strategy = _strategy(cluster, n_runners=1, num_gpus_per_runner=1, startup_timeout=3.0)
    trainer = agl.Trainer(
        algorithm=EnqueueAndWait(deadline=60), strategy=strategy, runner=FAST_RUNNER, initial_resources={}
    )
    with pytest.raises(RunnerActorFailure, match=r"1 CPU, 1 GPU.*the cluster has"):
        trainer.fit(PidAgent(), [{"i": 0}])


def test_a_failing_runner_bundle_stops_the_run_with_its_error(cluster: LocalRayCluster) -> None:
    async def algorithm(store: Any, event: Any) -> None:
        while not event.is_set():
            await asyncio.sleep(0.05)

    strategy = _strategy(cluster, n_runners=1)
    started = time.monotonic()
    with pytest.raises(ValueError, match="runner 0 is broken"):
        strategy.execute(algorithm, FailingBundle(), InMemoryLightningStore())
    assert time.monotonic() - started < 60


def test_ctrl_c_stops_the_runner_actors_and_is_recorded(cluster: LocalRayCluster) -> None:
    """SIGINT in the driver (a Ctrl-C) stops the run: execute returns, ``interrupted`` is set, the actors are gone."""
    strategy = _strategy(cluster, n_runners=2)

    async def algorithm(store: Any, event: Any) -> None:
        while not strategy.actor_info:
            await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        while True:
            await asyncio.sleep(0.05)

    strategy.execute(algorithm, IdleBundle(), InMemoryLightningStore())
    assert strategy.interrupted
    for info in strategy.actor_info.values():
        with pytest.raises(ProcessLookupError):
            _wait_until_gone(info["pid"])

    async def finished_algorithm(store: Any, event: Any) -> None:
        return None

    strategy.execute(finished_algorithm, IdleBundle(), InMemoryLightningStore())
    assert not strategy.interrupted


def _wait_until_gone(pid: int) -> None:
    """Raise ProcessLookupError once ``pid`` is gone (the test's timeout fails it otherwise)."""
    while True:
        os.kill(pid, 0)
        time.sleep(0.1)


MAIN_SCRIPT_AGENT = """
import asyncio, json, sys
import agentbolt as agl
from agentbolt.execution.ray import RayExecutionStrategy

@agl.rollout
def agent(task, prompt_template):
    return float(task["x"]) / 10

store = agl.InMemoryLightningStore()
strategy = RayExecutionStrategy(address=sys.argv[1], runtime_env=json.loads(sys.argv[2]), graceful_timeout=5.0)
trainer = agl.Trainer(
    algorithm=agl.Baseline(polling_interval=0.1), store=store, strategy=strategy,
    initial_resources={"prompt": agl.PromptTemplate(template="{x}", engine="f-string")},
)
trainer.fit(agent, [{"x": 3}, {"x": 5}], progress=False)
rollouts = asyncio.run(store.query_rollouts())
print("statuses", sorted(r.status for r in rollouts), flush=True)
"""


def test_an_agent_decorated_in_the_main_script_runs_on_runner_actors(cluster: LocalRayCluster) -> None:
    """A ``@rollout`` function of the main script reaches the actors by value (they do not import that script)."""
    import json
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", MAIN_SCRIPT_AGENT, cluster.address, json.dumps(RUNTIME_ENV)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "statuses ['succeeded', 'succeeded']" in result.stdout, result.stderr[-3000:]


def test_the_trainer_selects_the_ray_strategy_by_name(cluster: LocalRayCluster) -> None:
    trainer = agl.Trainer(strategy={"type": "ray", "address": cluster.address}, n_runners=3)
    assert isinstance(trainer.strategy, RayExecutionStrategy)
    assert trainer.strategy.n_runners == 3 and trainer.strategy.address == cluster.address
    assert isinstance(agl.Trainer(strategy="ray").strategy, RayExecutionStrategy)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_runners": 0}, "n_runners must be at least 1"),
        ({"num_cpus_per_runner": -1}, "num_cpus_per_runner must be at least 0"),
        ({"resources_per_runner": {"x": "one"}}, r"resources_per_runner\['x'\]"),
        ({"max_restarts": -2}, "max_restarts"),
        ({"graceful_timeout": 0}, "graceful_timeout must be greater than 0"),
    ],
)
def test_invalid_settings_are_refused(kwargs: Dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayExecutionStrategy(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"n_runners": "2"}, TypeError, "n_runners must be an integer"),
        ({"n_runners": 1.5}, TypeError, "n_runners must be an integer"),
        ({"n_runners": -3}, ValueError, "n_runners must be at least 1"),
        ({"num_gpus_per_runner": "1"}, TypeError, "num_gpus_per_runner must be a number"),
        ({"num_cpus_per_runner": float("nan")}, ValueError, "num_cpus_per_runner must be a finite number"),
        ({"max_restarts": 1.5}, TypeError, "max_restarts must be an integer"),
        ({"startup_timeout": float("nan")}, ValueError, "startup_timeout must be a finite number"),
        ({"poll_interval": "1"}, TypeError, "poll_interval must be a number"),
        ({"server_port": 70000}, ValueError, "server_port must be at most 65535"),
        ({"server_port": "8000"}, TypeError, "server_port must be an integer"),
        ({"resources_per_runner": ["agent_node"]}, TypeError, "resources_per_runner must be a dict"),
        ({"address": 6379}, TypeError, "address must be a string"),
        ({"address": ""}, ValueError, "address must not be empty"),
        ({"address": "not an address"}, ValueError, "address 'not an address' is not"),
        ({"address": "head:port"}, ValueError, "address 'head:port' is not"),
        ({"address": "head:70000"}, ValueError, "address 'head:70000' is not"),
        ({"init_kwargs": {"address": "auto"}}, ValueError, "init_kwargs must not hold 'address'"),
        ({"init_kwargs": ["num_cpus", 2]}, TypeError, "init_kwargs must be a dict"),
        ({"runtime_env": "env.yaml"}, TypeError, "runtime_env must be a dict"),
    ],
)
def test_wrongly_typed_or_out_of_range_settings_are_refused_naming_the_option(
    kwargs: Dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        RayExecutionStrategy(**kwargs)


def test_a_taken_store_port_is_refused_before_ray_starts() -> None:
    import socket

    import ray

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        strategy = RayExecutionStrategy(server_port=port, init_kwargs={"num_cpus": 1})
        with pytest.raises(RuntimeError, match=f"server_port {port}: .*Address already in use"):
            strategy.execute(EnqueueAndWait(), FailingBundle(), InMemoryLightningStore())
    assert not ray.is_initialized()


def test_an_unshareable_store_without_managed_store_is_refused_before_ray_starts() -> None:
    import ray

    strategy = RayExecutionStrategy(managed_store=False)
    with pytest.raises(ValueError, match=r"managed_store=False.*InMemoryLightningStore cannot be shared"):
        strategy.execute(EnqueueAndWait(), FailingBundle(), InMemoryLightningStore())
    assert not ray.is_initialized()


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_where_no_cluster_answers_is_refused_before_ray_starts(scheme: str) -> None:
    import ray

    from agentbolt.utils.server_launcher import pick_free_port

    address = f"{scheme}127.0.0.1:{pick_free_port()}"  # nothing listens there
    strategy = RayExecutionStrategy(address=address)
    with pytest.raises(ConnectionError, match=f"address {address!r}: nothing answers at 127.0.0.1"):
        strategy.execute(EnqueueAndWait(), FailingBundle(), InMemoryLightningStore())
    assert not ray.is_initialized()


def test_the_demo_agent_runs_on_runner_actors_against_a_served_model(
    cluster: LocalRayCluster, tiny_model_dir: Path
) -> None:
    from support.models import serving

    from agentbolt.demo.agent import CalculatorAgent
    from agentbolt.demo.task import make_splits

    train, _ = make_splits(4, 2, seed=0)
    with serving(tiny_model_dir) as server:
        store = InMemoryLightningStore()
        algorithm = EnqueueAndWait()
        resources = {"main_llm": agl.LLM(endpoint=server.base_url, model="tiny", sampling_parameters={"max_tokens": 8})}
        trainer = agl.Trainer(
            algorithm=algorithm,
            store=store,
            strategy=_strategy(cluster, n_runners=2),
            runner=FAST_RUNNER,
            initial_resources=resources,
        )
        trainer.fit(CalculatorAgent(max_turns=1, max_tokens=8), train)

    async def check(store: Any) -> None:
        for rollout_id in algorithm.rollout_ids:
            rollout = await store.get_rollout_by_id(rollout_id)
            assert rollout is not None and rollout.status == "succeeded", rollout
            spans = await store.query_spans(rollout_id)
            assert any(s.name == OPENAI_SPAN for s in spans), [s.name for s in spans]

    _run(store, check)


@pytest.mark.slow
def test_grpo_trains_the_demo_agent_with_runner_actors(cluster: LocalRayCluster, tiny_model_dir: Path) -> None:
    from agentbolt.algorithm.grpo import GRPO
    from agentbolt.demo.agent import CalculatorAgent
    from agentbolt.demo.task import make_splits

    train, val = make_splits(4, 2, seed=0)
    algorithm = GRPO(
        model=str(tiny_model_dir),
        served_model_name="tiny",
        batch_size=2,
        group_size=2,
        max_steps=2,
        sampling_parameters={"temperature": 1.0, "max_tokens": 8},
        val_sampling_parameters={"temperature": 0.0, "max_tokens": 8},
        val_before_train=True,
        console=False,
        rollout_timeout=300,
        seed=0,
    )
    trainer = agl.Trainer(algorithm=algorithm, strategy=_strategy(cluster, n_runners=2), runner=FAST_RUNNER)
    trainer.fit(CalculatorAgent(max_turns=1, max_tokens=8), train_dataset=train, val_dataset=val)
    steps = [record for record in algorithm.history if "train/reward_mean" in record]
    assert len(steps) == 2 and any("val/accuracy" in record for record in algorithm.history)
