"""TraceToMessages: OpenAI conversations (with tools) from traced LLM calls."""

from __future__ import annotations

import json
from typing import Any, List

import pytest
from pydantic import TypeAdapter
from span_factory import SpanFactory

from agentbolt.adapter import TraceToMessages
from agentbolt.adapter.messages import OpenAIMessages, decode_content, group_genai_dict
from agentbolt.llm_call_attributes import CompletionRecord, llm_call_attributes, parse_content_parts

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _validate_with_openai_types(conversations: List[OpenAIMessages]) -> None:
    """The output must be valid input for the OpenAI SDK (its TypedDicts, checked by pydantic)."""
    from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

    for conversation in conversations:
        TypeAdapter(List[ChatCompletionMessageParam]).validate_python(conversation["messages"])
        if conversation["tools"] is not None:
            TypeAdapter(List[ChatCompletionFunctionToolParam]).validate_python(conversation["tools"])


def _tool_use_trace(f: SpanFactory) -> list:
    agent = f.agent("weather", 0, 20)
    tools = {
        "gen_ai.request.functions.0.name": "get_weather",
        "gen_ai.request.functions.0.description": "Current weather of a city",
        "gen_ai.request.functions.0.parameters": json.dumps(WEATHER_PARAMS),
    }
    first = f.span(
        "openai.chat.completion",
        1,
        2,
        parent=agent,
        attributes={
            "gen_ai.request.model": "m",
            **tools,
            "gen_ai.response.id": "c1",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "Weather in Paris?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.finish_reason": "tool_calls",
            "gen_ai.completion.0.tool_calls.0.id": "call_1",
            "gen_ai.completion.0.tool_calls.0.name": "get_weather",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
        },
    )
    tool = f.tool("get_weather", {"city": "Paris"}, "call_1", 2.5, 3, parent=agent)
    second = f.span(
        "openai.chat.completion",
        4,
        5,
        parent=agent,
        attributes={
            "gen_ai.request.model": "m",
            **tools,
            "gen_ai.response.id": "c2",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "Weather in Paris?",
            "gen_ai.prompt.1.role": "assistant",
            "gen_ai.prompt.1.tool_calls.0.id": "call_1",
            "gen_ai.prompt.1.tool_calls.0.type": "function",
            "gen_ai.prompt.1.tool_calls.0.function.name": "get_weather",
            "gen_ai.prompt.1.tool_calls.0.function.arguments": '{"city": "Paris"}',
            "gen_ai.prompt.2.role": "tool",
            "gen_ai.prompt.2.tool_call_id": "call_1",
            "gen_ai.prompt.2.content": "18C, sunny",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "It is 18C and sunny in Paris.",
        },
    )
    reward = f.reward(1.0, 6, parent=agent)
    return [agent, first, tool, second, reward]


def test_tool_use_conversation() -> None:
    conversations = TraceToMessages()(_tool_use_trace(SpanFactory()))
    expected_tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather of a city",
                "parameters": WEATHER_PARAMS,
            },
        }
    ]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert conversations == [
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
            ],
            "tools": expected_tools,
        },
        {
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_1"},
                {"role": "assistant", "content": "It is 18C and sunny in Paris."},
            ],
            "tools": expected_tools,
        },
    ]
    _validate_with_openai_types(conversations)


def test_tool_calls_recorded_as_child_spans_are_attached_to_the_reply() -> None:
    f = SpanFactory()
    call = f.span(
        "openai.chat.completion",
        0,
        5,
        attributes={
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "Look it up",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "",
        },
    )
    tool = f.tool("lookup", {"key": "k"}, "call_9", 1, 2, parent=call)
    unrelated = f.span("http.request", 2, 3, parent=call, attributes={"http.method": "POST"})
    spans = [call, tool, unrelated]
    (conversation,) = TraceToMessages()(spans)
    (from_generator,) = TraceToMessages()(span for span in spans)
    assert from_generator == conversation
    assert conversation["messages"][-1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "k"}'}}
        ],
    }
    assert conversation["tools"] is None
    _validate_with_openai_types([conversation])


def test_multimodal_content_and_gateway_spans_are_read_and_duplicates_dropped() -> None:
    f = SpanFactory()
    parts: List[Any] = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": "http://i"}}]
    traced = f.llm_call(0, 2, response_id="same", extra={"gen_ai.prompt.1.content": json.dumps(parts)})
    gateway = f.gateway_call(0.5, 1.5, response_id="same", prompt_token_ids=[1], response_token_ids=[2])
    other = f.gateway_call(3, 4, response_id="other", prompt_token_ids=[1], response_token_ids=[2])
    conversations = TraceToMessages()([traced, gateway, other])
    # The call recorded by the SDK and the gateway is kept once, from the gateway's record, in call order.
    assert len(conversations) == 2
    assert (
        conversations[0]["messages"]
        == conversations[1]["messages"]
        == [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    )
    (pictured,) = TraceToMessages()([traced])
    assert pictured["messages"][1] == {"role": "user", "content": parts}
    _validate_with_openai_types([*conversations, pictured])


def test_spans_without_genai_data_give_nothing() -> None:
    f = SpanFactory()
    assert TraceToMessages()([f.agent("a", 0, 1), f.reward(1.0, 2)]) == []


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"gen_ai.prompt.role": "user"}, "gen_ai.prompt must be a list"),
        ({"gen_ai.prompt.0.role": "user", "gen_ai.request.0": "x"}, "gen_ai.request must be a dict"),
        ({"gen_ai.prompt.0.role": "wizard", "gen_ai.prompt.0.content": "x"}, "Invalid chat message role"),
        ({"gen_ai.prompt.0.role": "tool", "gen_ai.prompt.0.content": "x"}, "tool_call_id"),
        ({"gen_ai.prompt.0.role": "user", "gen_ai.request.functions.0.name": "f",
          "gen_ai.request.functions.0.parameters": "[1]"}, "must be a JSON object"),
    ],
)  # fmt: skip
def test_malformed_genai_data_is_rejected_clearly(attributes: dict, message: str) -> None:
    span = SpanFactory().span("openai.chat.completion", 0, 1, attributes=attributes)
    with pytest.raises(ValueError, match=message):
        TraceToMessages()([span])


def test_group_genai_dict() -> None:
    data = {"p.0.role": "user", "p.2.role": "tool", "p.0.parts.1": "b", "p.0.parts.0": "a", "q.x": 1, "p": "leaf"}
    assert group_genai_dict(data, "p") == [{"role": "user", "parts": ["a", "b"]}, {"role": "tool"}]
    assert group_genai_dict(data, "q") == {"x": 1}
    assert group_genai_dict(data, "missing") == {}


# ---------------------------------------------------------------------------------------------------------------
# Text content that looks like JSON, and content parts, recorded by llm_call_attributes and read back

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
JSON_LOOKING_TEXTS = [
    '[{"type": "web", "url": "https://a.example", "title": "A"}]',  # search results with their own "type"
    '[{"type": "text", "text": "a tool returning chat content parts as JSON"}]',
    "[{'type': 'text', 'text': 'the same, as the string of a Python list'}]",
    '[{"type": "text"}]',
    '[{"type": "image_url", "url": "https://a.example/cat.png"}]',
    "[]",
    '["a", "b"]',
    "[not json",
]
USER_PARTS: List[Any] = [
    {"type": "text", "text": "What is in this picture and this recording?"},
    {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
]
ASSISTANT_PARTS: List[Any] = [{"type": "text", "text": "I can't"}, {"type": "refusal", "refusal": "Not allowed."}]


def _recorded_call(request: dict, response: dict) -> Any:
    """A span carrying the attributes the OpenAI SDK instrumentation and the gateway record for one call."""
    attributes = llm_call_attributes(request, CompletionRecord.from_completion(response))
    return SpanFactory().span("openai.chat.completion", 0, 1, attributes=attributes)


def _answer(content: Any) -> dict:
    return {"id": "r-1", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


@pytest.mark.parametrize("text", JSON_LOOKING_TEXTS)
def test_text_that_looks_like_json_comes_back_as_the_same_string(text: str) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": text},
    ]
    span = _recorded_call({"model": "m", "messages": messages}, _answer(text))
    (conversation,) = TraceToMessages()([span])
    assert conversation["messages"] == [*messages, {"role": "assistant", "content": text}]
    _validate_with_openai_types([conversation])


def test_streamed_text_that_looks_like_content_parts_comes_back_as_the_same_string() -> None:
    text = '[{"type": "text", "text": "x"}]'
    record = CompletionRecord()
    for piece in (text[:10], text[10:]):
        record.add_chunk({"id": "r-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece}}]})
    attributes = llm_call_attributes({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, record)
    (conversation,) = TraceToMessages()([SpanFactory().span("openai.chat.completion", 0, 1, attributes=attributes)])
    assert conversation["messages"][-1] == {"role": "assistant", "content": text}


def test_content_parts_come_back_as_parts() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": USER_PARTS},
        {"role": "assistant", "content": ASSISTANT_PARTS},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://a.example/cat.png"}}]},
    ]
    span = _recorded_call({"model": "m", "messages": messages}, _answer("A cat."))
    assert not any(key.endswith(".content_is_text") for key in span.attributes)
    (conversation,) = TraceToMessages()([span])
    assert conversation["messages"] == [*messages, {"role": "assistant", "content": "A cat."}]
    _validate_with_openai_types([conversation])


def test_spans_recorded_before_text_was_marked_read_only_openai_content_parts_as_parts() -> None:
    web = '[{"type": "web", "url": "https://a.example", "title": "A"}]'
    attributes = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": json.dumps(USER_PARTS),
        "gen_ai.prompt.1.role": "tool",
        "gen_ai.prompt.1.tool_call_id": "call_1",
        "gen_ai.prompt.1.content": web,
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "ok",
    }
    (conversation,) = TraceToMessages()([SpanFactory().span("openai.chat.completion", 0, 1, attributes=attributes)])
    assert [m["content"] for m in conversation["messages"]] == [USER_PARTS, web, "ok"]


def test_parse_content_parts_accepts_only_openai_parts_with_their_payload() -> None:
    assert parse_content_parts(json.dumps(USER_PARTS)) == USER_PARTS
    assert parse_content_parts(" " + repr(ASSISTANT_PARTS)) == ASSISTANT_PARTS
    assert parse_content_parts(json.dumps([{"type": "image_url", "image_url": PNG}])) == [
        {"type": "image_url", "image_url": PNG}
    ]
    for text in [JSON_LOOKING_TEXTS[0], *JSON_LOOKING_TEXTS[3:]]:  # the others are parts when not marked as text
        assert parse_content_parts(text) is None, text
    assert parse_content_parts(json.dumps([USER_PARTS[0], {"type": "web", "url": "u"}])) is None
    assert parse_content_parts(json.dumps([{"type": "text", "text": 1}])) is None
    assert parse_content_parts(json.dumps([{"type": ["text"], "text": "x"}])) is None
    assert parse_content_parts("[" * 100_000) is None
    assert decode_content(json.dumps(USER_PARTS), text=True) == json.dumps(USER_PARTS)
