"""Trace contexts open at once in several threads or asyncio tasks of one process, sharing one tracer."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional

import pytest

from agentbolt.emitter import emit_message, emit_reward, get_message_value, get_reward_value
from agentbolt.instrumentation.openai import is_openai_instrumented
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer, OtelTracer, Tracer, get_active_tracer
from agentbolt.types import AttemptedRollout, Span


@pytest.fixture
def store() -> InMemoryLightningStore:
    return InMemoryLightningStore(thread_safe=True)


@pytest.fixture(params=[OtelTracer, AgentOpsTracer], ids=["otel", "agentops"])
def tracer(request: pytest.FixtureRequest, store: InMemoryLightningStore) -> Iterator[OtelTracer]:
    tracer: OtelTracer = request.param()
    with tracer.lifespan(store):
        yield tracer


def run_in_threads(count: int, body: Callable[[int], Any]) -> None:
    """Run ``asyncio.run(body(i))`` in ``count`` threads at once; re-raise the first failure."""
    errors: List[BaseException] = []

    def run(index: int) -> None:
        try:
            asyncio.run(body(index))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"runner-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    if errors:
        raise errors[0]


async def start_rollouts(store: InMemoryLightningStore, count: int) -> List[AttemptedRollout]:
    return [await store.start_rollout(input={"n": i}) for i in range(count)]


def rewards(spans: List[Span]) -> List[Optional[float]]:
    return [get_reward_value(span) for span in spans if get_reward_value(span) is not None]


def messages(spans: List[Span]) -> List[Optional[str]]:
    return [get_message_value(span) for span in spans if span.name == "agentlightning.message"]


def test_threads_sharing_a_tracer_each_record_their_own_rollout(
    tracer: OtelTracer, store: InMemoryLightningStore
) -> None:
    count = 4
    rollouts = asyncio.run(start_rollouts(store, count))
    everyone_inside = threading.Barrier(count, timeout=30)
    traces: Dict[int, List[Span]] = {}
    bindings: Dict[int, Optional[str]] = {}
    processor = tracer._lightning_span_processor
    assert processor is not None

    async def body(i: int) -> None:
        rollout = rollouts[i]
        async with tracer.trace_context(
            rollout.rollout_id, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
        ) as otel:
            await asyncio.to_thread(everyone_inside.wait)  # every context is open from here on
            assert get_active_tracer() is tracer
            bindings[i] = processor.rollout_id
            with otel.start_as_current_span(f"work-{i}"):
                emit_reward(float(i))
                await asyncio.sleep(0.05)
            # asyncio.to_thread runs in a copy of the context: its spans are the rollout's too.
            await asyncio.to_thread(emit_message, f"from-thread-{i}")
            await asyncio.to_thread(everyone_inside.wait)
        traces[i] = tracer.get_last_trace()

    run_in_threads(count, body)

    for i, rollout in enumerate(rollouts):
        assert bindings[i] == rollout.rollout_id
        stored = list(asyncio.run(store.query_spans(rollout.rollout_id)))
        assert rewards(stored) == [float(i)]
        assert messages(stored) == [f"from-thread-{i}"]
        assert [span.name for span in stored if span.name.startswith("work-")] == [f"work-{i}"]
        assert {span.rollout_id for span in stored} == {rollout.rollout_id}
        # get_last_trace() in each thread is the trace of the context that thread just left.
        assert sorted(span.span_id for span in traces[i]) == sorted(span.span_id for span in stored)


async def test_asyncio_tasks_each_record_their_own_rollout(tracer: OtelTracer, store: InMemoryLightningStore) -> None:
    rollouts = await start_rollouts(store, 3)
    everyone_inside = asyncio.Barrier(len(rollouts))

    async def one(i: int) -> List[Span]:
        rollout = rollouts[i]
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            await everyone_inside.wait()

            async def child() -> None:  # a task inherits the context it was created in
                emit_message(f"child-{i}")

            await asyncio.create_task(child())
            emit_reward(float(i))
            await everyone_inside.wait()
        return tracer.get_last_trace()

    traces = await asyncio.gather(*(one(i) for i in range(len(rollouts))))

    for i, rollout in enumerate(rollouts):
        stored = list(await store.query_spans(rollout.rollout_id))
        assert rewards(stored) == [float(i)] and messages(stored) == [f"child-{i}"]
        assert sorted(span.span_id for span in traces[i]) == sorted(span.span_id for span in stored)


@pytest.mark.parametrize("tracer_class", [OtelTracer, AgentOpsTracer], ids=["otel", "agentops"])
async def test_trace_contexts_still_do_not_nest_in_one_context(tracer_class: Callable[[], OtelTracer]) -> None:
    with tracer_class().lifespan() as tracer, OtelTracer().lifespan() as other:
        async with tracer.trace_context("outer"):
            for nested in (tracer, other):
                with pytest.raises(ValueError, match="already set"):
                    async with nested.trace_context("inner"):
                        pass

            async def child() -> None:  # a task created inside the context inherits it, and cannot nest either
                async with tracer.trace_context("inner"):
                    pass

            with pytest.raises(ValueError, match="already set"):
                await asyncio.create_task(child())
            assert get_active_tracer() is tracer
        assert get_active_tracer() is None


def test_a_plain_thread_finds_the_only_open_context(tracer: OtelTracer, store: InMemoryLightningStore) -> None:
    """A thread started without the context (no copy) falls back to the process: one open context is found."""
    (rollout,) = asyncio.run(start_rollouts(store, 1))
    found: List[Optional[Tracer]] = []

    def plain_thread() -> None:
        found.append(get_active_tracer())
        emit_message("from a plain thread")

    async def body() -> None:
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            thread = threading.Thread(target=plain_thread)
            thread.start()
            await asyncio.to_thread(thread.join, 30)

    asyncio.run(body())
    assert found == [tracer]
    assert messages(list(asyncio.run(store.query_spans(rollout.rollout_id)))) == ["from a plain thread"]


def test_a_plain_thread_cannot_tell_several_open_contexts_apart(
    tracer: OtelTracer, store: InMemoryLightningStore
) -> None:
    """With several contexts open, a plain thread finds none; one started in a copy of the context finds its own."""
    rollouts = asyncio.run(start_rollouts(store, 2))
    everyone_inside = threading.Barrier(2, timeout=30)
    outcomes: Dict[int, List[Any]] = {}

    def plain_thread(i: int) -> None:
        outcomes[i].append(get_active_tracer())
        try:
            emit_message(f"plain-{i}")
        except RuntimeError as exc:
            outcomes[i].append(str(exc))

    async def body(i: int) -> None:
        outcomes[i] = []
        rollout = rollouts[i]
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            await asyncio.to_thread(everyone_inside.wait)
            plain = threading.Thread(target=plain_thread, args=(i,))
            copied = threading.Thread(target=contextvars.copy_context().run, args=(emit_message, f"copied-{i}"))
            for thread in (plain, copied):
                thread.start()
                await asyncio.to_thread(thread.join, 30)
            await asyncio.to_thread(everyone_inside.wait)

    run_in_threads(2, body)

    for i, rollout in enumerate(rollouts):
        found, error = outcomes[i]
        assert found is None
        assert "No active tracer found" in error and "copy_context" in error
        assert messages(list(asyncio.run(store.query_spans(rollout.rollout_id)))) == [f"copied-{i}"]


def test_a_span_goes_to_the_context_it_started_in_when_another_thread_ends_it(store: InMemoryLightningStore) -> None:
    tracer = OtelTracer()
    rollouts = asyncio.run(start_rollouts(store, 2))
    started = threading.Event()
    ended = threading.Event()
    handed_over: List[Any] = []
    traces: Dict[int, List[Span]] = {}

    async def body(i: int) -> None:
        rollout = rollouts[i]
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id) as otel:
            if i == 0:
                handed_over.append(otel.start_span("started-by-0"))
                started.set()
                await asyncio.to_thread(ended.wait, 30)
            else:
                await asyncio.to_thread(started.wait, 30)
                handed_over[0].end()  # ends while this thread's context is open
                otel.start_span("own-1").end()
                ended.set()
        traces[i] = tracer.get_last_trace()

    with tracer.lifespan(store):
        run_in_threads(2, body)

    first, second = (asyncio.run(store.query_spans(rollout.rollout_id)) for rollout in rollouts)
    assert [span.name for span in first] == ["started-by-0"]
    assert [span.name for span in second] == ["own-1"]
    assert [span.name for span in traces[0]] == ["started-by-0"]
    assert [span.name for span in traces[1]] == ["own-1"]


class OneTraceAtATimeTracer(Tracer):
    """A tracer keeping one trace's state for the whole process (as WeaveTracer does)."""

    @asynccontextmanager
    async def _trace(self, name: Any, store: Any, rollout_id: Any, attempt_id: Any) -> AsyncIterator[None]:
        yield None


def test_a_tracer_recording_one_trace_at_a_time_refuses_a_second_thread() -> None:
    tracer = OneTraceAtATimeTracer()
    assert not tracer.supports_concurrent_contexts and OtelTracer.supports_concurrent_contexts
    inside = threading.Event()
    leave = threading.Event()

    async def hold() -> None:
        async with tracer.trace_context("first"):
            inside.set()
            await asyncio.to_thread(leave.wait, 30)

    holder = threading.Thread(target=asyncio.run, args=(hold(),))
    holder.start()
    try:
        assert inside.wait(30)

        async def second() -> None:
            async with tracer.trace_context("second"):
                pass

        with pytest.raises(ValueError, match="one trace context at a time"):
            asyncio.run(second())
    finally:
        leave.set()
        holder.join(30)
    asyncio.run(second())  # once the first context closed, another may open
    assert get_active_tracer() is None


def test_agentops_tracer_keeps_the_instrumentation_while_one_of_its_workers_runs() -> None:
    tracer = AgentOpsTracer()
    tracer.init_worker(0)
    tracer.init_worker(1)  # a second runner thread of the same process
    try:
        tracer.teardown_worker(0)
        assert is_openai_instrumented()
    finally:
        tracer.teardown_worker(1)
    assert not is_openai_instrumented()


def writer_threads() -> List[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "otel-loop"]


@pytest.mark.parametrize("tracer_class", [OtelTracer, AgentOpsTracer], ids=["otel", "agentops"])
def test_the_writer_thread_stops_with_the_last_worker_and_starts_again_for_the_next_run(
    tracer_class: Callable[[], OtelTracer], store: InMemoryLightningStore
) -> None:
    threads_before = set(writer_threads())
    tracer = tracer_class()
    rollouts = asyncio.run(start_rollouts(store, 3))

    async def record(index: int) -> None:
        rollout = rollouts[index]
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            emit_reward(float(index))

    def stored_rewards(index: int) -> List[Optional[float]]:
        return rewards(list(asyncio.run(store.query_spans(rollouts[index].rollout_id))))

    tracer.init()
    tracer.init_worker(0, store)
    tracer.init_worker(1, store)  # a second runner thread of the same process
    asyncio.run(record(0))
    tracer.teardown_worker(0)
    assert set(writer_threads()) - threads_before, "the writer stopped while another worker runs"
    asyncio.run(record(1))
    tracer.teardown_worker(1)
    assert not set(writer_threads()) - threads_before
    assert stored_rewards(0) == [0.0] and stored_rewards(1) == [1.0]
    assert rewards(tracer.get_last_trace()) == [1.0]  # what the last context collected stays readable

    tracer.init_worker(0, store)  # the next run of the same tracer in this process
    asyncio.run(record(2))
    assert stored_rewards(2) == [2.0]
    tracer.teardown_worker(0)
    tracer.teardown()
    assert not set(writer_threads()) - threads_before
