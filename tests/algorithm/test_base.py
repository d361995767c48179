"""Algorithm base class, functional algorithms, lazy factories and algorithm utilities."""

from __future__ import annotations

import gc
import importlib.util
import random
import subprocess
import sys
from typing import Any, List, Optional

import pytest

import agentbolt as agl
from agentbolt.adapter import TracerTraceToTriplet
from agentbolt.algorithm import Algorithm, Baseline, FastAlgorithm, algo
from agentbolt.algorithm.decorator import FunctionalAlgorithm
from agentbolt.algorithm.utils import batch_iter_over_dataset, with_llm_proxy, with_store
from agentbolt.types import PromptTemplate


class ProxyStandIn:
    """Stands in for an LLMProxy (whose real server is out of scope here): records start/stop calls."""

    def __init__(self, running: bool = False) -> None:
        self.running = running
        self.calls: List[str] = []

    def is_running(self) -> bool:
        return self.running

    async def start(self) -> None:
        self.calls.append("start")
        self.running = True

    async def stop(self) -> None:
        self.calls.append("stop")
        self.running = False


class StoreToken:
    """Any object works as the store for these tests: the helpers only pass it through."""


def test_top_level_exports_resolve() -> None:
    assert agl.Algorithm is Algorithm and agl.Baseline is Baseline and agl.FastAlgorithm is FastAlgorithm
    assert agl.algo is algo
    assert issubclass(Baseline, FastAlgorithm) and issubclass(FastAlgorithm, Algorithm)


def test_importing_the_runtime_packages_stays_light() -> None:
    code = "import sys, agentbolt.algorithm, agentbolt.adapter, agentbolt.litagent; print('\\n'.join(sys.modules))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    )
    assert not loaded & {"torch", "transformers", "openai", "fastapi", "uvicorn", "aiohttp", "httpx", "graphviz"}


async def test_algorithm_base_contract() -> None:
    class SyncAlgo(Algorithm):
        def run(self, train_dataset: Any = None, val_dataset: Any = None) -> Any:
            return ("sync", train_dataset)

    class AsyncAlgo(Algorithm):
        async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> Any:
            return "async"

    assert not SyncAlgo().is_async() and AsyncAlgo().is_async()
    assert SyncAlgo()([1]) == ("sync", [1])
    assert await AsyncAlgo()() == "async"
    base = Algorithm()
    with pytest.raises(NotImplementedError):
        base.run()
    with pytest.raises(NotImplementedError):
        base.get_client()


def test_collaborators_strong_and_weak_references() -> None:
    algorithm = Algorithm()
    with pytest.raises(ValueError, match=r"Store has not been set for this algorithm\."):
        algorithm.get_store()
    with pytest.raises(ValueError, match=r"Adapter has not been set for this algorithm\."):
        algorithm.get_adapter()
    with pytest.raises(ValueError, match=r"Trainer has not been set"):
        algorithm.get_trainer()
    assert algorithm.get_llm_proxy() is None
    assert algorithm.get_initial_resources() is None

    store = StoreToken()
    algorithm.set_store(store)  # type: ignore[arg-type]
    resources = {"prompt": PromptTemplate(template="{x}", engine="f-string")}
    algorithm.set_initial_resources(resources)  # type: ignore[arg-type]
    adapter = TracerTraceToTriplet()
    algorithm.set_adapter(adapter)
    proxy = ProxyStandIn()
    algorithm.set_llm_proxy(proxy)  # type: ignore[arg-type]
    assert algorithm.get_store() is store
    assert algorithm.get_initial_resources() is resources
    assert algorithm.get_adapter() is adapter
    assert algorithm.get_llm_proxy() is proxy

    del store, adapter, proxy
    gc.collect()
    assert isinstance(algorithm.get_store(), StoreToken)  # held strongly
    with pytest.raises(ValueError, match="no longer valid"):
        algorithm.get_adapter()
    with pytest.raises(ValueError, match="no longer valid"):
        algorithm.get_llm_proxy()
    algorithm.set_llm_proxy(None)
    assert algorithm.get_llm_proxy() is None


async def test_functional_algorithm_injects_declared_parameters_only() -> None:
    calls: List[Any] = []

    @algo
    def sync_algorithm(store: Any, train_dataset: Any, initial_resources: Any) -> str:
        """Sync algorithm doc."""
        calls.append((store, train_dataset, initial_resources))
        return "ignored"

    assert isinstance(sync_algorithm, FunctionalAlgorithm)
    assert sync_algorithm.__name__ == "sync_algorithm" and sync_algorithm.__doc__ == "Sync algorithm doc."
    assert not sync_algorithm.is_async()
    store = StoreToken()
    sync_algorithm.set_store(store)  # type: ignore[arg-type]
    assert sync_algorithm.run(train_dataset=[1, 2]) is None
    assert calls == [(store, [1, 2], None)]
    with pytest.raises(TypeError, match="val_dataset"):
        sync_algorithm.run(train_dataset=[1], val_dataset=[2])

    @algo
    async def async_algorithm(adapter: Any, llm_proxy: Any, val_dataset: Any = None) -> str:
        return f"{type(adapter).__name__}:{llm_proxy}:{val_dataset}"

    adapter = TracerTraceToTriplet()
    async_algorithm.set_adapter(adapter)
    assert async_algorithm.is_async()
    assert await async_algorithm.run(val_dataset=["v"]) == "TracerTraceToTriplet:None:['v']"
    with pytest.raises(TypeError, match="train_dataset"):
        async_algorithm.run(train_dataset=["t"])
    assert await async_algorithm(adapter, None) == "TracerTraceToTriplet:None:None"  # raw call


async def test_with_store_and_with_llm_proxy_stack() -> None:
    class Algo(Algorithm):
        @with_llm_proxy()
        @with_store
        async def work(self, store: Any, llm_proxy: Optional[ProxyStandIn], value: int) -> Any:
            running = llm_proxy.is_running() if llm_proxy is not None else None
            return store, llm_proxy, value, running

        @with_llm_proxy(required=True)
        async def needs_proxy(self, llm_proxy: ProxyStandIn) -> ProxyStandIn:
            return llm_proxy

        @with_llm_proxy(auto_start=False)
        async def no_start(self, llm_proxy: ProxyStandIn) -> bool:
            return llm_proxy.is_running()

    algorithm = Algo()
    store = StoreToken()
    algorithm.set_store(store)  # type: ignore[arg-type]
    assert await algorithm.work(7) == (store, None, 7, None)
    with pytest.raises(ValueError, match="needs an LLM proxy"):
        await algorithm.needs_proxy()

    stopped = ProxyStandIn(running=False)
    algorithm.set_llm_proxy(stopped)  # type: ignore[arg-type]
    assert await algorithm.work(value=1) == (store, stopped, 1, True)
    assert stopped.calls == ["start", "stop"] and not stopped.running
    assert await algorithm.no_start() is False and stopped.calls == ["start", "stop"]

    running = ProxyStandIn(running=True)
    algorithm.set_llm_proxy(running)  # type: ignore[arg-type]
    await algorithm.work(2)
    assert running.calls == [] and running.running  # not started by us, so not stopped by us


def test_batch_iter_over_dataset() -> None:
    random.seed(1234)
    dataset = list(range(10))
    whole = batch_iter_over_dataset(dataset, 15)
    for _ in range(3):
        batch = next(whole)
        assert sorted(batch) == dataset

    batches = batch_iter_over_dataset(dataset, 4)
    seen = set()
    for _ in range(30):
        batch = next(batches)
        assert len(batch) == 4 and len(set(batch)) == 4
        seen.update(batch)
    assert seen == set(dataset)

    with pytest.raises(ValueError, match="empty"):
        next(batch_iter_over_dataset([], 2))
    with pytest.raises(ValueError, match="batch_size"):
        next(batch_iter_over_dataset(dataset, 0))


def test_baseline_argument_validation() -> None:
    for split in (0.0, 1.0, -0.5, 2):
        with pytest.raises(ValueError, match="train_split"):
            Baseline(train_split=split)
    with pytest.raises(ValueError, match="span_verbosity"):
        Baseline(span_verbosity="all")  # type: ignore[arg-type]
    baseline = Baseline(n_epochs=2, polling_interval=0.5, max_queue_length=1, span_verbosity="none")
    assert (baseline.n_epochs, baseline.polling_interval, baseline.max_queue_length) == (2, 0.5, 1)
    assert baseline.is_async()


@pytest.mark.parametrize(
    ("factory", "module"), [("APO", "agentbolt.algorithm.apo"), ("VERL", "agentbolt.algorithm.verl")]
)
def test_lazy_factories_name_the_missing_implementation(factory: str, module: str) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    with pytest.raises(ImportError, match=f"{factory} is not available"):
        getattr(agl, factory)()


@pytest.mark.parametrize("rank", [0, 1])
def test_one_process_algorithms_refuse_a_torchrun_launch_of_several_ranks(
    monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    """SFT and the prompt searches would run whole on every rank (N stores, N trainings): each rank refuses at once."""
    from agentbolt.algorithm.apo import FewShotAPO
    from agentbolt.algorithm.sft import SFT

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    for algorithm in (SFT(), FewShotAPO()):
        trainer = agl.Trainer(algorithm=algorithm, n_runners=1)
        with pytest.raises(ValueError, match=f"trains in one process, but this is rank {rank} of 2 of a torchrun"):
            trainer.fit(agl.LitAgent(), train_dataset=[{"q": 1}])


def test_one_process_algorithms_run_without_torchrun_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbolt.algorithm.base import refuse_data_parallel_launch
    from agentbolt.algorithm.sft import SFT

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    refuse_data_parallel_launch(SFT())
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    refuse_data_parallel_launch(SFT())
