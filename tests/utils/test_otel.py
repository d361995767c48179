"""Attribute flattening, sanitising, tags, links and tracer access helpers."""

from __future__ import annotations

import logging
from typing import Any, Dict

import pytest
from opentelemetry import trace as trace_api
from pydantic import ValidationError

from agentbolt.semconv import LinkPydanticModel
from agentbolt.tracer import OtelTracer
from agentbolt.types import Span
from agentbolt.utils import otel
from agentbolt.utils.otel import (
    check_attributes_sanity,
    extract_links_from_attributes,
    extract_tags_from_attributes,
    filter_and_unflatten_attributes,
    filter_attributes,
    flatten_attributes,
    format_exception_attributes,
    full_qualified_name,
    get_span_processors,
    get_tracer,
    get_tracer_provider,
    make_link_attributes,
    make_tag_attributes,
    query_linked_spans,
    sanitize_attribute_value,
    sanitize_attributes,
    sanitize_list_attribute_sanity,
    unflatten_attributes,
)


def test_full_qualified_name() -> None:
    assert full_qualified_name(dict) == "dict"
    assert full_qualified_name(Span) == "agentbolt.types.tracer.Span"


def test_flatten_nested_values() -> None:
    nested = {"a": {"b": 1, "c": [1, 2], "d": [{"e": "x"}, {"e": "y"}]}, "f": [], "g": {}}
    assert flatten_attributes(nested) == {"a.b": 1, "a.c": [1, 2], "a.d.0.e": "x", "a.d.1.e": "y"}
    assert flatten_attributes(nested, expand_leaf_lists=True)["a.c.1"] == 2
    assert flatten_attributes(5) == {"": 5}
    assert flatten_attributes([1, 2]) == {"0": 1, "1": 2}


def test_flatten_keeps_types_apart(caplog: pytest.LogCaptureFixture) -> None:
    assert flatten_attributes({"flags": [True, False]}) == {"flags": [True, False]}
    with caplog.at_level(logging.WARNING, logger="agentbolt.utils.otel"):
        assert flatten_attributes({"mixed": [1, True]}) == {"mixed.0": 1, "mixed.1": True}
    assert "mixes primitive types" in caplog.text
    with pytest.raises(ValueError, match="non-string key"):
        flatten_attributes({1: "x"})


@pytest.mark.parametrize(
    "nested",
    [
        {"a": {"b": [1, 2], "c": "x"}},
        {"items": [{"name": "n", "value": 1.5}, {"name": "m", "value": 2.0}]},
        {"deep": [[1, "a"], [True]]},
    ],
)
def test_flatten_unflatten_round_trip(nested: Dict[str, Any]) -> None:
    assert unflatten_attributes(flatten_attributes(nested, expand_leaf_lists=True)) == nested


def test_unflatten_rules() -> None:
    assert unflatten_attributes({}) == {}
    assert unflatten_attributes({"0": "a", "1": "b"}) == ["a", "b"]
    assert unflatten_attributes({"0": "a", "2": "b"}) == {"0": "a", "2": "b"}
    assert unflatten_attributes({"a": 1, "a.b": 2}) == {"a": {"b": 2}}
    assert unflatten_attributes({"a.b": 2, "a": 1}) == {"a": {"b": 2}}


def test_filter_attributes() -> None:
    attrs = {"x": 1, "x.y": 2, "x.z.0": 3, "xy": 4}
    assert filter_attributes(attrs, "x") == {"x": 1, "x.y": 2, "x.z.0": 3}
    assert filter_and_unflatten_attributes({"x.y": 2, "x.z.0": 3, "xy": 4}, "x") == {"y": 2, "z": [3]}
    with pytest.raises(ValueError, match="leaf"):
        filter_and_unflatten_attributes(attrs, "x")


def test_sanitize_values() -> None:
    assert sanitize_attribute_value("s") == "s"
    assert sanitize_attribute_value([1, True]) == [1, 1]
    assert sanitize_attribute_value([1, 2.5]) == [1.0, 2.5]
    assert sanitize_attribute_value({"a": [1]}) == '{"a": [1]}'
    assert sanitize_attribute_value([1, "x"]) == '[1, "x"]'
    assert sanitize_attribute_value(object()).startswith('"<object')
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        sanitize_attribute_value(object(), force=False)
    with pytest.raises(ValueError, match="Failed to sanitize attribute 'bad'"):
        sanitize_attributes({"ok": 1, "bad": object()}, force=False)
    assert sanitize_list_attribute_sanity(["a", "b"]) == ["a", "b"]
    assert sanitize_list_attribute_sanity([True, False]) == [True, False]
    with pytest.raises(ValueError):
        sanitize_list_attribute_sanity(["a", 1])
    with pytest.raises(ValueError):
        sanitize_list_attribute_sanity([None])


def test_check_attributes_sanity() -> None:
    check_attributes_sanity({"a": 1, "b": ["x", "y"], "c": []})
    for bad in ({1: "x"}, {"a": None}, {"a": [1, "x"]}, {"a": {"b": 1}}):
        with pytest.raises(ValueError):
            check_attributes_sanity(bad)


def test_exception_attributes() -> None:
    try:
        raise ValueError("bad value")
    except ValueError as exc:
        attrs = format_exception_attributes(exc)
    assert attrs["exception.type"] == "ValueError"
    assert attrs["exception.message"] == "bad value"
    assert attrs["exception.escaped"] is True
    assert "raise ValueError" in str(attrs["exception.stacktrace"])


def test_tags_and_links() -> None:
    tags = make_tag_attributes(["x", "y"])
    assert tags == {"agentlightning.tag.0": "x", "agentlightning.tag.1": "y"}
    assert extract_tags_from_attributes(tags) == ["x", "y"]
    assert extract_tags_from_attributes({}) == []
    with pytest.raises(ValidationError):
        extract_tags_from_attributes({"agentlightning.tag.0": 1})
    links = make_link_attributes({"trace_id": "a" * 32, "kind": "tool"})
    assert links["agentlightning.link.1.key_match"] == "kind"
    assert extract_links_from_attributes(links) == [
        LinkPydanticModel(key_match="trace_id", value_match="a" * 32),
        LinkPydanticModel(key_match="kind", value_match="tool"),
    ]
    with pytest.raises(ValueError):
        make_link_attributes({"k": 1})  # type: ignore[dict-item]


def test_query_linked_spans_on_stored_and_otel_spans() -> None:
    tracer = OtelTracer()
    tracer.init_worker(0)
    with tracer._trace_context_sync():
        otel_tracer = tracer.get_otel_tracer()
        with otel_tracer.start_as_current_span("tool", attributes={"kind": "tool"}) as live:
            pass
    stored = tracer.get_last_trace()[0]
    other = Span.from_attributes(attributes={"kind": "tool"})
    by_trace = [LinkPydanticModel(key_match="trace_id", value_match=stored.trace_id)]
    assert query_linked_spans([stored, other], by_trace) == [stored]
    assert query_linked_spans([live], by_trace) == [live]
    by_kind_and_span = [
        LinkPydanticModel(key_match="kind", value_match="tool"),
        LinkPydanticModel(key_match="span_id", value_match=other.span_id),
    ]
    assert query_linked_spans([stored, other], by_kind_and_span) == [other]


def test_tracer_provider_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_api, "_TRACER_PROVIDER", None)
    with pytest.raises(RuntimeError, match="not initialized"):
        get_tracer_provider()
    tracer = OtelTracer()
    tracer.init_worker(0)
    provider = get_tracer_provider()
    assert provider is tracer._tracer_provider
    assert get_span_processors(provider, type(tracer._lightning_span_processor)) == [tracer._lightning_span_processor]
    with tracer._trace_context_sync():
        get_tracer().start_span("exported").end()
        get_tracer(use_active_span_processor=False).start_span("silent").end()
    assert [span.name for span in tracer.get_last_trace()] == ["exported"]
    assert otel.otel_get_tracer_provider is trace_api.get_tracer_provider
