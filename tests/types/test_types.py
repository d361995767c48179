"""Data model behaviour (contract §2)."""

from __future__ import annotations

import logging
import pickle

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import TypeAdapter, ValidationError

from agentbolt.store.base import UNSET, Unset
from agentbolt.types import (
    LLM,
    Attempt,
    AttemptedRollout,
    NamedResources,
    PaginatedResult,
    PromptTemplate,
    ProxyLLM,
    ResourcesUpdate,
    RolloutConfig,
    Span,
    SpanCoreFields,
    TraceStatus,
)
from agentbolt.types.tracer import convert_timestamp


def test_paginated_result_is_a_sequence_of_items() -> None:
    page = PaginatedResult[int](items=[1, 2, 3], limit=3, offset=0, total=10)
    assert len(page) == 3
    assert list(page) == [1, 2, 3]
    assert page[0] == 1 and page[-1] == 3 and page[1:] == [2, 3]
    assert 2 in page
    assert repr(page) == "<PaginatedResult (0:3 of 10) [1, ...]>"
    assert repr(PaginatedResult[int](items=[], limit=-1, offset=5, total=0)) == "<PaginatedResult (5: of 0) empty>"
    assert repr(PaginatedResult[int](items=[7], limit=-1, offset=0, total=1)) == "<PaginatedResult (0: of 1) [7]>"


def test_rollout_config_validates_max_attempts() -> None:
    assert RolloutConfig().max_attempts == 1
    with pytest.raises(ValidationError):
        RolloutConfig(max_attempts=0)
    with pytest.raises(ValidationError):
        RolloutConfig(retry_condition=["not-a-status"])  # type: ignore[list-item]


def test_attempted_rollout_rejects_mismatched_attempt() -> None:
    attempt = Attempt(rollout_id="ro-b", attempt_id="at-1", sequence_id=1, start_time=1.0)
    with pytest.raises(ValidationError, match="does not match"):
        AttemptedRollout(rollout_id="ro-a", input=1, start_time=1.0, attempt=attempt)


def test_proxy_llm_base_url(caplog: pytest.LogCaptureFixture) -> None:
    llm = ProxyLLM(endpoint="http://h:1/v1/", model="m")
    with caplog.at_level(logging.WARNING, logger="agentbolt.types.resources"):
        assert llm.get_base_url("R", "A") == "http://h:1/rollout/R/attempt/A/v1"
        assert llm.get_base_url(None, None) == "http://h:1/v1/"
        assert not caplog.records
        _ = llm.endpoint
        assert any("get_base_url" in r.getMessage() for r in caplog.records)
    assert ProxyLLM(endpoint="http://h:1", model="m").get_base_url("R", "A") == "http://h:1/rollout/R/attempt/A"
    with pytest.raises(ValueError):
        llm.get_base_url("R", None)


def test_proxy_llm_with_attempted_rollout() -> None:
    attempt = Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=1.0)
    rollout = AttemptedRollout(rollout_id="ro-1", input=None, start_time=1.0, attempt=attempt)
    llm = ProxyLLM(endpoint="http://h:1/v1", model="m", sampling_parameters={"temperature": 0.5}, api_key="k")
    bound = llm.with_attempted_rollout(rollout)
    assert type(bound) is LLM
    assert bound.endpoint == "http://h:1/rollout/ro-1/attempt/at-1/v1"
    assert bound.sampling_parameters == {"temperature": 0.5} and bound.api_key == "k"


def test_resources_are_discriminated() -> None:
    adapter = TypeAdapter(NamedResources)
    parsed = adapter.validate_python(
        {
            "a": {"resource_type": "llm", "endpoint": "e", "model": "m"},
            "b": {"resource_type": "proxy_llm", "endpoint": "e", "model": "m"},
            "c": {"resource_type": "prompt_template", "template": "Hi {name}", "engine": "f-string"},
        }
    )
    assert type(parsed["a"]) is LLM and type(parsed["b"]) is ProxyLLM and type(parsed["c"]) is PromptTemplate
    update = ResourcesUpdate(resources_id="rs-1", create_time=1, update_time=1, version=1, resources=parsed)
    assert ResourcesUpdate.model_validate_json(update.model_dump_json()) == update


def test_prompt_template_format() -> None:
    assert PromptTemplate(template="Hi {name}", engine="f-string").format(name="Ann") == "Hi Ann"
    assert PromptTemplate(template="Hi {{ name }}", engine="jinja").format(name="Ann") == "Hi Ann"


def test_prompt_template_examples_come_before_the_request_and_survive_serialization() -> None:
    examples = [
        {"role": "user", "content": "Hi Bo"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "e_1", "type": "function", "function": {}}]},
        {"role": "tool", "tool_call_id": "e_1", "content": "ok"},
        {"role": "assistant", "content": "Hello Bo"},
    ]
    template = PromptTemplate(template="Hi {name}", engine="f-string", examples=examples)
    messages = template.format_messages(name="Ann")
    assert messages == [*examples, {"role": "user", "content": "Hi Ann"}]
    messages[0]["content"] = "changed"  # the request is a copy: the template's examples stay as they were
    assert template.examples[0]["content"] == "Hi Bo"
    parsed = TypeAdapter(NamedResources).validate_json(TypeAdapter(NamedResources).dump_json({"p": template}))
    assert parsed["p"] == template
    plain = PromptTemplate(template="Hi {name}", engine="f-string")
    assert plain.examples == [] and plain.format_messages(name="Ann") == [{"role": "user", "content": "Hi Ann"}]


def test_prompt_template_examples_must_be_chat_messages() -> None:
    with pytest.raises(ValidationError, match=r"examples\[1\]\.role must be one of"):
        PromptTemplate(template="x", engine="f-string", examples=[{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(ValidationError, match="examples"):
        PromptTemplate(template="x", engine="f-string", examples=["not a message"])  # type: ignore[list-item]


def test_convert_timestamp() -> None:
    assert convert_timestamp(None) is None
    assert convert_timestamp(0) is None
    assert convert_timestamp(1_700_000_000_000_000_000) == pytest.approx(1_700_000_000.0)
    assert convert_timestamp(12) == 12


def test_span_from_opentelemetry_round_trip() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("parent"), tracer.start_as_current_span("child") as child:
        child.set_attribute("k", "v")
        child.add_event("e", {"x": 1})
    finished = {s.name: s for s in exporter.get_finished_spans()}
    span = Span.from_opentelemetry(finished["child"], "ro-1", "at-1", 3)
    parent = finished["parent"]
    assert span.rollout_id == "ro-1" and span.attempt_id == "at-1" and span.sequence_id == 3
    assert len(span.trace_id) == 32 and len(span.span_id) == 16
    assert span.parent_id == format(parent.context.span_id, "016x")
    assert span.attributes == {"k": "v"}
    assert span.events[0].name == "e" and span.events[0].timestamp is not None
    assert span.start_time is not None and span.start_time < 1e11
    assert Span.model_validate_json(span.model_dump_json()) == span


def test_span_attributes_accept_subclasses_of_the_primitive_types() -> None:
    class Name(str):
        pass

    class Count(int):
        pass

    attributes = {Name("key"): Count(3), "ids": [Count(1), 2], "pair": (Name("a"), Name("b"))}
    span = Span.from_attributes(attributes=attributes)  # type: ignore[arg-type]
    assert span.attributes == {"key": 3, "ids": [1, 2], "pair": ["a", "b"]}
    with pytest.raises(ValidationError, match="'ids' must be"):
        Span.from_attributes(attributes={"ids": [Count(1), None]})  # type: ignore[list-item]


def test_span_from_attributes_and_core_fields() -> None:
    span = Span.from_attributes(attributes={"a": 1}, parent_id="00000000000000ab")
    assert span.name == "agentlightning.virtual" and span.sequence_id == 0 and span.rollout_id == ""
    assert span.parent is not None and span.parent.span_id == "00000000000000ab"
    core = SpanCoreFields(
        name="n", status=TraceStatus(status_code="OK"), attributes={"x": 1}, start_time=None, end_time=None
    )
    built = Span.from_core_fields(core, rollout_id="ro", attempt_id="at", sequence_id=2)
    assert built.name == "n" and built.start_time is not None and built.sequence_id == 2


def test_unset_is_a_picklable_singleton() -> None:
    assert repr(UNSET) == "UNSET"
    assert isinstance(UNSET, Unset)
    assert pickle.loads(pickle.dumps(UNSET)) is UNSET
    assert Unset() is UNSET


def test_span_attributes_are_checked_and_tuples_become_lists() -> None:
    span = Span.from_attributes(attributes={"ids": (1, 2, 3), "s": "x", "f": 1.5, "b": True, "mixed": [1, 2.5]})
    assert span.attributes["ids"] == [1, 2, 3]
    for bad in ({"nested": {"a": 1}}, {"none": None}, {"list_of_dicts": [{"a": 1}]}, {1: "x"}):
        with pytest.raises(ValidationError):
            Span.from_attributes(attributes=bad)  # type: ignore[arg-type]
    assert Span.model_validate_json(span.model_dump_json()) == span


def test_without_lone_surrogates_repairs_only_what_json_cannot_carry() -> None:
    from agentbolt.types.wire import encode_json, without_lone_surrogates

    clean = {"text": "caf\u00e9 \U0001f600", "ids": [1, 2.5, None, True], "nested": ("a", {"b": "c"})}
    assert without_lone_surrogates(clean) is clean  # nothing to repair: the same object back
    broken = {"k\udcff": ["x\ud800", ("\ud83d\ude00", 3)], "fine": "ok"}
    repaired = without_lone_surrogates(broken)
    assert repaired == {"k\ufffd": ["x\ufffd", ("\U0001f600", 3)], "fine": "ok"}
    assert broken == {"k\udcff": ["x\ud800", ("\ud83d\ude00", 3)], "fine": "ok"}  # the input is not changed
    assert encode_json(repaired)  # writable now
    with pytest.raises(ValueError, match="surrogates not allowed"):
        encode_json(broken)
