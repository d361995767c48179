"""LightningSpanProcessor: store-issued sequence ids, and no span lost while the store is unreachable."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import AsyncIterator, List, Optional, Sequence
from unittest.mock import patch

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from support.servers import free_port

from agentbolt.emitter import emit_message
from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import OtelTracer
from agentbolt.tracer import otel as otel_module
from agentbolt.tracer.otel import LightningSpanProcessor
from agentbolt.types import Span


async def start_server(store: InMemoryLightningStore, port: int) -> LightningStoreServer:
    server = LightningStoreServer(store, host="127.0.0.1", port=port)
    await server.start()
    return server


@pytest.fixture
async def inner() -> AsyncIterator[InMemoryLightningStore]:
    yield InMemoryLightningStore(thread_safe=True)


async def stored_names(store: InMemoryLightningStore, rollout_id: str) -> List[str]:
    spans = await store.query_spans(rollout_id, sort_by="sequence_id")
    return [span.name for span in spans]


async def test_store_outage_delays_but_loses_no_span(inner: InMemoryLightningStore) -> None:
    port = free_port()
    server = await start_server(inner, port)
    # Fail fast instead of the client's own retries, so the processor's buffering is what is exercised.
    client = LightningStoreClient(server.endpoint, retry_delays=(), health_retry_delays=())
    rollout = await client.start_rollout(input={"task": "outage"})
    tracer = OtelTracer(write_timeout=2.0)
    tracer.init_worker(0, client)
    processor = tracer._lightning_span_processor
    assert processor is not None
    try:
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            emit_message("before")
            await server.stop()
            for i in range(5):
                emit_message(f"during-{i}")
            assert processor.pending_count >= 5
            server = await start_server(inner, port)
            emit_message("after")
        assert processor.force_flush(30_000)
        assert processor.pending_count == 0 and processor.given_up_count == 0
        spans = await inner.query_spans(rollout.rollout_id, sort_by="sequence_id")
        bodies = [span.attributes["agentlightning.message.body"] for span in spans]
        assert bodies == ["before", *(f"during-{i}" for i in range(5)), "after"]
        sequence_ids = [span.sequence_id for span in spans]
        assert sequence_ids == sorted(set(sequence_ids))
    finally:
        await client.close()
        await server.stop()


async def test_full_buffer_gives_up_new_spans_with_a_warning(
    inner: InMemoryLightningStore, caplog: pytest.LogCaptureFixture
) -> None:
    rollout = await inner.start_rollout(input={"task": "overflow"})
    port = free_port()
    # Nothing listens on the port yet: every write fails until the server starts.
    client = LightningStoreClient(f"http://127.0.0.1:{port}", retry_delays=(), health_retry_delays=())
    tracer = OtelTracer(max_buffered_spans=2, write_timeout=1.0)
    tracer.init_worker(0, client)
    processor = tracer._lightning_span_processor
    assert processor is not None
    server: Optional[LightningStoreServer] = None
    try:
        with (
            caplog.at_level(logging.WARNING, logger="agentbolt.tracer.otel"),
            processor.with_context(client, rollout.rollout_id, rollout.attempt.attempt_id),
        ):
            tracer_otel = tracer.get_otel_tracer()
            for i in range(5):
                tracer_otel.start_span(f"span-{i}").end()
            assert processor.given_up_count == 3
            # The writer thread must have tried (and failed) while nothing listened; on a busy machine it may not
            # have run yet, and a store that comes up first would take the spans without any failure to log.
            deadline = time.monotonic() + 60.0
            while "Cannot write spans to the store" not in caplog.text and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            server = await start_server(inner, port)
        assert "giving up span 'span-2'" in caplog.text  # the first drop is logged, the others counted
        assert "3 span(s) were dropped while it was full" in caplog.text
        assert "Cannot write spans to the store" in caplog.text
        assert processor.force_flush(30_000)
        assert await stored_names(inner, rollout.rollout_id) == ["span-0", "span-1"]
        # The buffered spans were still collected locally for get_last_trace().
        assert [span.name for span in processor.spans()] == [f"span-{i}" for i in range(5)]
    finally:
        await client.close()
        if server is not None:
            await server.stop()


class RejectingStore(InMemoryLightningStore):
    """A real in-memory store that refuses spans named ``bad`` (as a store rejects invalid input)."""

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: Optional[int] = None
    ) -> Optional[Span]:
        if readable_span.name == "bad":
            raise ValueError("span rejected")
        return await super().add_otel_span(rollout_id, attempt_id, readable_span, sequence_id)

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        if any(span.name == "bad" for span in spans):
            raise ValueError("span rejected")
        return await super().add_many_spans(spans)

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        if any(span.name == "bad" for span in spans):
            raise ValueError("span rejected")
        return await super().add_spans_with_new_sequence_ids(spans)


async def test_rejected_span_is_given_up_and_later_spans_are_written(caplog: pytest.LogCaptureFixture) -> None:
    store = RejectingStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "reject"})
    tracer = OtelTracer()
    tracer.init_worker(0, store)
    with caplog.at_level(logging.WARNING, logger="agentbolt.tracer.otel"):
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id) as otel:
            for name in ("good-1", "bad", "good-2"):
                otel.start_span(name).end()
    assert await stored_names(store, rollout.rollout_id) == ["good-1", "good-2"]
    assert "rejected span 'bad'" in caplog.text
    assert [span.name for span in tracer.get_last_trace()] == ["good-1", "bad", "good-2"]


async def test_sequence_ids_are_issued_by_the_store(inner: InMemoryLightningStore) -> None:
    rollout = await inner.start_rollout(input={"task": "seq"})
    # Another writer takes sequence ids of the same rollout in between.
    await inner.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id)
    tracer = OtelTracer()
    tracer.init_worker(0, inner)
    async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id) as otel:
        otel.start_span("a").end()
        otel.start_span("b").end()
    # Leaving the context waited for the writes: the collected spans are the stored ones.
    spans = tracer.get_last_trace()
    assert [(span.name, span.sequence_id) for span in spans] == [("a", 2), ("b", 3)]
    assert [span.sequence_id for span in await inner.query_spans(rollout.rollout_id)] == [2, 3]


def test_local_collection_without_store() -> None:
    tracer = OtelTracer()
    tracer.init_worker(0)
    otel = tracer.get_otel_tracer()
    otel.start_span("outside").end()  # no context open: not collected
    with tracer._trace_context_sync() as inside, inside.start_as_current_span("parent"):
        inside.start_span("child").end()
    spans = tracer.get_last_trace()
    assert [span.name for span in spans] == ["child", "parent"]
    assert [span.sequence_id for span in spans] == [0, 1]
    assert {span.rollout_id for span in spans} == {"rollout-dummy"}
    assert spans[0].parent_id == spans[1].span_id


def test_processor_flush_and_submission_flag() -> None:
    processor = LightningSpanProcessor(disable_store_submission=True)
    assert processor.disable_store_submission
    processor.disable_store_submission = False
    assert processor.force_flush(10)
    with pytest.raises(ValueError, match="max_buffered_spans"):
        LightningSpanProcessor(max_buffered_spans=0)
    processor.shutdown()


def test_trace_context_argument_errors() -> None:
    tracer = OtelTracer()
    with pytest.raises(RuntimeError, match="init_worker"):
        tracer.get_last_trace()
    tracer.init_worker(0)
    with pytest.raises(ValueError, match="all provided or all None"), tracer._trace_context_sync(rollout_id="r"):
        pass
    with (
        pytest.raises(ValueError, match="store is required"),
        tracer._trace_context_sync(rollout_id="r", attempt_id="a"),
    ):
        pass


async def test_deprecated_store_argument_warns(inner: InMemoryLightningStore) -> None:
    rollout = await inner.start_rollout(input={})
    tracer = OtelTracer()
    tracer.init_worker(0)
    with pytest.warns(DeprecationWarning, match="init_worker"):
        async with tracer.trace_context(
            store=inner, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
        ) as otel:
            otel.start_span("x").end()
    assert await stored_names(inner, rollout.rollout_id) == ["x"]


async def test_non_thread_safe_store_is_flagged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(otel_module, "_warned_store_types", set())  # the warning is logged once per store type
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={})
    tracer = OtelTracer()
    tracer.init_worker(0, store)
    with caplog.at_level(logging.WARNING, logger="agentbolt.tracer.otel"):
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id) as otel:
            otel.start_span("x").end()
    assert "InMemoryLightningStore is not thread-safe" in caplog.text
    assert await stored_names(store, rollout.rollout_id) == ["x"]


async def test_shutdown_reports_spans_that_never_reached_the_store(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing ever listens on this port: the store stays unreachable.
    client = LightningStoreClient(f"http://127.0.0.1:{free_port()}", retry_delays=(), health_retry_delays=())
    processor = LightningSpanProcessor(write_timeout=0.3)
    tracer = OtelTracer()
    tracer.init_worker(0)
    try:
        with caplog.at_level(logging.WARNING, logger="agentbolt.tracer.otel"):
            with processor.with_context(client, "ro-x", "at-x"):
                span = tracer.get_otel_tracer().start_span("orphan")
                span.end()
                processor.on_end(span)  # type: ignore[arg-type]
            assert processor.pending_count == 1
            assert "ended with 1 span(s) not yet in the store" in caplog.text
            processor.shutdown()
        assert "Shutting down with 1 span(s) never written to the store" in caplog.text
        assert processor.given_up_count == 1
        assert [s.name for s in processor.spans()] == ["orphan"]
    finally:
        await client.close()


async def test_burst_of_spans_is_stored_in_order(inner: InMemoryLightningStore) -> None:
    rollout = await inner.start_rollout(input={"task": "burst"})
    tracer = OtelTracer()
    tracer.init_worker(0, inner)
    async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id) as otel:
        for i in range(300):
            otel.start_span(f"s{i}").end()
    spans = await inner.query_spans(rollout.rollout_id, sort_by="sequence_id")
    assert [span.name for span in spans] == [f"s{i}" for i in range(300)]
    assert [span.sequence_id for span in spans] == list(range(1, 301))
    assert [span.sequence_id for span in tracer.get_last_trace()] == list(range(1, 301))


class CountingStore(InMemoryLightningStore):
    """A real in-memory store that counts the span writes it receives."""

    def __init__(self) -> None:
        super().__init__(thread_safe=True)
        self.writes: List[int] = []

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: Optional[int] = None
    ) -> Optional[Span]:
        self.writes.append(1)
        return await super().add_otel_span(rollout_id, attempt_id, readable_span, sequence_id)

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        self.writes.append(len(spans))
        return await super().add_many_spans(spans)

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        self.writes.append(len(spans))
        return await super().add_spans_with_new_sequence_ids(spans)


async def test_spans_of_a_short_context_are_written_in_one_batch() -> None:
    store = CountingStore()
    rollout = await store.start_rollout(input={"task": "batch"})
    tracer = OtelTracer()
    tracer.init_worker(0, store)
    async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id) as otel:
        for i in range(3):
            otel.start_span(f"s{i}").end()
    assert store.writes == [3]
    spans = await store.query_spans(rollout.rollout_id, sort_by="sequence_id")
    assert [(span.name, span.sequence_id) for span in spans] == [("s0", 1), ("s1", 2), ("s2", 3)]


async def test_span_is_written_after_the_write_delay_without_a_flush() -> None:
    store = CountingStore()
    rollout = await store.start_rollout(input={"task": "delay"})
    processor = LightningSpanProcessor(write_delay=0.05)
    tracer = OtelTracer()
    tracer.init_worker(0)
    try:
        with processor.with_context(store, rollout.rollout_id, rollout.attempt.attempt_id):
            span = tracer.get_otel_tracer().start_span("live")
            span.end()
            processor.on_end(span)  # type: ignore[arg-type]
            # No flush: the writer sends the span once the delay is over, while the context is still open.
            for _ in range(1000):
                if processor.pending_count == 0:
                    break
                await asyncio.sleep(0.01)
            assert [s.name for s in await store.query_spans(rollout.rollout_id)] == ["live"]
    finally:
        processor.shutdown()


def test_negative_write_delay_is_rejected() -> None:
    with pytest.raises(ValueError, match="write_delay"):
        LightningSpanProcessor(write_delay=-1)


async def _gateway_call(store: InMemoryLightningStore, rollout_id: str, attempt_id: str, turn: int) -> None:
    """A call recorded the gateway's way: its sequence id is taken when the request arrives."""
    sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
    now = time.time()
    attributes = {"prompt_token_ids": [turn], "response_token_ids": [100 + turn], "gen_ai.response.id": f"r{turn}"}
    span = Span.from_attributes(
        attributes=attributes,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        name="agentbolt.llm_call",
        start_time=now,
        end_time=now,
    )
    await store.add_span(span)


async def test_a_reward_sorts_between_the_gateway_calls_around_it(inner: InMemoryLightningStore) -> None:
    """Per-turn rewards go to their own turn: a reward is stored (its id issued) before the agent goes on."""
    from agentbolt.adapter import LlmProxyTraceToTriplet
    from agentbolt.emitter import emit_reward

    rollout = await inner.start_rollout(input={})
    rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    tracer = OtelTracer()  # the default write delay batches spans for up to a second
    tracer.init_worker(0, inner)
    try:
        async with tracer.trace_context("turns", rollout_id=rollout_id, attempt_id=attempt_id):
            await _gateway_call(inner, rollout_id, attempt_id, 1)
            emit_reward(0.25)
            await _gateway_call(inner, rollout_id, attempt_id, 2)
            emit_reward(1.0)
        triplets = LlmProxyTraceToTriplet().adapt(await inner.query_spans(rollout_id))
    finally:
        tracer.teardown_worker(0)
    assert [(t.metadata["response_id"], t.reward) for t in triplets] == [("r1", 0.25), ("r2", 1.0)]


async def test_a_span_left_running_by_a_rollout_stays_with_that_rollout(inner: InMemoryLightningStore) -> None:
    """Work a rollout did not await, ending during the next rollout, is stored under the rollout that started it."""
    first = await inner.start_rollout(input={"n": 1})
    second = await inner.start_rollout(input={"n": 2})
    tracer = OtelTracer()
    tracer.init_worker(0, inner)
    try:
        async with tracer.trace_context(
            "first", rollout_id=first.rollout_id, attempt_id=first.attempt.attempt_id
        ) as otel_tracer:
            release = asyncio.Event()

            async def left_running() -> None:
                with otel_tracer.start_as_current_span("late"):
                    await release.wait()

            task = asyncio.create_task(left_running())
            await asyncio.sleep(0)
        async with tracer.trace_context("second", rollout_id=second.rollout_id, attempt_id=second.attempt.attempt_id):
            release.set()
            await task
            with otel_tracer.start_as_current_span("own"):
                pass
            local = [span.name for span in tracer.get_last_trace()]
    finally:
        tracer.teardown_worker(0)
    assert "late" in await stored_names(inner, first.rollout_id)
    assert "late" not in await stored_names(inner, second.rollout_id)
    assert "own" in local and "late" not in local


async def test_a_span_ending_while_the_last_worker_tears_down_is_stored(
    inner: InMemoryLightningStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span that ends while ``shutdown`` stops the writers (a thread the agent left running) goes to a new writer.

    It used to join a writer made on the loop being stopped, and was neither stored nor counted as given up.
    """
    started = await inner.start_rollout(input={})
    tracer = OtelTracer()
    tracer.init_worker(0, inner)
    processor = tracer._lightning_span_processor
    assert processor is not None
    async with tracer.trace_context("r", rollout_id=started.rollout_id, attempt_id=started.attempt.attempt_id):
        tracer.get_otel_tracer().start_span("inside").end()
        late = tracer.get_otel_tracer().start_span("late")  # started in the rollout, ends during the shutdown
    stop_threadsafe = otel_module.SpanWriter.stop_threadsafe

    def end_late_span_then_stop(writer: otel_module.SpanWriter, timeout: float) -> int:
        late.end()
        return stop_threadsafe(writer, timeout)

    monkeypatch.setattr(otel_module.SpanWriter, "stop_threadsafe", end_late_span_then_stop)
    tracer.teardown_worker(0)
    monkeypatch.undo()
    try:
        assert processor.force_flush(10_000)
        assert await stored_names(inner, started.rollout_id) == ["inside", "late"]
    finally:
        processor.shutdown()


async def test_leaving_a_context_reports_only_its_own_unwritten_spans(
    inner: InMemoryLightningStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Another rollout's spans still on their way do not make a context that wrote all of its own warn."""
    mine, other = await inner.start_rollout(input={}), await inner.start_rollout(input={})
    tracer = OtelTracer()
    tracer.init_worker(0, inner)
    processor = tracer._lightning_span_processor
    assert processor is not None
    release = threading.Event()
    original_add_many_spans = inner.add_many_spans

    async def add_many_spans(spans: Sequence[Span]) -> Sequence[Span]:
        if any(span.rollout_id == other.rollout_id for span in spans):
            await asyncio.to_thread(release.wait, 10)  # the other rollout's spans are slow to reach the store
        return await original_add_many_spans(spans)

    try:
        with patch.object(inner, "add_many_spans", add_many_spans):
            with processor.with_context(inner, other.rollout_id, other.attempt.attempt_id, flush_timeout=0):
                tracer.get_otel_tracer().start_span("other's").end()
            with (
                caplog.at_level(logging.WARNING, logger=otel_module.__name__),
                processor.with_context(inner, mine.rollout_id, mine.attempt.attempt_id, flush_timeout=5),
            ):
                tracer.get_otel_tracer().start_span("mine").end()
            release.set()
            assert processor.force_flush(10_000)
    finally:
        release.set()
        tracer.teardown_worker(0)
    assert [r.getMessage() for r in caplog.records if "not yet in the store" in r.getMessage()] == []
    assert len(await inner.query_spans(mine.rollout_id)) == 1 and len(await inner.query_spans(other.rollout_id)) == 1
