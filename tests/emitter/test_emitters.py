"""Emitters: spans recorded through a real OtelTracer (local collection) and through propagate=False."""

from __future__ import annotations

import asyncio
import enum
import json
import math
import warnings
from typing import Any, Iterator, List

import pytest

from agentbolt import semconv
from agentbolt.emitter import (
    emit_annotation,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    find_final_reward,
    find_reward_spans,
    get_message_value,
    get_object_value,
    get_reward_value,
    get_rewards_from_span,
    is_reward_span,
    operation,
    reward,
)
from agentbolt.emitter.annotation import OperationContext
from agentbolt.tracer import OtelTracer, get_active_tracer
from agentbolt.types import Span


@pytest.fixture
def tracer() -> Iterator[OtelTracer]:
    created = OtelTracer()
    created.init_worker(0)
    with created._trace_context_sync():
        yield created


def spans_of(tracer: OtelTracer) -> List[Span]:
    return tracer.get_last_trace()


def test_no_active_tracer_is_a_clear_error() -> None:
    assert get_active_tracer() is None
    for emit in (
        lambda: emit_reward(1.0),
        lambda: emit_message("x"),
        lambda: emit_object(1),
        lambda: emit_exception(ValueError("x")),
        lambda: emit_annotation({"a": 1}),
    ):
        with pytest.raises(RuntimeError, match="No active tracer found"):
            emit()
    with pytest.raises(RuntimeError, match="No active tracer found"), operation(name="x"):
        pass


def test_propagate_false_builds_core_fields_only() -> None:
    core = emit_reward(0.25, propagate=False)
    assert core.name == "agentlightning.annotation"
    assert core.attributes == {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.25}
    assert core.start_time == core.end_time
    assert emit_object({"k": [1, 2]}, propagate=False).attributes["agentlightning.object.json"] == '{"k": [1, 2]}'
    with operation(propagate=False, name="offline") as op:
        op.set_output(3)
    assert op.span().attributes["agentlightning.operation.output"] == 3


def test_reward_spans(tracer: OtelTracer) -> None:
    emit_reward(1)
    emit_reward({"accuracy": 0.5, "length": True}, primary_key="accuracy", attributes={"note": "ok"})
    spans = spans_of(tracer)
    assert [get_reward_value(span) for span in spans] == [1.0, 0.5]
    assert [r.name for r in get_rewards_from_span(spans[1])] == ["accuracy", "length"]
    assert get_rewards_from_span(spans[1])[1].value == 1.0
    assert spans[1].attributes["note"] == "ok"
    assert all(is_reward_span(span) for span in spans)
    assert find_reward_spans(spans) == spans
    assert find_final_reward(spans) == 0.5


def test_a_reward_that_is_not_finite_is_no_training_reward(
    tracer: OtelTracer, caplog: pytest.LogCaptureFixture
) -> None:
    from agentbolt.utils.reward_spans import training_reward

    emit_reward(0.25)
    emit_reward(float("nan"))
    assert "Reward primary is nan: it is recorded, and training reads it as no reward" in caplog.text
    spans = spans_of(tracer)
    assert math.isnan(find_final_reward(spans))  # the contract's reading keeps the value
    assert training_reward(spans, "ro-1") is None
    assert "ro-1 reported the reward nan" in caplog.text
    assert training_reward(spans[:1], "ro-2") == 0.25


def test_a_legacy_reward_operation_is_the_training_reward_the_adapters_give_the_calls(tracer: OtelTracer) -> None:
    from agentbolt.adapter import TracerTraceToTriplet
    from agentbolt.utils.reward_spans import training_reward

    with operation(name="agentlightning.reward") as legacy:  # how rewards were once recorded by hand
        legacy.set_output(0.5)
    spans = spans_of(tracer)
    assert find_final_reward(spans) is None  # the contract's reading does not know this form
    assert training_reward(spans, "ro-1") == 0.5  # the algorithms' does, as the adapters do
    assert TracerTraceToTriplet().tree_type.from_spans(spans).is_reward_span()


def test_a_secondary_dimension_that_is_not_finite_keeps_the_training_reward(
    tracer: OtelTracer, caplog: pytest.LogCaptureFixture
) -> None:
    from agentbolt.utils.reward_spans import training_reward

    emit_reward({"accuracy": 0.75, "length": float("inf")}, primary_key="accuracy")
    assert "Reward dimension 'length' is inf: it is recorded" in caplog.text
    assert "training reads it as no reward" not in caplog.text
    assert training_reward(spans_of(tracer), "ro-1") == 0.75


def test_numpy_scalar_rewards_are_numbers(tracer: OtelTracer) -> None:
    np = pytest.importorskip("numpy")
    emit_reward(np.int64(3))
    emit_reward(np.float32(0.5))
    emit_reward(np.bool_(True))
    emit_reward({"accuracy": np.float64(0.25), "solved": np.bool_(False)}, primary_key="accuracy")
    spans = spans_of(tracer)
    assert [get_reward_value(span) for span in spans] == [3.0, 0.5, 1.0, 0.25]
    assert [type(span.attributes["agentlightning.reward.0.value"]) for span in spans] == [float] * 4
    assert get_rewards_from_span(spans[3])[1].value == 0.0
    with pytest.raises(TypeError):
        emit_reward(np.array([1.0, 2.0]))  # not a scalar


@pytest.mark.parametrize(
    ("value", "kwargs", "error"),
    [
        ("high", {}, TypeError),
        (None, {}, TypeError),
        ({"a": 1.0}, {}, ValueError),
        ({"a": 1.0}, {"primary_key": "b"}, ValueError),
        ({"a": "x"}, {"primary_key": "a"}, ValueError),
        ({1: 1.0}, {"primary_key": 1}, ValueError),  # later reads of the span would fail on the name
        (0.0, {"attributes": {"agentlightning.reward.0.value": 9.0}}, ValueError),  # would replace the reward
        (1.0, {"attributes": {"agentlightning.reward": 5}}, ValueError),
        pytest.param(10**400, {}, TypeError, id="int-too-large-for-a-float"),
        pytest.param({"a": 10**400}, {"primary_key": "a"}, ValueError, id="dimension-too-large-for-a-float"),
    ],
)
def test_bad_rewards_are_rejected(tracer: OtelTracer, value: Any, kwargs: Any, error: type) -> None:
    with pytest.raises(error):
        emit_reward(value, **kwargs)
    assert spans_of(tracer) == []


def test_legacy_reward_formats() -> None:
    agentops = Span.from_attributes(attributes={"agentops.task.output": json.dumps({"type": "reward", "value": 0.7})})
    v02 = Span.from_attributes(attributes={"reward": 0.3}, name="agentlightning.annotation")
    plain = Span.from_attributes(attributes={"reward": 0.3}, name="other")
    assert get_reward_value(agentops) == 0.7
    assert get_reward_value(v02) == 0.3
    assert get_reward_value(plain) is None
    assert find_final_reward([agentops, plain]) == 0.7
    assert find_final_reward([plain]) is None


def test_deprecated_reward_decorator_and_module(tracer: OtelTracer) -> None:
    with pytest.warns(DeprecationWarning):

        @reward
        def score() -> float:
            return 0.9

        @reward
        async def ascore() -> float:
            return 0.1

    assert score() == 0.9
    assert asyncio.run(ascore()) == 0.1
    assert [get_reward_value(span) for span in spans_of(tracer)] == [0.9, 0.1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import importlib

        import agentbolt.reward as legacy

        importlib.reload(legacy)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert legacy.emit_reward is emit_reward


def test_annotation_message_exception(tracer: OtelTracer) -> None:
    emit_annotation({"user": {"id": 7, "tags": ["a", "b"]}})
    emit_message("hello", attributes={"level": {"n": 1}})
    try:
        raise KeyError("missing")
    except KeyError as exc:
        emit_exception(exc, attributes={"where": "lookup"})
    annotation, message, exception = spans_of(tracer)
    assert annotation.name == semconv.AGL_ANNOTATION
    assert annotation.attributes["user.id"] == 7
    assert list(annotation.attributes["user.tags"]) == ["a", "b"]
    assert message.name == semconv.AGL_MESSAGE and get_message_value(message) == "hello"
    assert message.attributes["level.n"] == 1
    assert exception.name == semconv.AGL_EXCEPTION and exception.status.status_code == "OK"
    assert exception.attributes["exception.type"] == "KeyError"
    assert "raise KeyError" in str(exception.attributes["exception.stacktrace"])
    assert exception.attributes["where"] == "lookup"


def test_emitter_input_errors(tracer: OtelTracer) -> None:
    with pytest.raises(ValueError):
        emit_annotation({"a": None})
    with pytest.raises(TypeError):
        emit_message(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        emit_exception("boom")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="Cannot record object"):
        emit_object(object())
    assert spans_of(tracer) == []
    with pytest.raises(TypeError):
        get_message_value(Span.from_attributes(attributes={"agentlightning.message.body": 3}))


@pytest.mark.parametrize("value", ["text", 3, 2.5, True, False, b"\x00\xff", {"a": [1, None]}, [1, "x"]])
def test_object_round_trip(tracer: OtelTracer, value: Any) -> None:
    core = emit_object(value)
    (span,) = spans_of(tracer)
    assert span.attributes == core.attributes
    assert get_object_value(span) == value
    assert type(get_object_value(span)) is type(value)


class _Level(enum.IntEnum):
    HIGH = 2


class _Color(str, enum.Enum):
    RED = "red"


def test_objects_of_literal_subclasses_read_back_as_their_literal(tracer: OtelTracer) -> None:
    np = pytest.importorskip("numpy")
    emit_object(np.float64(0.5))
    emit_object(_Level.HIGH)
    emit_object(_Color.RED)
    spans = spans_of(tracer)
    assert [span.attributes["agentlightning.object.type"] for span in spans] == ["float", "int", "str"]
    values = [get_object_value(span) for span in spans]
    assert values == [0.5, 2, "red"]
    assert [type(value) for value in values] == [float, int, str]


def test_object_decoding_errors() -> None:
    assert get_object_value(Span.from_attributes(attributes={})) is None
    with pytest.raises(RuntimeError):
        get_object_value(Span.from_attributes(attributes={"agentlightning.object.json": "{"}))
    with pytest.raises(RuntimeError):
        get_object_value(
            Span.from_attributes(
                attributes={"agentlightning.object.type": "complex", "agentlightning.object.literal": "1j"}
            )
        )


def test_operation_context_manager(tracer: OtelTracer) -> None:
    with operation(name="lookup", source="db") as op:
        assert isinstance(op, OperationContext)
        with pytest.raises(RuntimeError, match="not ready"):
            op.span()
        op.set_input(1, 2, key={"x": 1})
        op.set_output({"rows": 2})
    (span,) = spans_of(tracer)
    assert span.name == semconv.AGL_OPERATION
    attrs = span.attributes
    assert attrs["agentlightning.operation.name"] == "lookup"
    assert attrs["source"] == "db"
    assert attrs["agentlightning.operation.input.args.0"] == 1
    assert attrs["agentlightning.operation.input.args.1"] == 2
    assert attrs["agentlightning.operation.input.key.x"] == 1
    assert attrs["agentlightning.operation.output.rows"] == 2
    assert op.span().attributes == attrs
    with pytest.raises(RuntimeError):
        op.set_output(1)


def test_operation_decorator_sync_async_and_errors(tracer: OtelTracer) -> None:
    @operation
    def add(a: int, b: int = 10, *rest: int, **options: Any) -> int:
        return a + b + sum(rest)

    @operation(name="fetch", kind="io")
    async def fetch(url: str) -> dict:
        return {"url": url}

    @operation
    def fail() -> None:
        raise ValueError("nope")

    assert add(1, 2, 3, flag=True) == 6
    assert asyncio.run(fetch("u")) == {"url": "u"}
    with pytest.raises(ValueError, match="nope"):
        fail()
    added, fetched, failed = spans_of(tracer)
    assert added.attributes["agentlightning.operation.name"] == "add"
    assert added.attributes["agentlightning.operation.input.a"] == 1
    assert added.attributes["agentlightning.operation.input.b"] == 2
    assert added.attributes["agentlightning.operation.input.rest.0"] == 3
    assert added.attributes["agentlightning.operation.input.options.flag"] is True
    assert added.attributes["agentlightning.operation.output"] == 6
    assert fetched.attributes["agentlightning.operation.name"] == "fetch"
    assert fetched.attributes["kind"] == "io"
    assert fetched.attributes["agentlightning.operation.output.url"] == "u"
    assert failed.status.status_code == "ERROR"
    assert failed.attributes["exception.type"] == "ValueError"


def test_operation_argument_errors() -> None:
    with pytest.raises(ValueError, match="callable"):
        operation(42)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="not both"):
        operation(name="a", **{"agentlightning.operation.name": "b"})


def test_operation_decorator_on_generators_spans_the_iteration(tracer: OtelTracer) -> None:
    @operation
    def count(n: int) -> Iterator[int]:
        for i in range(n):
            emit_annotation({"step": i})  # inside the body: a child of the operation
            yield i

    @operation
    def echo() -> Any:
        received = yield "ready"
        yield f"got {received}"

    @operation(name="stream")
    async def stream(n: int) -> Any:
        for i in range(n):
            yield i * 10

    assert list(count(2)) == [0, 1]
    conversation = echo()
    assert next(conversation) == "ready" and conversation.send("x") == "got x"
    conversation.close()

    async def consume() -> List[int]:
        return [item async for item in stream(3)]

    assert asyncio.run(consume()) == [0, 10, 20]
    spans = spans_of(tracer)
    operations = [span for span in spans if span.name == semconv.AGL_OPERATION]
    counted, echoed, streamed = operations
    assert counted.attributes["agentlightning.operation.input.n"] == 2
    assert counted.attributes["agentlightning.operation.output"] == [0, 1]
    steps = [span for span in spans if span.name != semconv.AGL_OPERATION]
    assert len(steps) == 2 and all(step.parent_id == counted.span_id for step in steps)
    assert counted.start_time is not None and counted.end_time is not None
    assert all(counted.start_time <= step.start_time <= counted.end_time for step in steps)  # type: ignore[operator]
    assert echoed.attributes["agentlightning.operation.output"] == ["ready", "got x"]
    assert streamed.attributes["agentlightning.operation.name"] == "stream"
    assert streamed.attributes["agentlightning.operation.output"] == [0, 10, 20]


def test_operation_decorator_on_a_generator_records_its_failure(tracer: OtelTracer) -> None:
    @operation
    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("mid-stream")

    with pytest.raises(ValueError, match="mid-stream"):
        list(broken())
    (span,) = spans_of(tracer)
    assert span.status.status_code == "ERROR" and span.attributes["exception.type"] == "ValueError"


def test_an_integer_too_long_for_text_is_the_contracts_runtime_error(tracer: OtelTracer) -> None:
    with pytest.raises(RuntimeError, match="Cannot record object of type int"):
        emit_object(10**5000)
    assert spans_of(tracer) == []
