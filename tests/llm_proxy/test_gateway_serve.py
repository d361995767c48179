"""The gateway in front of a real inference server (``agentbolt serve``'s server) running a tiny random Llama."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Dict, Iterator, List

import httpx
import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving

from agentbolt.adapter.triplet import LlmProxyTraceToTriplet
from agentbolt.llm_proxy import LLMProxy
from agentbolt.semconv import AGL_REWARD
from agentbolt.serving.server import InferenceServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout, Span

from .conftest import wait_for_spans

GREEDY: Dict[str, Any] = {"temperature": 0.0, "max_tokens": 8, "seed": 0}
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to three."}]
ANTHROPIC_REQUEST: Dict[str, Any] = {
    "model": "tiny",
    "max_tokens": 8,
    "system": "You are terse.",
    "messages": [{"role": "user", "content": "Count to three."}],
    "extra_body": {"temperature": 0.0},
}
"""The Messages request of :data:`MESSAGES`, greedy."""
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def serve(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serving(tiny_model_dir) as server:
        yield server


@pytest.fixture
async def proxy(serve: InferenceServer, store: InMemoryLightningStore) -> AsyncIterator[LLMProxy]:
    model_list = [{"model_name": "tiny", "litellm_params": {"model": "hosted_vllm/tiny", "api_base": serve.base_url}}]
    gateway = LLMProxy(model_list=model_list, store=store, launch_mode="asyncio")
    await gateway.start()
    yield gateway
    await gateway.stop()


def _client(proxy: LLMProxy, rollout: AttemptedRollout) -> openai.AsyncOpenAI:
    base_url = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)  # type: ignore[call-arg]
    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)


async def _engine_answer(serve: InferenceServer, body: Dict[str, Any]) -> Dict[str, Any]:
    """Ask the server directly for token ids: the ground truth the gateway must record."""
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{serve.base_url}/chat/completions", json={**body, "model": "tiny", "return_token_ids": True}
        )
    response.raise_for_status()
    return response.json()


async def test_recorded_token_ids_equal_the_engines(
    proxy: LLMProxy, serve: InferenceServer, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    truth = await _engine_answer(serve, {"messages": MESSAGES, **GREEDY})
    client = _client(proxy, rollout)
    completion = await client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)  # type: ignore[arg-type]
    await client.close()
    [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    attrs = span.attributes
    assert attrs["prompt_token_ids"] == truth["prompt_token_ids"]
    assert attrs["response_token_ids"] == truth["choices"][0]["token_ids"]
    assert len(attrs["response_logprobs"]) == len(attrs["response_token_ids"])
    assert all(lp <= 0 for lp in attrs["response_logprobs"])
    assert attrs["gen_ai.completion.0.content"] == completion.choices[0].message.content
    assert attrs["gen_ai.usage.input_tokens"] == len(truth["prompt_token_ids"])


async def test_stream_and_non_stream_record_the_same_tokens(
    proxy: LLMProxy, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    client = _client(proxy, rollout)
    plain = await client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)  # type: ignore[arg-type]
    stream = await client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, **GREEDY)  # type: ignore[arg-type]
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    await client.close()
    first, second = await wait_for_spans(store, rollout.rollout_id, 2)
    assert text == plain.choices[0].message.content
    assert second.status.status_code == "OK"
    for key in ("prompt_token_ids", "response_token_ids", "response_logprobs", "gen_ai.completion.0.content"):
        assert second.attributes[key] == pytest.approx(first.attributes[key]), key


async def test_tool_call_turns_round_trip_through_the_sdk(
    proxy: LLMProxy, serve: InferenceServer, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    # A random model will not decide to call a tool, so the tool-call turn is in the history: the assistant's call
    # and the tool's result must reach the engine's chat template intact through the SDK and the gateway.
    messages: List[Dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    truth = await _engine_answer(serve, {"messages": messages, "tools": [WEATHER_TOOL], **GREEDY})
    client = _client(proxy, rollout)
    completion = await client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        **GREEDY,
    )
    await client.close()
    [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    attrs = span.attributes
    assert completion.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    assert attrs["prompt_token_ids"] == truth["prompt_token_ids"]
    assert attrs["response_token_ids"] == truth["choices"][0]["token_ids"]
    assert attrs["gen_ai.prompt.1.tool_calls.0.name"] == "get_weather"
    assert attrs["gen_ai.prompt.1.tool_calls.0.arguments"] == '{"city": "Paris"}'
    assert attrs["gen_ai.prompt.2.tool_call_id"] == "call_1"
    assert attrs["gen_ai.request.functions.0.name"] == "get_weather"


async def test_triplet_adapter_rebuilds_exact_token_ids(
    proxy: LLMProxy, serve: InferenceServer, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    turns = [MESSAGES, [*MESSAGES, {"role": "assistant", "content": "1 2 3"}, {"role": "user", "content": "Again."}]]
    truths = [await _engine_answer(serve, {"messages": m, **GREEDY}) for m in turns]
    client = _client(proxy, rollout)
    for messages in turns:
        await client.chat.completions.create(model="tiny", messages=messages, **GREEDY)  # type: ignore[arg-type]
    await client.close()
    await wait_for_spans(store, rollout.rollout_id, 2)
    # The agent reports its reward after the calls (with a later sequence id), as a runner's emitter would.
    sequence_id = await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id)
    reward = Span.from_attributes(
        attributes={f"{AGL_REWARD}.0.name": "primary", f"{AGL_REWARD}.0.value": 1.0},
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt.attempt_id,
        sequence_id=sequence_id,
        name=AGL_REWARD,
    )
    await store.add_span(reward)
    spans = await store.query_spans(rollout.rollout_id)
    triplets = LlmProxyTraceToTriplet().adapt(spans)
    assert [t.prompt["token_ids"] for t in triplets] == [t["prompt_token_ids"] for t in truths]
    assert [t.response["token_ids"] for t in triplets] == [t["choices"][0]["token_ids"] for t in truths]
    assert [t.reward for t in triplets] == [None, 1.0]


async def test_anthropic_messages_reach_the_engine_and_become_triplets_with_its_token_ids(
    proxy: LLMProxy, serve: InferenceServer, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    import anthropic

    base_url = f"{proxy.endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}"
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0)
    request: Dict[str, Any] = dict(ANTHROPIC_REQUEST)
    message = await client.messages.create(**request)
    async with client.messages.stream(**request) as stream:
        streamed = await stream.get_final_message()
    await client.close()
    truth = await _engine_answer(serve, {"messages": MESSAGES, **GREEDY})
    spans = await wait_for_spans(store, rollout.rollout_id, 2)
    answer = truth["choices"][0]
    assert message.content[0].text == answer["message"]["content"] == streamed.content[0].text  # type: ignore[union-attr]
    assert (
        message.stop_reason
        == streamed.stop_reason
        == {"length": "max_tokens", "stop": "end_turn"}[answer["finish_reason"]]
    )
    assert message.usage.input_tokens == len(truth["prompt_token_ids"]) == streamed.usage.input_tokens
    assert message.usage.output_tokens == len(answer["token_ids"]) == streamed.usage.output_tokens
    triplets = LlmProxyTraceToTriplet().adapt(spans)
    assert [t.prompt["token_ids"] for t in triplets] == [truth["prompt_token_ids"]] * 2
    assert [t.response["token_ids"] for t in triplets] == [answer["token_ids"]] * 2


async def test_a_messages_call_ended_by_a_stop_sequence_names_it(
    proxy: LLMProxy, serve: InferenceServer, rollout: AttemptedRollout
) -> None:
    import anthropic

    truth = await _engine_answer(serve, {"messages": MESSAGES, **GREEDY})
    text = truth["choices"][0]["message"]["content"]
    stop = text[2:4]  # met in the greedy answer: the engine stops there and names it
    base_url = f"{proxy.endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}"
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0)
    request: Dict[str, Any] = {**ANTHROPIC_REQUEST, "stop_sequences": ["\u0001never", stop]}
    message = await client.messages.create(**request)
    async with client.messages.stream(**request) as stream:
        streamed = await stream.get_final_message()
    await client.close()
    for answer in (message, streamed):
        assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", stop)
        assert answer.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
