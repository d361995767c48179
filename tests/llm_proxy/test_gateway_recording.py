"""What the gateway forwards and records, against the fake backend: extensions, spans, streams, tool calls."""

from __future__ import annotations

import json
from typing import Any, Dict

import httpx
import openai

from agentbolt.llm_proxy import LLMProxy
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout

from .conftest import ProxyFactory, model_list_for, wait_for_spans
from .fake_backend import RESPONSE_TOKENS, FakeBackend, prompt_token_ids

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _client(proxy: LLMProxy, rollout: AttemptedRollout) -> openai.AsyncOpenAI:
    llm = proxy.as_resource(model="echo").get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)  # type: ignore[call-arg]
    return openai.AsyncOpenAI(base_url=llm, api_key="unused", max_retries=0)


async def test_token_id_backends_get_extensions_and_openai_ones_do_not(
    make_proxy: ProxyFactory, backend: FakeBackend
) -> None:
    model_list = [
        *model_list_for(backend)[:1],
        {"model_name": "plain", "litellm_params": {"model": "openai/echo", "api_base": backend.base_url}},
    ]
    async with make_proxy(model_list=model_list) as proxy, httpx.AsyncClient() as client:
        for model in ("echo", "plain"):
            response = await client.post(
                f"{proxy.endpoint}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5},
            )
            assert response.status_code == 200
    vllm_body, plain_body = backend.requests
    assert vllm_body == {
        "model": "echo",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
        "return_token_ids": True,
        "logprobs": True,
    }
    assert plain_body == {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}


async def test_text_completion_logprobs_are_asked_for_only_when_the_client_did_not(
    make_proxy: ProxyFactory, backend: FakeBackend
) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        for logprobs in (None, 0, 3):
            body = {"model": "echo", "prompt": "x", **({} if logprobs is None else {"logprobs": logprobs})}
            assert (await client.post(f"{proxy.endpoint}/v1/completions", json=body)).status_code == 200
    # 0 already returns each sampled token's log-probability: no alternative is added to the client's answer.
    assert [request["logprobs"] for request in backend.requests] == [1, 0, 3]


async def test_callbacks_choose_the_extensions(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy(callbacks=["return_token_ids"]) as proxy, httpx.AsyncClient() as client:
        await client.post(f"{proxy.endpoint}/v1/completions", json={"model": "echo", "prompt": "x", "logprobs": 2})
        await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert backend.requests[0]["logprobs"] == 2 and backend.requests[0]["return_token_ids"] is True
    assert "logprobs" not in backend.requests[1]


async def test_chat_call_is_recorded_as_one_span(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        completion = await client.chat.completions.create(
            model="echo", messages=messages, temperature=0.7, extra_headers={"x-agentbolt-agent-name": "planner"}
        )
        await client.close()
        spans = await wait_for_spans(store, rollout.rollout_id, 1)
    assert completion.choices[0].message.content == "Hello there"
    [span] = spans
    attrs = span.attributes
    assert span.name == "agentbolt.llm_call"
    assert (span.rollout_id, span.attempt_id) == (rollout.rollout_id, rollout.attempt.attempt_id)
    assert span.status.status_code == "OK"
    assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time
    assert attrs["gen_ai.request.model"] == "echo"
    assert attrs["gen_ai.request.temperature"] == 0.7
    assert attrs["gen_ai.response.id"] == completion.id
    assert attrs["gen_ai.prompt.0.role"] == "system" and attrs["gen_ai.prompt.1.content"] == "Hi"
    assert attrs["gen_ai.completion.0.content"] == "Hello there"
    assert attrs["gen_ai.completion.0.finish_reason"] == "stop"
    assert attrs["prompt_token_ids"] == prompt_token_ids({"messages": messages})
    assert attrs["response_token_ids"] == RESPONSE_TOKENS
    assert attrs["response_logprobs"] == [-0.5, -1.0, -1.5, -2.0]
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["agentbolt.llm.agent_name"] == "planner"
    assert span.resource.attributes["agentlightning.rollout_id"] == rollout.rollout_id
    assert span.resource.attributes["agentlightning.span_sequence_id"] == span.sequence_id


async def test_stream_and_non_stream_record_the_same_call(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    messages = [{"role": "user", "content": "Tell me"}]
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        await client.chat.completions.create(model="echo", messages=messages)
        stream = await client.chat.completions.create(model="echo", messages=messages, stream=True)
        pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
        await client.close()
        plain, streamed = await wait_for_spans(store, rollout.rollout_id, 2)
    assert "".join(p or "" for p in pieces) == "Hello there"
    assert streamed.status.status_code == "OK"
    assert streamed.attributes["gen_ai.request.stream"] is True
    for key in (
        "prompt_token_ids",
        "response_token_ids",
        "response_logprobs",
        "gen_ai.completion.0.content",
        "gen_ai.completion.0.role",
        "gen_ai.completion.0.finish_reason",
        "gen_ai.usage.output_tokens",
    ):
        assert streamed.attributes[key] == plain.attributes[key], key
    assert plain.sequence_id < streamed.sequence_id


async def test_tool_call_turns_round_trip_through_the_sdk(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    messages: list[Dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        first = await client.chat.completions.create(model="echo", messages=messages, tools=[WEATHER_TOOL])
        call = first.choices[0].message.tool_calls[0]
        stream = await client.chat.completions.create(
            model="echo", messages=messages, tools=[WEATHER_TOOL], stream=True
        )
        arguments = ""
        async for chunk in stream:
            for delta in chunk.choices[0].delta.tool_calls or []:
                arguments += delta.function.arguments or ""
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        final = await client.chat.completions.create(model="echo", messages=messages, tools=[WEATHER_TOOL])
        await client.close()
        spans = await wait_for_spans(store, rollout.rollout_id, 3)
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert json.loads(arguments) == {"city": "Paris"}
    assert final.choices[0].message.content == "Hello there"
    plain, streamed, last = spans
    for span in (plain, streamed):
        attrs = span.attributes
        assert attrs["gen_ai.request.functions.0.name"] == "get_weather"
        assert json.loads(attrs["gen_ai.request.functions.0.parameters"])["required"] == ["city"]
        assert attrs["gen_ai.completion.0.tool_calls.0.id"] == "call_1"
        assert attrs["gen_ai.completion.0.tool_calls.0.name"] == "get_weather"
        assert json.loads(attrs["gen_ai.completion.0.tool_calls.0.arguments"]) == {"city": "Paris"}
        assert attrs["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert last.attributes["gen_ai.prompt.1.tool_calls.0.name"] == "get_weather"
    assert last.attributes["gen_ai.prompt.2.role"] == "tool"
    assert last.attributes["gen_ai.prompt.2.tool_call_id"] == "call_1"


async def test_text_completions_are_recorded_streaming_or_not(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        done = await client.completions.create(model="echo", prompt="abc")
        stream = await client.completions.create(model="echo", prompt="abc", stream=True)
        text = "".join([chunk.choices[0].text async for chunk in stream])
        await client.close()
        plain, streamed = await wait_for_spans(store, rollout.rollout_id, 2)
    assert done.choices[0].text == text == "Hello there"
    for span in (plain, streamed):
        assert span.attributes["gen_ai.prompt.0.content"] == "abc"
        assert span.attributes["gen_ai.completion.0.content"] == "Hello there"
        assert span.attributes["prompt_token_ids"] == prompt_token_ids({"prompt": "abc"})
        assert span.attributes["response_token_ids"] == RESPONSE_TOKENS
        assert span.attributes["response_logprobs"] == [-0.5, -1.0, -1.5, -2.0]


async def test_only_calls_bound_to_a_rollout_are_recorded(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "x"}]}
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        unbound = await client.post(f"{proxy.endpoint}/v1/chat/completions", json=body)
        bound = proxy.as_resource(rollout.rollout_id, rollout.attempt.attempt_id, model="echo").endpoint
        for _ in range(3):
            assert (await client.post(f"{bound}/v1/chat/completions", json=body)).status_code == 200
        # Unknown rollouts still get their answer; the store refuses the span, which the gateway counts.
        ghost = await client.post(f"{proxy.endpoint}/rollout/ro-ghost/attempt/at-ghost/chat/completions", json=body)
        spans = await wait_for_spans(store, rollout.rollout_id, 3)
        # The ghost's span may still be on its way to the store: wait until every span is written or given up.
        assert await proxy.flush()
        health = (await client.get(f"{proxy.endpoint}/health")).json()
    assert unbound.status_code == 200 and ghost.status_code == 200
    assert len(spans) == 3
    assert [s.sequence_id for s in spans] == sorted({s.sequence_id for s in spans})
    assert health["spans"]["written"] == 3
    assert health["spans"]["failed"] == 1


async def test_model_list_updates_apply_to_a_running_in_process_gateway(
    make_proxy: ProxyFactory, backend: FakeBackend
) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        body = {"model": "renamed", "messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post(f"{proxy.endpoint}/v1/chat/completions", json=body)).status_code == 404
        proxy.update_model_list(
            [{"model_name": "renamed", "litellm_params": {"model": "hosted_vllm/echo", "api_base": backend.base_url}}]
        )
        assert (await client.post(f"{proxy.endpoint}/v1/chat/completions", json=body)).status_code == 200
    assert proxy.model_list[0]["model_name"] == "renamed"


async def test_deployments_sharing_a_name_take_turns(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    model_list = [
        {"model_name": "pool", "litellm_params": {"model": "hosted_vllm/echo", "api_base": backend.base_url}},
        {"model_name": "pool", "litellm_params": {"model": "hosted_vllm/flaky", "api_base": backend.base_url}},
    ]
    backend.flaky_failures = 0
    async with make_proxy(model_list=model_list) as proxy, httpx.AsyncClient() as client:
        for _ in range(4):
            response = await client.post(
                f"{proxy.endpoint}/v1/chat/completions",
                json={"model": "pool", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert response.status_code == 200
    assert backend.count("echo") == 2 and backend.count("flaky") == 2


async def test_stream_events_reach_the_client_before_the_backend_finishes(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    # The backend sends its first event, then waits for the gate: a gateway that buffered the stream would only
    # deliver that event after the gate timed out.
    async with make_proxy() as proxy:
        client = _client(proxy, rollout)
        stream = await client.chat.completions.create(
            model="gated", messages=[{"role": "user", "content": "x"}], stream=True
        )
        chunks = stream.__aiter__()
        first = await chunks.__anext__()
        backend.gate.set()
        rest = [chunk async for chunk in chunks]
        await client.close()
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert not backend.gate_timed_out
    assert first.choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in rest) == "Hello there"
    assert span.attributes["response_token_ids"] == RESPONSE_TOKENS
