"""SpanWriter against a real in-memory store: ids issued up front or at write time, rejected spans, flushes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List, Optional, Sequence

import pytest

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.span_writer import PendingSpan, SpanWriter, is_permanent_store_error
from agentbolt.types import Span
from agentbolt.types.tracer import OtelResource, TraceStatus
from agentbolt.types.wire import encode_json


class Item(PendingSpan):
    """A span named ``name``; with ``sequence_id`` it carries an id issued up front."""

    def __init__(self, rollout_id: str, attempt_id: str, name: str, sequence_id: Optional[int] = None) -> None:
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.name = name
        self.sequence_id = sequence_id
        self.builds = 0
        self.stored: List[Optional[Span]] = []

    async def issued_sequence_id(self) -> Optional[int]:
        return self.sequence_id

    def to_span(self, sequence_id: int) -> Span:
        self.builds += 1
        now = time.time()
        return Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            sequence_id=sequence_id,
            trace_id="0" * 32,
            span_id=f"{self.name:0>16}"[-16:],
            parent_id=None,
            name=self.name,
            status=TraceStatus(status_code="OK"),
            attributes={},
            events=[],
            links=[],
            start_time=now,
            end_time=now,
            context=None,
            parent=None,
            resource=OtelResource(attributes={}, schema_url=""),
        )

    def completed(self, stored: Optional[Span]) -> None:
        self.stored.append(stored)


async def test_ids_issued_up_front_are_kept_and_the_others_issued_in_order() -> None:
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={})
    ids = await store.get_many_span_sequence_ids([(rollout.rollout_id, rollout.attempt.attempt_id)] * 2)
    writer = SpanWriter(store)
    items = [
        Item(rollout.rollout_id, rollout.attempt.attempt_id, "a", ids[0]),
        Item(rollout.rollout_id, rollout.attempt.attempt_id, "b", ids[1]),
        Item(rollout.rollout_id, rollout.attempt.attempt_id, "c"),
        Item(rollout.rollout_id, rollout.attempt.attempt_id, "d"),
    ]
    for item in items:
        assert writer.submit(item)  # before start: kept until the writer runs
    writer.start()
    assert await writer.flush(10.0)
    spans = await store.query_spans(rollout.rollout_id, sort_by="sequence_id")
    assert [(span.name, span.sequence_id) for span in spans] == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert [item.stored[0].sequence_id for item in items if item.stored[0] is not None] == [1, 2, 3, 4]
    assert writer.stats() == {"queued": 0, "written": 4, "dropped": 0, "failed": 0, "repaired": 0, "lost": 0}
    await writer.close()


async def test_a_rejected_span_is_given_up_alone(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={})
    writer = SpanWriter(store)
    writer.start()
    good = [Item(rollout.rollout_id, rollout.attempt.attempt_id, f"g{i}") for i in range(3)]
    ghost = Item("ro-ghost", "at-ghost", "ghost")  # the store refuses spans of unknown rollouts
    for item in (good[0], ghost, *good[1:]):
        writer.submit(item)
    assert await writer.flush(10.0)
    spans = await store.query_spans(rollout.rollout_id, sort_by="sequence_id")
    assert [span.name for span in spans] == ["g0", "g1", "g2"]
    assert ghost.stored == [None] and writer.failed == 1 and writer.written == 3
    assert "The store rejected span of rollout ro-ghost" in caplog.text
    assert all(item.builds == 1 for item in (*good, ghost))  # built once, however often the batch was sent
    await writer.close()


class BuiltWhere(Item):
    """An item recording the thread that builds its span; ``broken`` ones fail to build."""

    def __init__(self, rollout_id: str, attempt_id: str, name: str, broken: bool = False) -> None:
        super().__init__(rollout_id, attempt_id, name)
        self.broken = broken
        self.thread: Optional[int] = None

    def to_span(self, sequence_id: int) -> Span:
        self.thread = threading.get_ident()
        if self.broken:
            raise ValueError("cannot build this one")
        return super().to_span(sequence_id)


async def test_spans_are_built_off_the_event_loop_and_a_broken_one_is_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={})
    writer = SpanWriter(store)
    writer.start()
    items = [BuiltWhere(rollout.rollout_id, rollout.attempt.attempt_id, name, broken=name == "b") for name in "abc"]
    for item in items:
        writer.submit(item)
    assert await writer.flush(10.0)
    spans = await store.query_spans(rollout.rollout_id, sort_by="sequence_id")
    assert [span.name for span in spans] == ["a", "c"]
    assert items[1].stored == [None] and writer.failed == 1
    assert "Could not build span of rollout" in caplog.text
    # Building the span of a huge call takes seconds: never on the loop the writer shares with the calls.
    assert all(item.thread not in (None, threading.get_ident()) for item in items)
    await writer.close()


async def test_flush_from_another_thread_and_close_without_a_store_counts_lost() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={})
    writer = SpanWriter(store, write_delay=30.0)  # only a flush writes before the delay
    writer.start()
    item = Item(rollout.rollout_id, rollout.attempt.attempt_id, "x")
    threading.Thread(target=writer.submit, args=(item,)).start()
    while writer.queued == 0:
        await asyncio.sleep(0.01)
    assert await asyncio.to_thread(writer.flush_threadsafe, 10.0)
    assert [span.name for span in await store.query_spans(rollout.rollout_id)] == ["x"]
    assert await writer.close() == 0


async def test_buffer_full_drops_and_close_reports_what_was_lost() -> None:
    store = InMemoryLightningStore()
    writer = SpanWriter(store, max_buffered=2)  # never started: nothing is written
    items = [Item("r", "a", str(i)) for i in range(3)]
    assert [writer.submit(item) for item in items] == [True, True, False]
    assert items[2].stored == [None]
    assert await writer.close(0.1) == 2  # nothing wrote them within the timeout
    assert writer.stats() == {"queued": 0, "written": 0, "dropped": 1, "failed": 0, "repaired": 0, "lost": 2}


def test_permanent_errors() -> None:
    assert is_permanent_store_error(ValueError("bad span"))
    assert not is_permanent_store_error(ConnectionRefusedError())
    assert not is_permanent_store_error(asyncio.TimeoutError())

    class HTTPError(Exception):
        def __init__(self, status: int) -> None:
            self.status = status

    assert is_permanent_store_error(HTTPError(422)) and not is_permanent_store_error(HTTPError(503))
    assert not is_permanent_store_error(HTTPError(429))


class TextItem(Item):
    """A span carrying ``text`` in two attributes."""

    def __init__(self, rollout_id: str, attempt_id: str, name: str, text: str) -> None:
        super().__init__(rollout_id, attempt_id, name)
        self.text = text

    def to_span(self, sequence_id: int) -> Span:
        span = super().to_span(sequence_id)
        return span.model_copy(update={"attributes": {"tool.output": self.text, "tool.args": [self.text, "b"]}})


class JsonCheckingStore(InMemoryLightningStore):
    """A store of the kind users write: it encodes spans as JSON before keeping them, so it refuses strings JSON
    cannot carry (the stores of this package repair them themselves)."""

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        for span in spans:
            encode_json(span)
        return await super().add_many_spans(spans)

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        for span in spans:
            encode_json(span)
        return await super().add_spans_with_new_sequence_ids(spans)


async def test_a_span_with_lone_surrogates_is_repaired_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    store = JsonCheckingStore()
    rollout = await store.start_rollout(input={})
    writer = SpanWriter(store)
    writer.start()
    # What bytes decoded with errors="surrogateescape" give, and an emoji split into its two surrogates.
    plain = Item(rollout.rollout_id, rollout.attempt.attempt_id, "plain")
    broken_text = TextItem(rollout.rollout_id, rollout.attempt.attempt_id, "tool", "ok \udcff then \ud83d\ude00")
    fine = TextItem(rollout.rollout_id, rollout.attempt.attempt_id, "fine", "caf\u00e9")
    for item in (plain, broken_text, fine):
        writer.submit(item)
    try:
        assert await writer.flush(10.0)
        spans = {span.name: span for span in await store.query_spans(rollout.rollout_id)}
        assert set(spans) == {"plain", "tool", "fine"}
        repaired = "ok \ufffd then \U0001f600"
        assert spans["tool"].attributes == {"tool.output": repaired, "tool.args": [repaired, "b"]}
        assert spans["fine"].attributes["tool.output"] == "caf\u00e9"
        assert writer.stats()["repaired"] == 1 and writer.failed == 0 and writer.written == 3
        assert "writing it again with U+FFFD" in caplog.text
    finally:
        await writer.close()


class GoneStore(InMemoryLightningStore):
    """A store that cannot be reached: every write fails as a connection does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        self.calls += 1
        raise ConnectionError("connection refused")


async def test_stop_retrying_gives_up_the_spans_a_gone_store_cannot_take_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = GoneStore()
    writer = SpanWriter(store, retry_initial_delay=60.0)  # a retry would come long after the test ended
    items = [Item("ro-1", "at-1", name) for name in "abc"]
    writer.start()
    for item in items:
        writer.submit(item)
    while not writer.unreachable:  # the first write failed: the writer now waits to retry
        await asyncio.sleep(0.01)
    calls = store.calls
    with caplog.at_level("WARNING", logger="agentbolt.store.span_writer"):
        writer.stop_retrying()
        assert await writer.flush(30.0)  # returns once the spans are given up, without waiting for the retry
    assert store.calls == calls  # not tried again
    assert writer.stats()["lost"] == 3 and writer.queued == 0
    assert all(item.stored == [None] for item in items)
    given_up = [record.getMessage() for record in caplog.records if "Giving up" in record.getMessage()]
    assert len(given_up) == 1 and "3 span(s)" in given_up[0], given_up
    # Spans handed over afterwards are tried once, and given up the same way when the store still cannot take them.
    writer.submit(Item("ro-1", "at-1", "d"))
    assert await writer.flush(30.0)
    assert store.calls == calls + 1 and writer.stats()["lost"] == 4
    assert await writer.close() == 0


async def test_stop_retrying_still_writes_to_a_store_that_answers() -> None:
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={})
    writer = SpanWriter(store)
    writer.start()
    writer.stop_retrying()
    writer.submit(Item(rollout.rollout_id, rollout.attempt.attempt_id, "a"))
    assert await writer.flush(30.0)
    assert writer.stats()["written"] == 1 and writer.stats()["lost"] == 0
    await writer.close()
