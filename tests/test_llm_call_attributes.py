"""The attributes of one LLM call: request keys, responses complete or streamed, dicts or OpenAI SDK objects."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agentbolt.llm_call_attributes import CompletionRecord, llm_call_attributes, request_attributes

COMPLETION: Dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Paris",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
                ],
            },
            "finish_reason": "tool_calls",
            "token_ids": [7, 8],
            "logprobs": {
                "content": [
                    {"token": "Par", "logprob": -0.5, "top_logprobs": []},
                    {"token": "is", "logprob": -0.25, "top_logprobs": []},
                ]
            },
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def _chunks() -> List[Dict[str, Any]]:
    """The stream of :data:`COMPLETION`: the name in the first tool-call fragment, arguments and ids in pieces."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def chunk(choice: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
        return {**base, **extra, "choices": [{"index": 0, "finish_reason": None, **choice}]}

    return [
        chunk({"delta": {"role": "assistant", "content": ""}}, prompt_token_ids=[1, 2, 3]),
        chunk(
            {
                "delta": {
                    "content": "Par",
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q"'},
                        }
                    ],
                },
                "token_ids": [7],
                "logprobs": {"content": [{"token": "Par", "logprob": -0.5, "top_logprobs": []}]},
            }
        ),
        chunk(
            {
                "delta": {"content": "is", "tool_calls": [{"index": 0, "function": {"arguments": ': "x"}'}}]},
                "token_ids": [8],
                "logprobs": {"content": [{"token": "is", "logprob": -0.25, "top_logprobs": []}]},
            }
        ),
        chunk({"delta": {}, "finish_reason": "tool_calls"}),
        {**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    ]


def test_request_keys_follow_the_opentelemetry_genai_conventions() -> None:
    attributes = request_attributes(
        {"model": "m", "n": 2, "stop": "END", "max_completion_tokens": 64, "temperature": 0.0, "seed": True},
        provider="openai",
    )
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.stream": False,
        "gen_ai.system": "openai",
        "gen_ai.request.model": "m",
        "gen_ai.request.choice.count": 2,
        "gen_ai.request.stop_sequences": ["END"],
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.0,
    }  # a boolean is not a number: seed=True is not recorded


def test_max_tokens_wins_over_max_completion_tokens_and_stream_is_a_bool() -> None:
    attributes = request_attributes({"max_tokens": 8, "max_completion_tokens": 64, "stream": True, "stop": ["a", "b"]})
    assert attributes["gen_ai.request.max_tokens"] == 8
    assert attributes["gen_ai.request.stream"] is True
    assert attributes["gen_ai.request.stop_sequences"] == ["a", "b"]


def test_messages_tools_and_text_prompts() -> None:
    parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]
    chat = request_attributes(
        {
            "messages": [
                {"role": "user", "content": parts, "name": "ann"},
                {"role": "assistant", "content": None, "tool_calls": COMPLETION["choices"][0]["message"]["tool_calls"]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
            "functions": [{"name": "legacy", "description": "old style"}],
        }
    )
    assert (
        chat["gen_ai.prompt.0.content"]
        == '[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}]'
    )
    assert chat["gen_ai.prompt.0.name"] == "ann"
    assert "gen_ai.prompt.1.content" not in chat
    assert chat["gen_ai.prompt.1.tool_calls.0.name"] == "lookup"
    assert chat["gen_ai.prompt.1.tool_calls.0.arguments"] == '{"q": "x"}'
    assert chat["gen_ai.prompt.2.tool_call_id"] == "call_1"
    assert chat["gen_ai.request.functions.0.parameters"] == '{"type":"object"}'
    assert chat["gen_ai.request.functions.1.description"] == "old style"
    text = request_attributes({"prompt": "abc"}, operation="text_completion")
    assert text["gen_ai.operation.name"] == "text_completion"
    assert (text["gen_ai.prompt.0.role"], text["gen_ai.prompt.0.content"]) == ("user", "abc")


def test_complete_response_attributes() -> None:
    attributes = CompletionRecord.from_completion(COMPLETION).attributes()
    assert attributes == {
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.model": "m",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "Paris",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "call_1",
        "gen_ai.completion.0.tool_calls.0.type": "function",
        "gen_ai.completion.0.tool_calls.0.name": "lookup",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"q": "x"}',
        "gen_ai.response.finish_reasons": ["tool_calls"],
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [7, 8],
        "logprobs.content": (
            '[{"token":"Par","logprob":-0.5,"top_logprobs":[]},{"token":"is","logprob":-0.25,"top_logprobs":[]}]'
        ),
        "response_logprobs": [-0.5, -0.25],
        "gen_ai.usage.input_tokens": 3,
        "gen_ai.usage.output_tokens": 2,
    }


def test_a_stream_records_what_the_complete_response_records() -> None:
    streamed = CompletionRecord()
    for chunk in _chunks():
        streamed.add_chunk(chunk)
    assert streamed.attributes() == CompletionRecord.from_completion(COMPLETION).attributes()


def test_sdk_objects_record_what_their_json_records() -> None:
    completion = ChatCompletion.model_validate(copy.deepcopy(COMPLETION))  # token ids land in the models' extras
    assert (
        CompletionRecord.from_completion(completion).attributes()
        == CompletionRecord.from_completion(COMPLETION).attributes()
    )
    streamed = CompletionRecord()
    for chunk in _chunks():
        streamed.add_chunk(ChatCompletionChunk.model_validate(chunk))
    assert streamed.attributes() == CompletionRecord.from_completion(COMPLETION).attributes()


def test_usage_is_counted_from_token_ids_when_the_backend_sends_none() -> None:
    completion = {key: value for key, value in COMPLETION.items() if key != "usage"}
    attributes = CompletionRecord.from_completion(completion).attributes()
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (3, 2)
    assert "gen_ai.usage.input_tokens" not in CompletionRecord.from_completion({"choices": []}).attributes()
    # With several choices every choice's tokens count, as the backend's completion_tokens counts them.
    choices = [
        {"index": i, "message": {"role": "assistant", "content": "x"}, "token_ids": [i] * (i + 1)} for i in range(3)
    ]
    attributes = CompletionRecord.from_completion({"choices": choices}).attributes()
    assert attributes["gen_ai.usage.output_tokens"] == 1 + 2 + 3
    choices[1]["token_ids"] = []  # one choice's count unknown: so is the total
    assert "gen_ai.usage.output_tokens" not in CompletionRecord.from_completion({"choices": choices}).attributes()


def test_the_stop_string_or_token_a_backend_names_is_recorded_streamed_or_whole() -> None:
    complete = {"choices": [{"index": 0, "text": "Hi", "finish_reason": "stop", "stop_reason": "\nQ:"}]}
    assert CompletionRecord.from_completion(complete).attributes()["gen_ai.completion.0.stop_reason"] == "\nQ:"
    streamed = CompletionRecord()
    streamed.add_chunk({"choices": [{"index": 0, "text": "Hi", "finish_reason": None, "stop_reason": None}]})
    streamed.add_chunk({"choices": [{"index": 0, "text": "", "finish_reason": "stop", "stop_reason": 7}]})
    assert streamed.attributes()["gen_ai.completion.0.stop_reason"] == 7
    for unnamed in (None, True):  # null: an EOS token or another end; anything else is not a stop reason
        answer = {"choices": [{"index": 0, "text": "Hi", "finish_reason": "stop", "stop_reason": unnamed}]}
        assert "gen_ai.completion.0.stop_reason" not in CompletionRecord.from_completion(answer).attributes()


def test_text_completion_stream_matches_the_complete_answer() -> None:
    complete = {
        "id": "cmpl-1",
        "choices": [
            {
                "index": 0,
                "text": "Hello",
                "finish_reason": "stop",
                "prompt_token_ids": [5],
                "token_ids": [1, 2],
                "logprobs": {"tokens": ["Hel", "lo"], "token_logprobs": [-1.0, -2.0]},
            }
        ],
    }
    streamed = CompletionRecord()
    streamed.add_chunk(
        {
            "id": "cmpl-1",
            "choices": [
                {
                    "index": 0,
                    "text": "Hel",
                    "prompt_token_ids": [5],
                    "token_ids": [1],
                    "logprobs": {"tokens": ["Hel"], "token_logprobs": [-1.0]},
                }
            ],
        }
    )
    streamed.add_chunk(
        {
            "id": "cmpl-1",
            "choices": [
                {
                    "index": 0,
                    "text": "lo",
                    "token_ids": [2],
                    "finish_reason": "stop",
                    "logprobs": {"tokens": ["lo"], "token_logprobs": [-2.0]},
                }
            ],
        }
    )
    attributes = CompletionRecord.from_completion(complete).attributes()
    assert streamed.attributes() == attributes
    assert attributes["gen_ai.completion.0.content"] == "Hello"
    assert attributes["response_logprobs"] == [-1.0, -2.0]
    assert "logprobs.content" not in attributes


@pytest.mark.parametrize("repeat_name", [False, True], ids=["name-once", "name-in-every-fragment"])
def test_streamed_tool_call_names_are_not_doubled(repeat_name: bool) -> None:
    record = CompletionRecord()
    for i, piece in enumerate(['{"a"', ": 1}"]):
        function: Dict[str, Any] = {"arguments": piece}
        if i == 0 or repeat_name:
            function["name"] = "lookup"
        record.add_chunk({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": function}]}}]})
    attributes = record.attributes()
    assert attributes["gen_ai.completion.0.tool_calls.0.name"] == "lookup"
    assert attributes["gen_ai.completion.0.tool_calls.0.arguments"] == '{"a": 1}'


def test_llm_call_attributes_joins_request_and_response() -> None:
    attributes = llm_call_attributes({"model": "m"}, CompletionRecord.from_completion(COMPLETION), provider="p")
    assert attributes["gen_ai.request.model"] == "m" and attributes["gen_ai.system"] == "p"
    assert attributes["response_token_ids"] == [7, 8]
    assert llm_call_attributes({"model": "m"}, None) == request_attributes({"model": "m"})


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [{"index": 0, "delta": {"content": 5}}]},
        {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": 7, "arguments": {"x": 1}}}]}}
            ]
        },
        {"choices": 5},
        {"choices": [{"index": 0, "delta": {"tool_calls": "x"}}]},
        {"choices": [{"index": 0, "text": ["a"]}]},
    ],
)
def test_malformed_answers_are_recorded_as_far_as_they_go(chunk: Dict[str, Any]) -> None:
    # A backend's odd field must not cost the span of the call: values that are not text are recorded as JSON.
    streamed = CompletionRecord()
    streamed.add_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok "}}]})
    streamed.add_chunk(chunk)
    attributes = streamed.attributes()
    assert attributes["gen_ai.completion.0.content"].startswith("ok ")
    CompletionRecord.from_completion(chunk).attributes()


def test_parameters_that_change_the_sampled_distribution_are_named() -> None:
    plain = request_attributes({"model": "m", "messages": [], "temperature": 0.7, "top_p": 1.0, "top_k": -1})
    assert "gen_ai.request.distribution_changing" not in plain
    guided = request_attributes({"model": "m", "prompt": "x", "top_p": 0.9, "guided_regex": "a+", "logit_bias": {}})
    assert guided["gen_ai.request.distribution_changing"] == ["guided_regex", "top_p"]
