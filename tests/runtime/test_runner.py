"""LitAgentRunner on its own: step, iter, hooks, result post-processing, heartbeats."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from typing import Any, List

import pytest
from opentelemetry.sdk.trace import ReadableSpan

import agentbolt as agl
from agentbolt.emitter import find_final_reward
from agentbolt.execution import ThreadingEvent
from agentbolt.runner import LitAgentRunner
from agentbolt.runner import agent as agent_module
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import OtelTracer
from agentbolt.types import Span, SpanCoreFields, TraceStatus

PROMPT = {"prompt": agl.PromptTemplate(template="Say {word}", engine="f-string")}


class RecordingHook(agl.Hook):
    def __init__(self) -> None:
        super().__init__()
        self.calls: List[str] = []

    async def on_rollout_start(self, *, agent: Any, runner: Any, rollout: Any) -> None:
        self.calls.append("on_rollout_start")

    async def on_trace_start(self, *, agent: Any, runner: Any, tracer: Any, rollout: Any) -> None:
        self.calls.append("on_trace_start")

    async def on_trace_end(self, *, agent: Any, runner: Any, tracer: Any, rollout: Any) -> None:
        self.calls.append("on_trace_end")

    async def on_rollout_end(self, *, agent: Any, runner: Any, rollout: Any, spans: Any) -> None:
        self.calls.append(f"on_rollout_end:{len(spans)}")


class BrokenHook(agl.Hook):
    async def on_rollout_start(self, *, agent: Any, runner: Any, rollout: Any) -> None:
        raise RuntimeError("hook failure must not break the rollout")


async def _step(agent: Any, *, hooks: Any = None, input: Any = None, mode: Any = "train") -> Any:
    store = InMemoryLightningStore()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), heartbeat_interval=0)
    with runner.run_context(agent=agent, store=store, hooks=hooks):
        rollout = await runner.step(input or {"word": "hi"}, resources=PROMPT, mode=mode)
    spans = list(await store.query_spans(rollout.rollout_id))
    return store, rollout, spans


async def test_float_result_becomes_reward_span_and_hooks_run_in_order() -> None:
    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        with agl.operation(name="inner"):
            pass
        return 0.75

    hook = RecordingHook()
    _, rollout, spans = await _step(agent, hooks=[BrokenHook(), hook])
    assert rollout.status == "succeeded"
    assert find_final_reward(spans) == 0.75
    assert any(s.name == "agentlightning.operation" for s in spans)
    assert hook.calls[:3] == ["on_rollout_start", "on_trace_start", "on_trace_end"]
    assert hook.calls[3].startswith("on_rollout_end:")
    assert int(hook.calls[3].split(":")[1]) >= 1


async def test_bool_and_int_results_are_rewards() -> None:
    @agl.rollout
    def agent_bool(task: Any, prompt_template: agl.PromptTemplate) -> bool:
        return True

    @agl.rollout
    def agent_int(task: Any, prompt_template: agl.PromptTemplate) -> int:
        return 0

    _, _, spans = await _step(agent_bool)
    assert find_final_reward(spans) == 1.0
    _, _, spans = await _step(agent_int)
    assert find_final_reward(spans) == 0.0


async def test_none_result_keeps_traced_spans() -> None:
    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> None:
        agl.emit_reward(0.5)
        agl.emit_message("done")

    _, rollout, spans = await _step(agent, mode="val")
    assert rollout.status == "succeeded" and rollout.mode == "val"
    assert find_final_reward(spans) == 0.5
    assert [s.sequence_id for s in spans] == sorted(s.sequence_id for s in spans)


async def test_core_field_and_span_results_are_stored() -> None:
    core = SpanCoreFields(
        name="custom", status=TraceStatus(status_code="OK"), attributes={"k": 1}, start_time=1.0, end_time=2.0
    )

    @agl.rollout
    def core_agent(task: Any, prompt_template: agl.PromptTemplate) -> List[SpanCoreFields]:
        return [core, core]

    _, _, spans = await _step(core_agent)
    assert [s.name for s in spans].count("custom") == 2

    def span_agent_factory(store_holder: List[Any]) -> Any:
        @agl.rollout
        def span_agent(task: Any, prompt_template: agl.PromptTemplate, rollout: agl.AttemptedRollout) -> List[Span]:
            return [
                Span.from_attributes(
                    attributes={"x": 1},
                    rollout_id=rollout.rollout_id,
                    attempt_id=rollout.attempt.attempt_id,
                    sequence_id=100,
                    name="explicit",
                )
            ]

        return span_agent

    _, _, spans = await _step(span_agent_factory([]))
    assert [s.name for s in spans] == ["explicit"]


async def test_invalid_results_fail_the_attempt() -> None:
    @agl.rollout
    def bad_type(task: Any, prompt_template: agl.PromptTemplate) -> Any:
        return "not a reward"

    @agl.rollout
    def bad_list(task: Any, prompt_template: agl.PromptTemplate) -> Any:
        return [1, 2]

    for agent, error in ((bad_type, TypeError), (bad_list, ValueError)):
        with pytest.raises(error):
            await _step(agent)


class _AsyncRolloutUnderTheSyncName(agl.LitAgent[Any]):
    async def rollout(self, task: Any, resources: Any, rollout: Any) -> float:  # type: ignore[override]
        return 1.0


async def test_an_async_rollout_under_a_sync_name_fails_naming_the_async_methods() -> None:
    store = InMemoryLightningStore()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), heartbeat_interval=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the coroutine is closed, not left "never awaited"
        with runner.run_context(agent=_AsyncRolloutUnderTheSyncName(), store=store):
            with pytest.raises(TypeError, match="rollout_async"):
                await runner.step({"word": "hi"}, resources=PROMPT, mode="train")
            gc.collect()
    (rollout,) = await store.query_rollouts()
    assert rollout.status == "failed"
    exception_spans = [s for s in await store.query_spans(rollout.rollout_id) if s.name == "agentlightning.exception"]
    assert "rollout_async" in exception_spans[0].attributes["exception.message"]


async def test_readable_span_results_are_converted() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("external"):
        pass
    external: List[ReadableSpan] = list(exporter.get_finished_spans())

    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> List[ReadableSpan]:
        return external

    _, _, spans = await _step(agent)
    assert "external" in [s.name for s in spans]


async def test_missing_resources_leave_rollout_untouched() -> None:
    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        return 1.0

    store = InMemoryLightningStore()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), heartbeat_interval=0)
    with runner.run_context(agent=agent, store=store):
        attempted = await store.start_rollout(input={"word": "x"}, resources_id="rs-missing")
        with pytest.raises(RuntimeError, match="No resources"):
            await runner._step_impl(attempted, raise_on_exception=True)
        assert await runner._step_impl(attempted) == attempted.rollout_id
        attempt = await store.get_latest_attempt(attempted.rollout_id)
        assert attempt is not None and attempt.status == "preparing"


async def _serve_queue(agent: Any, inputs: List[Any], worker_id: int = 0, **options: Any) -> InMemoryLightningStore:
    """Enqueue ``inputs`` (with :data:`PROMPT`) and let one runner serve them all; the store afterwards."""
    store = InMemoryLightningStore()
    resources_id = (await store.add_resources(PROMPT)).resources_id
    for task in inputs:
        await store.enqueue_rollout(input=task, mode="train", resources_id=resources_id)
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), max_rollouts=len(inputs), poll_interval=0.05, **options)
    runner.init(agent=agent)
    runner.init_worker(worker_id, store)
    try:
        await asyncio.wait_for(runner.iter(event=ThreadingEvent()), timeout=30)
    finally:
        runner.teardown_worker(worker_id)
        runner.teardown()
    return store


async def test_iter_serves_queue_until_max_rollouts_with_heartbeats() -> None:
    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        return float(task["i"])

    inputs = [{"i": i} for i in range(3)]
    store = await _serve_queue(agent, inputs, worker_id=3, heartbeat_interval=0.05, heartbeat_launch_mode="asyncio")
    rollouts = await store.query_rollouts()
    assert [r.status for r in rollouts] == ["succeeded"] * 3
    worker = await store.get_worker_by_id("Worker-3")
    assert worker is not None and worker.heartbeat_stats is not None and "cpu_usage_pct" in worker.heartbeat_stats


@pytest.mark.parametrize("heartbeat_interval", [0, 0.05])
async def test_a_cancelled_error_of_the_agents_own_fails_its_attempt_and_the_runner_goes_on(
    heartbeat_interval: float,
) -> None:
    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        if task["i"] == 1:  # a task of the agent's own is cancelled, and the agent awaits it
            inner = asyncio.ensure_future(asyncio.sleep(10))
            asyncio.get_running_loop().call_later(0.01, inner.cancel)
            await inner
        return 1.0

    store = await _serve_queue(agent, [{"i": i} for i in range(3)], heartbeat_interval=heartbeat_interval)
    assert [r.status for r in await store.query_rollouts()] == ["succeeded", "failed", "succeeded"]


async def test_a_runner_cancelled_while_its_agent_runs_stops() -> None:
    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        await asyncio.sleep(30)
        return 1.0

    store = InMemoryLightningStore()
    resources_id = (await store.add_resources(PROMPT)).resources_id
    for i in range(2):
        await store.enqueue_rollout(input={"i": i}, mode="train", resources_id=resources_id)
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), poll_interval=0.05, heartbeat_interval=0)
    runner.init(agent=agent)
    runner.init_worker(0, store)
    try:
        task = asyncio.create_task(runner.iter(event=ThreadingEvent()))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)
    finally:
        runner.teardown_worker(0)
        runner.teardown()
    assert sorted(r.status for r in await store.query_rollouts()) == ["failed", "queuing"]


async def test_an_idle_runner_starts_a_rollout_queued_while_it_waits_before_its_poll_interval() -> None:
    """With nothing queued, the runner waits on the store's queue rather than sleeping out its poll interval."""

    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        return 1.0

    store = InMemoryLightningStore()
    store._wait_poll_interval = 600.0  # only the enqueue's notification can wake the runner in time
    resources_id = (await store.add_resources(PROMPT)).resources_id
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), max_rollouts=1, poll_interval=300, heartbeat_interval=0)
    runner.init(agent=agent)
    runner.init_worker(0, store)
    try:
        task = asyncio.create_task(runner.iter(event=ThreadingEvent()))
        await asyncio.sleep(0.5)  # the runner found the queue empty and waits
        assert not task.done()
        rollout = await store.enqueue_rollout(input={"i": 1}, mode="train", resources_id=resources_id)
        await asyncio.wait_for(task, timeout=30)  # its poll interval is 300 s
    finally:
        runner.teardown_worker(0)
        runner.teardown()
    finished = await store.get_rollout_by_id(rollout.rollout_id)
    assert finished is not None and finished.status == "succeeded"


async def test_iter_returns_when_event_is_set() -> None:
    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        return 1.0

    store = InMemoryLightningStore()
    event = ThreadingEvent()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), poll_interval=0.05, heartbeat_interval=0.05)
    runner.init(agent=agent)
    runner.init_worker(0, store)
    try:
        task = asyncio.create_task(runner.iter(event=event))
        await asyncio.sleep(0.3)
        event.set()
        await asyncio.wait_for(task, timeout=5)
    finally:
        runner.teardown_worker(0)
        runner.teardown()


def test_runner_accessors_and_errors() -> None:
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer())
    assert runner.get_worker_id() == "Worker-Unknown"
    with pytest.raises(ValueError):
        runner.get_agent()
    with pytest.raises(ValueError):
        runner.get_store()
    with pytest.raises(RuntimeError):
        runner.run()
    with pytest.raises(ValueError, match="heartbeat_launch_mode"):
        LitAgentRunner(OtelTracer(), heartbeat_launch_mode="bogus")  # type: ignore[arg-type]


def test_poll_jitter_is_capped_at_half_the_interval() -> None:
    # A short poll interval keeps its order of magnitude: idle runners must not poll at the 10 ms floor.
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), poll_interval=0.05, interval_jitter=0.5)
    samples = [runner._jittered(0.05) for _ in range(500)]
    assert all(0.025 <= value <= 0.075 for value in samples)
    assert max(runner._jittered(10.0) for _ in range(500)) > 10.0


async def test_a_heartbeat_on_its_way_when_the_worker_stops_reports_for_no_other_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thread heartbeats: one still taking its snapshot when the worker is torn down is not sent afterwards (it used
    to be sent for ``Worker-Unknown``, a worker that does not exist)."""
    snapshot_taken, release = threading.Event(), threading.Event()

    def slow_snapshot(include_gpu: bool) -> dict[str, float]:
        snapshot_taken.set()
        release.wait(5)
        return {"cpu_usage_pct": 1.0}

    monkeypatch.setattr(agent_module, "system_snapshot", slow_snapshot)
    store = InMemoryLightningStore()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), heartbeat_interval=0.5, heartbeat_launch_mode="thread")
    runner.init_worker(0, store)
    stop = runner._start_heartbeat_loop(store)
    assert stop is not None
    await asyncio.to_thread(snapshot_taken.wait, 5)
    await stop()
    runner.teardown_worker(0)
    release.set()
    await asyncio.sleep(0.3)  # time for a heartbeat that was not stopped to reach the store
    assert [worker.worker_id for worker in await store.query_workers()] == []
