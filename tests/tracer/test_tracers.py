"""Tracer base behaviour: active-tracer registry, lifespan, DummyTracer, OtelTracer spans, AgentOpsTracer rules."""

from __future__ import annotations

import time
from typing import Any, List

import pytest

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import (
    AgentOpsTracer,
    DummyTracer,
    OtelTracer,
    Tracer,
    clear_active_tracer,
    get_active_tracer,
    set_active_tracer,
)
from agentbolt.types import TraceStatus


def test_active_tracer_registry() -> None:
    first, second = DummyTracer(), DummyTracer()
    set_active_tracer(first)
    try:
        assert get_active_tracer() is first
        with pytest.raises(ValueError, match="already set"):
            set_active_tracer(second)
        assert get_active_tracer() is first
    finally:
        clear_active_tracer()
    assert get_active_tracer() is None


async def test_trace_context_sets_active_tracer_and_refuses_nesting() -> None:
    outer, inner = OtelTracer(), OtelTracer()
    outer.init_worker(0)
    inner.init_worker(0)
    async with outer.trace_context("a"):
        assert get_active_tracer() is outer
        with pytest.raises(ValueError, match="already set"):
            async with inner.trace_context("b"):
                pass
        assert get_active_tracer() is outer
    assert get_active_tracer() is None
    with pytest.raises(RuntimeError, match="boom"):
        async with outer.trace_context("c"):
            raise RuntimeError("boom")
    assert get_active_tracer() is None


class RecordingTracer(Tracer):
    """A tracer recording its lifecycle calls (and failing where told)."""

    def __init__(self, fail_in: str = "") -> None:
        super().__init__()
        self.calls: List[str] = []
        self.fail_in = fail_in

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in:
            raise RuntimeError(name)

    def init(self, *args: Any, **kwargs: Any) -> None:
        self._step("init")

    def init_worker(self, worker_id: int, store: Any = None) -> None:
        super().init_worker(worker_id, store)
        self._step("init_worker")

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        self._step("teardown_worker")

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self._step("teardown")


def test_lifespan_undoes_only_what_succeeded() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    ok = RecordingTracer()
    with ok.lifespan(store) as entered:
        assert entered is ok and ok._store is store and ok.worker_id == 0
    assert ok.calls == ["init", "init_worker", "teardown_worker", "teardown"]
    failing = RecordingTracer(fail_in="init_worker")
    with pytest.raises(RuntimeError), failing.lifespan():
        pass
    assert failing.calls == ["init", "init_worker", "teardown"]
    failing_teardown = RecordingTracer(fail_in="teardown_worker")
    with pytest.raises(RuntimeError, match="teardown_worker"), failing_teardown.lifespan():
        pass
    assert failing_teardown.calls == ["init", "init_worker", "teardown_worker", "teardown"]


def test_base_tracer_defaults(caplog: pytest.LogCaptureFixture) -> None:
    tracer = RecordingTracer()
    assert tracer.get_langchain_handler() is None
    assert "does not provide a LangChain" in caplog.text
    with pytest.raises(NotImplementedError):
        tracer.get_last_trace()


def test_dummy_tracer() -> None:
    tracer = DummyTracer()
    core = tracer.create_span("x", {"a": 1}, timestamp=5.0, status=TraceStatus(status_code="ERROR", description="d"))
    assert (core.start_time, core.end_time, core.status.status_code, core.attributes) == (5.0, 5.0, "ERROR", {"a": 1})
    with tracer.operation_context("op", {"k": "v"}, start_time=1.0, end_time=2.0) as recording:
        with pytest.raises(ValueError, match="not finished"):
            recording.get_recorded_span()
        recording.record_attributes({"n": 1})
    span = recording.get_recorded_span()
    assert (span.start_time, span.end_time, span.attributes) == (1.0, 2.0, {"k": "v", "n": 1})
    with pytest.raises(KeyError), tracer.operation_context("bad") as failed:
        raise KeyError("k")
    recorded = failed.get_recorded_span()
    assert recorded.status.status_code == "ERROR" and recorded.attributes["exception.type"] == "KeyError"
    with pytest.raises(NotImplementedError):
        tracer.get_last_trace()


def test_otel_create_span_and_operation_context() -> None:
    tracer = OtelTracer()
    with pytest.raises(RuntimeError, match="init_worker"):
        tracer.create_span("x")
    tracer.init_worker(0)
    with tracer._trace_context_sync():
        core = tracer.create_span("instant", {"a": 1}, timestamp=1_700_000_000.5)
        with tracer.operation_context("outer", {"o": True}) as outer:
            tracer.create_span("inside")
            outer.record_status("OK")
        with pytest.raises(ZeroDivisionError), tracer.operation_context("failing"):
            1 / 0  # noqa: B018
    assert core.start_time == core.end_time == 1_700_000_000.5
    spans = {span.name: span for span in tracer.get_last_trace()}
    assert spans["instant"].start_time == pytest.approx(1_700_000_000.5)
    assert spans["inside"].parent_id == spans["outer"].span_id
    assert spans["outer"].status.status_code == "OK" and spans["outer"].attributes["o"] is True
    assert spans["failing"].status.status_code == "ERROR"
    assert spans["failing"].attributes["exception.type"] == "ZeroDivisionError"
    assert outer.get_recorded_span().end_time is not None
    assert outer.get_recorded_span().end_time <= time.time()


def test_otel_exception_records_with_lone_surrogates_stay_writable() -> None:
    """A message with half a surrogate pair is recorded with U+FFFD: the OTLP encoder would drop the span."""
    tracer = OtelTracer()
    tracer.init_worker(0)
    with tracer._trace_context_sync():
        with tracer.operation_context("recorded") as recording:
            recording.record_exception(ValueError("bad \ud800 input"))
        with pytest.raises(ValueError), tracer.operation_context("raised"):
            raise ValueError("bad \udfff input")
    spans = {span.name: span for span in tracer.get_last_trace()}
    recorded, raised = spans["recorded"], spans["raised"]
    (event,) = recorded.events
    assert event.attributes["exception.message"] == "bad \ufffd input"
    assert "bad \ufffd input" in str(event.attributes["exception.stacktrace"])
    assert recorded.status.description == "bad \ufffd input"
    assert raised.attributes["exception.message"] == "bad \ufffd input"
    for span in (recorded, raised):
        span.model_dump_json()  # writable as JSON


async def test_agentops_tracer_requires_store_and_ids_together() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0, store)
    with pytest.raises(ValueError, match="all provided or all None"):
        async with tracer.trace_context("no-ids"):
            pass
    rollout = await store.start_rollout(input={})
    async with tracer.trace_context("named", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        pass
    (root,) = await store.query_spans(rollout.rollout_id)
    assert root.name == "named" and root.status.status_code == "OK"
    assert root.attributes["agentlightning.rollout_id"] == rollout.rollout_id
    storeless = AgentOpsTracer(instrument_managed=False)
    storeless.init_worker(0)
    with storeless._trace_context_sync("local"):
        pass
    assert [span.name for span in storeless.get_last_trace()] == ["local"]


async def test_agentops_root_span_records_failure() -> None:
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0)
    with pytest.raises(RuntimeError):
        async with tracer.trace_context("failing"):
            raise RuntimeError("agent crashed")
    (root,) = tracer.get_last_trace()
    assert root.status.status_code == "ERROR"
    assert any(event.name == "exception" for event in root.events)


def test_weave_tracer_import_error_names_the_package() -> None:
    with pytest.raises(ImportError, match="weave"):
        import agentbolt.tracer.weave  # noqa: F401
