"""The gateway's Anthropic Messages route: translated onto chat backends, passed through to Anthropic ones, recorded."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List

import anthropic
import httpx
import pytest

from agentbolt.llm_proxy import LLMProxy
from agentbolt.semconv import LLM_CALL_ID
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout

from .anthropic_stand_in import API_KEY, AnthropicStandIn, running_stand_in
from .conftest import ProxyFactory, wait_for_spans
from .fake_backend import RESPONSE_TOKENS, FakeBackend, prompt_token_ids

WEATHER_TOOL: Dict[str, Any] = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _rollout_url(proxy: LLMProxy, rollout: AttemptedRollout) -> str:
    """The rollout-scoped base URL, in the form the Anthropic SDK's ``base_url`` takes (no ``/v1``)."""
    return f"{proxy.endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}"


def _client(proxy: LLMProxy, rollout: AttemptedRollout, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=_rollout_url(proxy, rollout), api_key=api_key, max_retries=0)


async def test_a_message_is_answered_by_a_chat_backend_and_recorded_with_token_ids(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        raw = await client.messages.with_raw_response.create(
            model="echo",
            max_tokens=32,
            system=[{"type": "text", "text": "Be brief."}],
            messages=[{"role": "user", "content": "Hi"}],
            metadata={"user_id": "u1"},
            extra_body={"temperature": 0.5},  # the API takes it; this SDK version no longer offers the argument
        )
        message = await raw.parse()
        await client.close()
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    chat_messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    sent = backend.requests[-1]
    assert sent["messages"] == chat_messages and sent["max_tokens"] == 32 and sent["temperature"] == 0.5
    assert sent["return_token_ids"] is True and "metadata" not in sent
    assert message.type == "message" and message.role == "assistant" and message.model == "echo"
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == "Hello there"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens == len(prompt_token_ids(sent)) and message.usage.output_tokens == 4
    attrs = span.attributes
    assert span.name == "agentbolt.llm_call" and span.status.status_code == "OK"
    assert attrs["gen_ai.prompt.0.role"] == "system" and attrs["gen_ai.prompt.1.content"] == "Hi"
    assert attrs["gen_ai.completion.0.content"] == "Hello there"
    assert attrs["prompt_token_ids"] == prompt_token_ids(sent)
    assert attrs["response_token_ids"] == RESPONSE_TOKENS
    assert attrs[LLM_CALL_ID] == raw.headers["request-id"] == raw.headers["x-request-id"]


async def test_a_streamed_message_has_anthropics_events_and_is_recorded_like_a_plain_one(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    request: Dict[str, Any] = {"model": "echo", "max_tokens": 32, "messages": [{"role": "user", "content": "Tell me"}]}
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        await client.messages.create(**request)
        async with client.messages.stream(**request) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        async with httpx.AsyncClient(timeout=30) as http:
            raw = await http.post(f"{_rollout_url(proxy, rollout)}/v1/messages", json={**request, "stream": True})
        await client.close()
        plain, streamed, _ = await wait_for_spans(store, rollout.rollout_id, 3)
    assert "".join(texts) == "Hello there"
    assert final.content[0].text == "Hello there" and final.stop_reason == "end_turn"
    events = [line[len("event: ") :] for line in raw.text.splitlines() if line.startswith("event: ")]
    assert events == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 4,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert streamed.attributes["gen_ai.request.stream"] is True
    for key in ("prompt_token_ids", "response_token_ids", "gen_ai.completion.0.content"):
        assert streamed.attributes[key] == plain.attributes[key], key


async def test_tool_use_and_tool_result_round_trip(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    messages: List[Dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        first = await client.messages.create(
            model="echo", max_tokens=64, messages=messages, tools=[WEATHER_TOOL], tool_choice={"type": "any"}
        )
        async with client.messages.stream(model="echo", max_tokens=64, messages=messages, tools=[WEATHER_TOOL]) as s:
            streamed = await s.get_final_message()
        [tool_use] = first.content
        messages += [
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}]},
        ]
        final = await client.messages.create(model="echo", max_tokens=64, messages=messages, tools=[WEATHER_TOOL])
        await client.close()
        spans = await wait_for_spans(store, rollout.rollout_id, 3)
    assert backend.requests[0]["tool_choice"] == "required"
    assert backend.requests[0]["tools"][0]["function"]["parameters"] == WEATHER_TOOL["input_schema"]
    assert tool_use.type == "tool_use" and tool_use.id == "call_1" and tool_use.name == "get_weather"
    assert tool_use.input == {"city": "Paris"} and first.stop_reason == "tool_use"
    [streamed_use] = streamed.content
    assert streamed_use.type == "tool_use" and streamed_use.input == {"city": "Paris"}
    assert streamed.stop_reason == "tool_use"
    assert final.content[0].text == "Hello there"
    assert backend.requests[-1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    for span in spans[:2]:
        assert span.attributes["gen_ai.completion.0.tool_calls.0.name"] == "get_weather"
        assert span.attributes["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert spans[2].attributes["gen_ai.prompt.2.role"] == "tool"
    assert spans[2].attributes["gen_ai.prompt.2.tool_call_id"] == "call_1"


def _error(response: httpx.Response) -> Dict[str, Any]:
    body = response.json()
    assert body["type"] == "error", body
    return body["error"]


async def test_bad_requests_and_backend_failures_get_anthropic_errors(
    make_proxy: ProxyFactory, rollout: AttemptedRollout
) -> None:
    good: Dict[str, Any] = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    async with make_proxy() as proxy, httpx.AsyncClient(timeout=30) as http:
        url = f"{proxy.endpoint}/v1/messages"
        cases = [
            (await http.post(url, content=b"{not json", headers={"content-type": "application/json"}), 400, "JSON"),
            (await http.post(url, json={"model": "echo", "messages": good["messages"]}), 400, "max_tokens"),
            (await http.post(url, json={"model": "echo", "max_tokens": 8}), 400, "messages"),
            (await http.post(url, json={**good, "max_tokens": 0}), 400, "max_tokens"),
            (await http.post(url, json={**good, "messages": [{"role": "system", "content": "x"}]}), 400, "role"),
            (await http.post(url, json={**good, "tools": [{"type": "web_search_20250305", "name": "s"}]}), 400, "tool"),
            (await http.post(url, json={**good, "temperature": 9}), 400, "temperature"),
            (await http.post(url, json={**good, "model": "nope"}), 404, "nope"),
            (await http.post(url, json={**good, "model": "fail500"}), 502, "HTTP 500"),
            (await http.post(url, json={**good, "model": "badrequest"}), 400, "max_tokens is too large"),
            (await http.post(url, json={**good, "model": "ratelimit"}), 429, "rate"),
            (await http.post(url, json={**good, "model": "oddchoices"}), 502, "not a chat completion"),
        ]
        after = await http.post(url, json=good)
        sdk = anthropic.AsyncAnthropic(base_url=proxy.endpoint, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.NotFoundError):
            await sdk.messages.create(**{**good, "model": "nope"})
        await sdk.close()
    expected_types = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 502: "api_error"}
    for response, status, words in cases:
        assert response.status_code == status, response.text
        error = _error(response)
        assert error["type"] == expected_types[status] and words in error["message"], error
    assert after.status_code == 200 and after.json()["content"][0]["text"] == "Hello there"


async def test_a_request_the_chat_schema_refuses_is_refused_naming_the_fields_the_client_sent(
    make_proxy: ProxyFactory,
) -> None:
    good: Dict[str, Any] = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    other_tool = {"name": "lookup", "input_schema": {"type": "array"}}
    cases = [
        (
            {
                "system": "Be brief.",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": []},
                    {"role": "user", "content": "Again"},
                ],
            },
            "messages.1.content: ",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                ]
            },
            "messages.1.content: ",
        ),
        ({"stop_sequences": ["END", ""]}, "stop_sequences: "),
        ({"stop_sequences": ["END", 1]}, "stop_sequences.1: "),
        ({"tools": [{**WEATHER_TOOL, "name": "get weather"}]}, "tools.0.name: "),
        ({"tools": [WEATHER_TOOL, other_tool]}, "tools.1.input_schema: must be a JSON Schema of type 'object'"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": ""}}, "tool_choice.name: "),
    ]
    async with make_proxy() as proxy, httpx.AsyncClient(timeout=30) as http:
        url = f"{proxy.endpoint}/v1/messages"
        answers = [await http.post(url, json={**good, **fields}) for fields, _ in cases]
    for (fields, where), answer in zip(cases, answers, strict=True):
        assert answer.status_code == 400, (fields, answer.text)
        assert _error(answer)["message"].startswith(where), (fields, answer.text)


async def test_the_api_key_is_accepted_in_either_header(make_proxy: ProxyFactory, rollout: AttemptedRollout) -> None:
    body: Dict[str, Any] = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    async with make_proxy(api_key="s3cret") as proxy, httpx.AsyncClient(timeout=30) as http:
        url = f"{proxy.endpoint}/v1/messages"
        missing = await http.post(url, json=body)
        wrong = await http.post(url, json=body, headers={"x-api-key": "wrong"})
        bearer = await http.post(url, json=body, headers={"authorization": "Bearer s3cret"})
        client = _client(proxy, rollout, api_key="s3cret")  # the SDK sends x-api-key
        message = await client.messages.create(**body)
        await client.close()
        chat = await http.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "echo", "messages": body["messages"]},
            headers={"x-api-key": "s3cret"},
        )
    assert missing.status_code == wrong.status_code == 401
    assert _error(missing)["type"] == "authentication_error"
    assert bearer.status_code == 200 and message.content[0].text == "Hello there"  # type: ignore[union-attr]
    assert chat.status_code == 200


@pytest.fixture
async def stand_in() -> AsyncIterator[AnthropicStandIn]:
    async with running_stand_in() as server:
        yield server


def _anthropic_models(stand_in: AnthropicStandIn) -> List[Dict[str, Any]]:
    return [
        {
            "model_name": name,
            "litellm_params": {"model": f"anthropic/{name}", "api_base": stand_in.base_url, "api_key": API_KEY},
        }
        for name in ("claude-echo", "claude-overloaded", "claude-badrequest")
    ]


async def test_anthropic_backends_get_the_request_as_sent_and_the_call_is_recorded(
    make_proxy: ProxyFactory, stand_in: AnthropicStandIn, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    messages: List[Dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Weather?"}]}]
    request: Dict[str, Any] = {"model": "claude-echo", "max_tokens": 64, "messages": messages, "system": "Be brief."}
    async with make_proxy(model_list=_anthropic_models(stand_in)) as proxy:
        client = _client(proxy, rollout)
        message = await client.messages.create(**request, extra_headers={"anthropic-beta": "some-feature"})
        async with client.messages.stream(**request, tools=[WEATHER_TOOL]) as stream:  # type: ignore[arg-type]
            streamed = await stream.get_final_message()
        with pytest.raises(anthropic.InternalServerError) as overloaded:
            await client.messages.create(**{**request, "model": "claude-overloaded"})
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(**{**request, "model": "claude-badrequest"})
        await client.close()
        async with httpx.AsyncClient(timeout=30) as http:
            chat = await http.post(
                f"{proxy.endpoint}/v1/chat/completions", json={"model": "claude-echo", "messages": messages}
            )
        plain, tool, *_ = await wait_for_spans(store, rollout.rollout_id, 4)
    assert stand_in.requests[0] == {**request}
    assert stand_in.headers[0]["anthropic-beta"] == "some-feature"
    assert message.content[0].text == "Hello there" and message.id == "msg_standin1"  # type: ignore[union-attr]
    assert streamed.content[0].type == "tool_use" and streamed.content[0].input == {"city": "Paris"}
    assert overloaded.value.status_code == 529 and "Overloaded" in str(overloaded.value)
    assert "non-empty" in str(bad.value)
    assert chat.status_code == 400 and "/v1/messages" in chat.json()["error"]["message"]
    assert plain.status.status_code == "OK"
    assert plain.attributes["gen_ai.prompt.0.content"] == "Be brief."
    assert plain.attributes["gen_ai.prompt.1.content"] == "Weather?"
    assert plain.attributes["gen_ai.completion.0.content"] == "Hello there"
    assert plain.attributes["gen_ai.usage.input_tokens"] == 12
    assert tool.status.status_code == "OK" and tool.attributes["gen_ai.request.stream"] is True
    assert tool.attributes["gen_ai.completion.0.tool_calls.0.name"] == "get_weather"
    assert json.loads(tool.attributes["gen_ai.completion.0.tool_calls.0.arguments"]) == {"city": "Paris"}
    assert tool.attributes["gen_ai.completion.0.finish_reason"] == "tool_calls"


async def test_a_stream_the_backend_drops_ends_with_an_error_event_and_a_failed_span(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    body: Dict[str, Any] = {"model": "drop", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        with pytest.raises(anthropic.APIStatusError) as raised:
            async with client.messages.stream(**body) as stream:
                async for _ in stream:
                    pass
        await client.close()
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert "dropped the stream connection" in str(raised.value)
    assert span.status.status_code == "ERROR" and span.attributes["error.type"] == "upstream_error"


async def test_a_translated_stream_the_backend_stalls_ends_with_a_timeout_error(
    make_proxy: ProxyFactory, backend: FakeBackend, rollout: AttemptedRollout
) -> None:
    """A chat backend that stops sending mid-stream: the Messages client gets Anthropic's ``timeout_error``."""
    body: Dict[str, Any] = {
        "model": "gated",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    try:
        settings = {"litellm_settings": {"request_timeout": 0.5}}
        async with make_proxy(litellm_config=settings) as proxy, httpx.AsyncClient(timeout=30) as http:
            response = await http.post(f"{_rollout_url(proxy, rollout)}/v1/messages", json=body)
    finally:
        backend.gate.set()
    events = [json.loads(line[len("data: ") :]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "timeout_error"


HOSTILE_FIELDS: List[Dict[str, Any]] = [
    {"system": 5},
    {"system": [{"type": "text", "text": 5}]},
    {"messages": [{"role": "user", "content": [5]}]},
    {"messages": [{"role": "user", "content": [{"type": 3}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": "x"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}]},
    {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "w", "input": "x"}]}]},
    {"tools": {"name": "w"}},
    {"tools": ["w"]},
    {"tool_choice": "auto"},
    {"tool_choice": {"type": "tool"}},
    {"stop_sequences": [1]},
    {"top_k": "many"},
    {"top_p": 0},
    {"max_tokens": "8"},
    {"model": ["echo"]},
]


async def test_hostile_bodies_get_a_400_and_leave_the_gateway_serving(make_proxy: ProxyFactory) -> None:
    good: Dict[str, Any] = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    async with make_proxy() as proxy, httpx.AsyncClient(timeout=30) as http:
        url = f"{proxy.endpoint}/v1/messages"
        answers = [await http.post(url, json={**good, **fields}) for fields in HOSTILE_FIELDS]
        answers.append(await http.post(url, json=["not", "an", "object"]))
        answers.append(await http.post(url, content=b"x" * 10, headers={"content-type": "text/plain"}))
        after = await http.post(url, json=good)
    for fields, answer in zip([*HOSTILE_FIELDS, "list", "text"], answers, strict=True):
        assert 400 <= answer.status_code < 500, (fields, answer.text)
        assert _error(answer)["type"] == "invalid_request_error", (fields, answer.text)
    assert after.status_code == 200
