"""Runner threads of the shared-memory strategy sharing one tracer: concurrent rollouts each keep their own trace."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

import pytest

import agentbolt as agl
from agentbolt.emitter import emit_reward, get_reward_value, operation
from agentbolt.semconv import LightningSpanAttributes
from agentbolt.store.sqlite import SqliteLightningStore

N_TASKS = 8
OVERLAP_TIMEOUT_SECONDS = 10.0
FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 0}


class InFlight:
    """Counts the rollouts running at once; a rollout waits (bounded) until another one runs beside it."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self.running = 0
        self.most = 0

    def enter(self) -> None:
        with self._condition:
            self.running += 1
            self.most = max(self.most, self.running)
            self._condition.notify_all()
            self._condition.wait_for(lambda: self.most >= 2, timeout=OVERLAP_TIMEOUT_SECONDS)

    def leave(self) -> None:
        with self._condition:
            self.running -= 1


def _work_name(task: int) -> str:
    return f"work-{task}"


class SyncAgent(agl.LitAgent[int]):
    """Opens an operation span, sleeps beside other rollouts and emits the task as its reward (in the runner's
    worker thread, as sync agents run)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = InFlight()

    def rollout(self, task: int, resources: agl.NamedResources, rollout: agl.Rollout) -> None:
        self.in_flight.enter()
        try:
            with operation(name=_work_name(task)):
                time.sleep(0.1)
            emit_reward(float(task))
        finally:
            self.in_flight.leave()


class AsyncAgent(agl.LitAgent[int]):
    """The same agent on the runner's event loop."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = InFlight()

    async def rollout_async(self, task: int, resources: agl.NamedResources, rollout: agl.Rollout) -> None:
        await asyncio.to_thread(self.in_flight.enter)
        try:
            with operation(name=_work_name(task)):
                await asyncio.sleep(0.1)
            emit_reward(float(task))
        finally:
            self.in_flight.leave()


class LastTraces(agl.Hook):
    """Keeps, per rollout, the runner thread that ran it and the spans the runner got from ``get_last_trace()``."""

    def __init__(self) -> None:
        super().__init__()
        self.by_rollout: Dict[str, Tuple[str, List[agl.Span]]] = {}

    async def on_rollout_end(
        self, *, agent: Any, runner: Any, rollout: agl.Rollout, spans: Union[List[Any], List[agl.Span]]
    ) -> None:
        self.by_rollout[rollout.rollout_id] = (threading.current_thread().name, list(spans))


def _work_names(spans: List[agl.Span]) -> List[str]:
    key = LightningSpanAttributes.OPERATION_NAME.value
    return [str(span.attributes[key]) for span in spans if span.name == "agentlightning.operation"]


def _rewards(spans: List[agl.Span]) -> List[float]:
    return [value for value in (get_reward_value(span) for span in spans) if value is not None]


@pytest.mark.parametrize(
    ("n_runners", "agent_class", "tracer_class", "store_kind"),
    [
        (2, SyncAgent, agl.OtelTracer, "memory"),
        (4, AsyncAgent, agl.AgentOpsTracer, "memory"),
        (3, SyncAgent, agl.OtelTracer, "sqlite"),
    ],
    ids=["2-sync-otel-memory", "4-async-agentops-memory", "3-sync-otel-sqlite"],
)
def test_runner_threads_sharing_a_tracer_keep_each_rollout_to_itself(
    tmp_path: Path, n_runners: int, agent_class: Any, tracer_class: Any, store_kind: str
) -> None:
    store: agl.LightningStore = (
        agl.InMemoryLightningStore(thread_safe=True)
        if store_kind == "memory"
        else SqliteLightningStore(str(tmp_path / "store.db"))
    )
    agent = agent_class()
    hook = LastTraces()
    trainer = agl.Trainer(
        algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
        tracer=tracer_class(),
        runner=FAST_RUNNER,
        hooks=[hook],
        n_runners=n_runners,
        strategy={"type": "shm", "main_thread": "algorithm"},
        store=store,
        initial_resources={"prompt": agl.PromptTemplate(template="x", engine="f-string")},
    )
    trainer.fit(agent, list(range(N_TASKS)))

    assert agent.in_flight.most >= 2, "the rollouts never overlapped"
    rollouts = asyncio.run(store.query_rollouts())
    assert len(rollouts) == N_TASKS
    assert {rollout.status for rollout in rollouts} == {"succeeded"}
    threads = set()
    for rollout in rollouts:
        task = rollout.input
        stored = list(asyncio.run(store.query_spans(rollout.rollout_id)))
        assert _rewards(stored) == [float(task)]
        assert _work_names(stored) == [_work_name(task)]
        assert {span.rollout_id for span in stored} == {rollout.rollout_id}
        # What get_last_trace() gave the runner right after the rollout's context: that rollout's spans.
        thread, last_trace = hook.by_rollout[rollout.rollout_id]
        threads.add(thread)
        assert sorted(span.span_id for span in last_trace) == sorted(span.span_id for span in stored)
        assert _rewards(last_trace) == [float(task)]
    assert len(threads) >= 2


def test_the_algorithms_own_spans_never_join_a_rollout_running_beside_it() -> None:
    """An algorithm's LLM calls (APO's optimizer, say) traced while one runner thread runs a rollout stay out of it."""
    from opentelemetry import trace

    started = threading.Event()
    release = threading.Event()

    class WaitingAgent(agl.LitAgent[int]):
        def rollout(self, task: int, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
            started.set()
            release.wait(OVERLAP_TIMEOUT_SECONDS)
            return 1.0

    class TracingAlgorithm(agl.Algorithm):
        async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
            store = self.get_store()
            await store.update_resources("default", {"p": agl.PromptTemplate(template="x", engine="f-string")})
            rollout = await store.enqueue_rollout(input=1)
            await asyncio.to_thread(started.wait, OVERLAP_TIMEOUT_SECONDS)
            with trace.get_tracer("algorithm").start_as_current_span("algorithm-call"):
                pass
            release.set()
            while (await store.get_rollout_by_id(rollout.rollout_id)).status != "succeeded":  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
            self.rollout_id = rollout.rollout_id

    store = agl.InMemoryLightningStore()
    algorithm = TracingAlgorithm()
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store,
        tracer=agl.OtelTracer(),
        runner=FAST_RUNNER,
        strategy={"type": "shm", "main_thread": "algorithm"},
    )
    trainer.fit(WaitingAgent())
    spans = asyncio.run(store.query_spans(algorithm.rollout_id))
    assert spans and "algorithm-call" not in [span.name for span in spans]
