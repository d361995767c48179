"""The pure translation rules between Anthropic's Messages API and chat completions."""

from __future__ import annotations

from typing import Any, Dict, List

import orjson
import pytest

from agentbolt.gateway.anthropic import (
    ChatStreamTranslator,
    anthropic_error_from_openai,
    assemble_message_stream,
    chat_to_message,
    message_to_chat_completion,
    messages_to_chat,
    validate_messages_request,
)
from agentbolt.openai_api.errors import ApiError

BASE: Dict[str, Any] = {"model": "m", "max_tokens": 16}


def _chat(**fields: Any) -> Dict[str, Any]:
    body = {**BASE, **fields}
    validate_messages_request(body)
    return messages_to_chat(body)


def test_system_text_and_image_blocks_become_chat_messages() -> None:
    chat = _chat(
        system=[{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two.", "cache_control": {}}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.org/a.png"}},
                ],
            },
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "A"}]},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        ],
        temperature=0.2,
        top_p=0.9,
        stop_sequences=["END"],
        metadata={"user_id": "x"},
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Rule one.\nRule two."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://example.org/a.png"}},
            ],
        },
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "one\ntwo"},
    ]
    assert {k: chat[k] for k in ("max_tokens", "temperature", "top_p", "stop")} == {
        "max_tokens": 16,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["END"],
    }
    assert "metadata" not in chat and "thinking" not in chat and "stream" not in chat


def test_tool_use_and_tool_results_become_tool_calls_and_tool_messages() -> None:
    chat = _chat(
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sun"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": True},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[{"name": "w", "description": "Weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "w", "disable_parallel_tool_use": True},
        stream=True,
    )
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "w", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sun"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}, "description": "Weather"}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("choice", "expected"), [({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none")]
)
def test_tool_choice_kinds(choice: Dict[str, Any], expected: str) -> None:
    tools = [{"name": "w", "input_schema": {"type": "object"}}]
    assert (
        _chat(messages=[{"role": "user", "content": "x"}], tools=tools, tool_choice=choice)["tool_choice"] == expected
    )


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: field required"),
        ({"model": "m", "max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 4}, "messages: field required"),
        ({"model": "m", "max_tokens": 4, "messages": []}, "non-empty"),
        ({"model": "m", "max_tokens": 4, "messages": ["hi"]}, "messages.0"),
        ({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        ({**BASE, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(body: Dict[str, Any], words: str) -> None:
    with pytest.raises(ApiError) as error:
        validate_messages_request(body)
    assert error.value.status == 400 and words in error.value.message


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "'document'"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]}, "source"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "w"}]}]}, "'id' and 'name'"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "w"}]}, "input_schema"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "some"}}, "tool_choice.type"),
    ],
)
def test_blocks_a_chat_backend_cannot_take_are_refused(fields: Dict[str, Any], words: str) -> None:
    body = {**BASE, **fields}
    validate_messages_request(body)
    with pytest.raises(ApiError) as error:
        messages_to_chat(body)
    assert error.value.status == 400 and words in error.value.message


def test_lenient_translation_leaves_out_what_chat_has_no_place_for() -> None:
    body = {
        **BASE,
        "messages": [{"role": "user", "content": [{"type": "document", "source": {}}, {"type": "text", "text": "x"}]}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
    }
    chat = messages_to_chat(body, strict=False)
    assert chat["messages"] == [{"role": "user", "content": "x"}] and "tools" not in chat


def _completion(message: Dict[str, Any], finish_reason: str, **choice: Any) -> Dict[str, Any]:
    return {
        "id": "cmpl-1",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, **choice}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }


def test_chat_answers_become_messages() -> None:
    text = chat_to_message(_completion({"role": "assistant", "content": "Hi"}, "stop"), "public")
    assert text == {
        "id": "msg_cmpl-1",
        "type": "message",
        "role": "assistant",
        "model": "public",
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "w", "arguments": "not json"}},
    ]
    tools = chat_to_message(_completion({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"), "m")
    assert tools["content"] == [
        {"type": "tool_use", "id": "c1", "name": "w", "input": {"a": 1}},
        {"type": "tool_use", "id": "c2", "name": "w", "input": {}},
    ]
    assert tools["stop_reason"] == "tool_use"
    cut = chat_to_message(_completion({"role": "assistant", "content": "x"}, "length"), "m")
    assert cut["stop_reason"] == "max_tokens"
    stopped = chat_to_message(
        _completion({"role": "assistant", "content": "x"}, "stop", stop_reason="END"), "m", ["END"]
    )
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")


def _sse(*chunks: Dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"


def _events(stream: bytes) -> List[Dict[str, Any]]:
    return [orjson.loads(line[5:]) for line in stream.splitlines() if line.startswith(b"data:")]


CHAT_STREAM = _sse(
    {"id": "c", "prompt_token_ids": [1, 2, 3, 4, 5], "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"id": "c", "choices": [{"index": 0, "delta": {"content": "Let me "}}]},
    {"id": "c", "choices": [{"index": 0, "delta": {"content": "check."}}]},
    {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "w", "arguments": '{"city"'}}]},
            }
        ],
    },
    {
        "id": "c",
        "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ': "P"}'}}]}}],
    },
    {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}},
)


def test_a_chat_stream_becomes_anthropics_events_however_it_is_cut() -> None:
    whole = ChatStreamTranslator("public").feed(CHAT_STREAM)
    translator = ChatStreamTranslator("public")
    bytewise = b"".join(translator.feed(CHAT_STREAM[i : i + 1]) for i in range(len(CHAT_STREAM))) + translator.close()
    assert bytewise == whole
    events = _events(whole)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["model"] == "public" and events[0]["message"]["id"] == "msg_c"
    assert events[0]["message"]["usage"] == {"input_tokens": 5, "output_tokens": 0}  # counted from the prompt's ids
    assert events[5]["content_block"] == {"type": "tool_use", "id": "c1", "name": "w", "input": {}}
    assert events[9]["delta"]["stop_reason"] == "tool_use"
    assert events[9]["usage"] == {"input_tokens": 5, "output_tokens": 9}
    message, error = assemble_message_stream(whole)
    assert error is None
    assert message["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "c1", "name": "w", "input": {"city": "P"}},
    ]


def test_broken_chat_streams_end_with_an_error_event() -> None:
    cut = CHAT_STREAM[: CHAT_STREAM.index(b"data: [DONE]")]
    translator = ChatStreamTranslator("m")
    events = _events(translator.feed(cut) + translator.close())
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": events[-1]["error"]["message"]}}
    failed = ChatStreamTranslator("m").feed(b'data: {"error": {"message": "engine died", "code": 504}}\n\n')
    assert _events(failed) == [{"type": "error", "error": {"type": "timeout_error", "message": "engine died"}}]


def test_messages_are_recorded_as_the_chat_completion_they_are_equivalent_to() -> None:
    message = {
        "id": "msg_1",
        "model": "claude",
        "content": [{"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "t", "name": "w", "input": {"a": 1}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 4, "output_tokens": 2},
    }
    completion = message_to_chat_completion(message)
    assert completion["choices"][0] == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "Hi",
            "tool_calls": [{"id": "t", "type": "function", "function": {"name": "w", "arguments": '{"a":1}'}}],
        },
        "finish_reason": "tool_calls",
    }
    assert completion["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    _, error = assemble_message_stream(b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\n')
    assert error == "The stream ended before message_stop"


def test_errors_are_rewritten_in_anthropics_shape() -> None:
    openai_error = orjson.dumps({"error": {"message": "no such model", "type": "model_not_found"}})
    assert orjson.loads(anthropic_error_from_openai(404, openai_error)) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no such model"},
    }
    already = orjson.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert anthropic_error_from_openai(529, already) == already
    assert orjson.loads(anthropic_error_from_openai(502, b"Bad Gateway"))["error"] == {
        "type": "api_error",
        "message": "Bad Gateway",
    }


def test_anthropic_model_list_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbolt.gateway.routing import ModelRouter

    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1/never-the-upstream")
    router = ModelRouter(
        [
            {"model_name": "claude", "litellm_params": {"model": "anthropic/claude-sonnet-4-5"}},
            {"model_name": "local", "litellm_params": {"model": "anthropic/x", "api_base": "http://127.0.0.1:9/v1/"}},
        ]
    )
    [claude] = router.candidates("claude")
    assert claude.speaks_messages and not claude.token_ids and claude.api_key == "from-env"
    assert claude.url("v1/messages") == "https://api.anthropic.com/v1/messages"
    assert router.candidates("local")[0].url("v1/messages") == "http://127.0.0.1:9/v1/messages"
    with pytest.raises(ValueError, match="return_token_ids is not available"):
        ModelRouter([{"model_name": "c", "litellm_params": {"model": "anthropic/x", "return_token_ids": True}}])
    mixed = [
        {"model_name": "c", "litellm_params": {"model": "anthropic/x"}},
        {"model_name": "c", "litellm_params": {"model": "hosted_vllm/x", "api_base": "http://127.0.0.1:9/v1"}},
    ]
    with pytest.raises(ValueError, match=r"model_list\[1\]: model 'c' mixes"):
        ModelRouter(mixed)
