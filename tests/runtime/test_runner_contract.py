"""LitAgentRunner against the contract (§9): what a rollout may return, failed fetches, teardown errors."""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentbolt as agl
from agentbolt.emitter import find_final_reward
from agentbolt.runner import LitAgentRunner
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import OtelTracer
from agentbolt.types import Rollout, Span, SpanCoreFields, TraceStatus

PROMPT = {"prompt": agl.PromptTemplate(template="Say {word}", engine="f-string")}
RUNNER_LOGGER = "agentbolt.runner"


def _agent_returning(value: Any) -> agl.LitAgent[Any]:
    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate, rollout: agl.AttemptedRollout) -> Any:
        with agl.operation(name="traced-work"):
            pass
        return value(rollout) if callable(value) else value

    return agent


async def _run(agent: agl.LitAgent[Any], store: Optional[InMemoryLightningStore] = None) -> tuple[Rollout, List[Span]]:
    store = store or InMemoryLightningStore()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), heartbeat_interval=0)
    with runner.run_context(agent=agent, store=store):
        rollout = await runner.step({"word": "hi"}, resources=PROMPT, mode="train")
    return rollout, list(await store.query_spans(rollout.rollout_id))


def _names(spans: List[Span]) -> List[str]:
    return [span.name for span in spans]


def _warnings(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(RUNNER_LOGGER) and r.levelno == logging.WARNING]


@pytest.mark.parametrize(("value", "expected", "warns"), [(0.25, 0.25, False), (True, 1.0, True), (3, 3.0, True)])
async def test_numeric_result_is_stored_as_a_reward_span(
    value: Any, expected: float, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    rollout, spans = await _run(_agent_returning(value))
    assert rollout.status == "succeeded"
    assert find_final_reward(spans) == expected
    assert "agentlightning.operation" in _names(spans)  # the traced spans are kept next to the reward
    assert bool(_warnings(caplog)) is warns


async def test_none_result_keeps_only_the_traced_spans(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rollout, spans = await _run(_agent_returning(None))
    assert rollout.status == "succeeded"
    assert _names(spans) == ["agentlightning.operation"]
    assert find_final_reward(spans) is None
    assert _warnings(caplog) == []


async def test_span_list_result_is_stored_as_given() -> None:
    def spans_of(rollout: agl.AttemptedRollout) -> List[Span]:
        return [
            Span.from_attributes(
                attributes={"k": 1},
                rollout_id=rollout.rollout_id,
                attempt_id=rollout.attempt.attempt_id,
                sequence_id=50,
                name="returned",
            )
        ]

    rollout, spans = await _run(_agent_returning(spans_of))
    assert rollout.status == "succeeded"
    assert "returned" in _names(spans)


async def test_core_fields_list_result_gets_store_issued_sequence_ids() -> None:
    core = SpanCoreFields(name="core", status=TraceStatus(status_code="OK"), attributes={}, start_time=1, end_time=2)
    rollout, spans = await _run(_agent_returning([core, core]))
    assert rollout.status == "succeeded"
    stored = [span for span in spans if span.name == "core"]
    assert len(stored) == 2 and len({span.sequence_id for span in stored}) == 2


async def test_readable_span_list_result_is_converted_with_a_warning_under_an_otel_tracer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("external").start_as_current_span("external-span"):
        pass
    external: List[ReadableSpan] = list(exporter.get_finished_spans())
    caplog.set_level(logging.WARNING)
    rollout, spans = await _run(_agent_returning(external))
    assert rollout.status == "succeeded"
    assert "external-span" in _names(spans)
    assert _warnings(caplog), "returning OpenTelemetry spans under an OtelTracer must warn"


async def test_empty_list_result_warns_and_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rollout, _ = await _run(_agent_returning([]))
    assert rollout.status == "succeeded"
    assert _warnings(caplog)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("0.5", TypeError),
        ({"reward": 1.0}, TypeError),
        ((0.5,), TypeError),
        (b"1", TypeError),
        ([1.0, 2.0], ValueError),
        (["a span?"], ValueError),
    ],
)
async def test_any_other_result_fails_the_attempt_and_raises_from_step(value: Any, error: type) -> None:
    store = InMemoryLightningStore()
    with pytest.raises(error):
        await _run(_agent_returning(value), store)
    (rollout,) = await store.query_rollouts()
    assert rollout.status == "failed"


async def test_mixed_span_kinds_in_one_list_are_rejected() -> None:
    core = SpanCoreFields(name="core", status=TraceStatus(status_code="OK"), attributes={}, start_time=1, end_time=2)

    def mixed(rollout: agl.AttemptedRollout) -> List[Any]:
        span = Span.from_attributes(
            attributes={}, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, sequence_id=9
        )
        return [span, core]

    with pytest.raises(ValueError):
        await _run(_agent_returning(mixed))


class _ForgetfulStore(InMemoryLightningStore):
    """A store that loses every rollout after it was run (as after a restart without persistence)."""

    async def get_rollout_by_id(self, rollout_id: str) -> Any:
        return None


async def test_step_raises_when_the_finished_rollout_cannot_be_fetched() -> None:
    with pytest.raises(RuntimeError, match="ro-"):
        await _run(_agent_returning(1.0), _ForgetfulStore())


class _FailingTeardownRunner(LitAgentRunner[Any]):
    def teardown(self, *args: Any, **kwargs: Any) -> None:
        super().teardown(*args, **kwargs)
        raise RuntimeError("teardown exploded")

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        super().teardown_worker(worker_id, *args, **kwargs)
        raise RuntimeError("teardown_worker exploded")


def _logged_errors(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [
        f"{r.getMessage()} | {r.exc_info[1] if r.exc_info else ''}"
        for r in caplog.records
        if r.levelno >= logging.ERROR
    ]


def test_run_context_logs_teardown_errors_of_runner_and_worker(caplog: pytest.LogCaptureFixture) -> None:
    runner = _FailingTeardownRunner(OtelTracer(), heartbeat_interval=0)
    with runner.run_context(agent=_agent_returning(1.0), store=InMemoryLightningStore()) as entered:
        assert entered is runner
    errors = _logged_errors(caplog)
    assert any("teardown_worker exploded" in e for e in errors), errors
    assert any("teardown exploded" in e and "teardown_worker" not in e for e in errors), errors


def test_trainer_runner_bundle_logs_teardown_errors_of_runner_and_worker(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import warnings

    store = InMemoryLightningStore()

    async def feed() -> None:
        resources_id = (await store.add_resources(PROMPT)).resources_id
        await store.enqueue_rollout(input={"word": "x"}, resources_id=resources_id)

    asyncio.run(feed())
    runner = _FailingTeardownRunner(OtelTracer(), max_rollouts=1, poll_interval=0.05, heartbeat_interval=0)
    trainer = agl.Trainer(strategy={"type": "shm", "graceful_delay": 0.1}, store=store, runner=runner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_agent_returning(1.0))
    errors = _logged_errors(caplog)
    assert any("teardown_worker exploded" in e for e in errors), errors
    assert any("teardown exploded" in e and "teardown_worker" not in e for e in errors), errors


async def test_sleep_until_next_poll_sleeps_the_interval_or_until_the_event_is_set() -> None:
    """``_sleep_until_next_poll(event=None)`` (contract §9): sleeps about ``poll_interval``, returning early when the
    event is set; it never waits on a store (that is what an empty dequeue leads to)."""
    import asyncio
    import time

    from agentbolt.execution import ThreadingEvent

    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), poll_interval=0.3, interval_jitter=0.0)
    started = time.monotonic()
    await asyncio.wait_for(runner._sleep_until_next_poll(), timeout=10)
    assert time.monotonic() - started >= 0.25
    stopped = ThreadingEvent()
    stopped.set()
    patient: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), poll_interval=300)
    await asyncio.wait_for(patient._sleep_until_next_poll(stopped), timeout=10)
