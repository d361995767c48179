"""Adapters against the contract (§10): image content parts reach triplets and messages; agent names come from the
listed span attributes."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional

import openai
import pytest
from span_factory import SpanFactory
from support.fake_openai import FakeOpenAIServer

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, TraceToMessages
from agentbolt.adapter.triplet import TraceTree
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer
from agentbolt.types import Span

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
REMOTE = "https://example.com/cat.png"
PARTS: List[Dict[str, Any]] = [
    {"type": "text", "text": "What is in these pictures?"},
    {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
    {"type": "image_url", "image_url": {"url": REMOTE}},
]


# ---------------------------------------------------------------------------------------------------------------
# Agent names


def _node(name: str, attributes: Dict[str, Any]) -> TraceTree:
    span = SpanFactory().span(name, 0, 1, attributes=attributes)
    return TraceTree(span.span_id, span)


AGENT_NAME_CASES = [
    ("agent span", {"agent.name": "planner"}, "planner"),
    ("agentops agent kind", {"agentops.span.kind": "agent", "operation.name": "solver"}, "solver"),
    ("agentops other kind", {"agentops.span.kind": "tool", "operation.name": "search"}, None),
    ("autogen recipient", {"recipient_agent_type": "coder"}, "coder"),
    ("langchain chain type", {"langchain.chain.type": "router"}, "router"),
    ("agent framework executor", {"executor.id": "exec-1"}, "exec-1"),
    ("operation of type agent", {"type": "agent", "agentlightning.operation.input.name": "critic"}, "critic"),
    ("operation not of type agent", {"agentlightning.operation.input.name": "critic"}, None),
    ("precedence", {"agent.name": "first", "recipient_agent_type": "second", "executor.id": "third"}, "first"),
    ("plain span", {"gen_ai.system": "openai"}, None),
]


@pytest.mark.parametrize(("label", "attributes", "expected"), AGENT_NAME_CASES, ids=[c[0] for c in AGENT_NAME_CASES])
def test_agent_name_comes_from_the_listed_attributes(label: str, attributes: Dict[str, Any], expected: Any) -> None:
    assert _node("some span", attributes).agent_name() == expected


def test_langchain_chain_spans_are_named_by_their_lc_name_attribute() -> None:
    assert _node("langchain.Chain.RunnableSequence", {"lc_name": "planner_chain"}).agent_name() == "planner_chain"
    assert _node("langchain.Chain.RunnableSequence", {}).agent_name() == "RunnableSequence"  # no attribute
    assert _node("langchain.Chain.", {}).agent_name() is None
    assert _node("RunnableSequence", {"lc_name": "not a chain span"}).agent_name() is None


def test_agent_match_selects_calls_under_a_langchain_chain_by_lc_name() -> None:
    f = SpanFactory()
    root = f.span("rollout", 0, 10)
    planner = f.span("langchain.Chain.RunnableSequence", 1, 4, parent=root, attributes={"lc_name": "planner"})
    p1 = f.llm_call(2, 3, parent=planner, response_id="p1", prompt_token_ids=[1], response_token_ids=[2])
    worker = f.span("langchain.Chain.RunnableSequence", 5, 9, parent=root, attributes={"lc_name": "worker"})
    w1 = f.llm_call(6, 7, parent=worker, response_id="w1", prompt_token_ids=[3], response_token_ids=[4])
    triplets = TracerTraceToTriplet(agent_match="^planner$")([root, planner, p1, worker, w1])
    assert [(t.metadata["response_id"], t.metadata["agent_name"]) for t in triplets] == [("p1", "planner")]


# ---------------------------------------------------------------------------------------------------------------
# Image content parts


def _assert_messages_keep_parts(spans: List[Span]) -> None:
    (conversation,) = TraceToMessages()(spans)
    user = next(m for m in conversation["messages"] if m["role"] == "user")
    assert user["content"] == PARTS


def _flattened_parts_call(f: SpanFactory, *, name: str = "openai.chat.completion") -> Span:
    """A call recorded by an instrumentation that flattens content parts into numbered attributes."""
    attributes: Dict[str, Any] = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content.0.type": "text",
        "gen_ai.prompt.0.content.0.text": PARTS[0]["text"],
        "gen_ai.prompt.0.content.1.type": "image_url",
        "gen_ai.prompt.0.content.1.image_url.url": PNG,
        "gen_ai.prompt.0.content.1.image_url.detail": "low",
        "gen_ai.prompt.0.content.2.type": "image_url",
        "gen_ai.prompt.0.content.2.image_url.url": REMOTE,
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "A pixel and a cat.",
        "gen_ai.response.id": "flat-1",
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [4, 5],
    }
    return f.span(name, 0, 1, attributes=attributes)


def test_flattened_content_parts_reach_triplets_and_messages() -> None:
    span = _flattened_parts_call(SpanFactory())
    (triplet,) = TracerTraceToTriplet()([span])
    assert triplet.prompt["image_urls"] == [PNG, REMOTE]
    assert triplet.prompt["raw_content"][0]["content"] == PARTS
    _assert_messages_keep_parts([span])


@pytest.mark.parametrize("encode", [json.dumps, repr], ids=["json", "python-repr"])
def test_content_parts_recorded_as_one_string_reach_triplets_and_messages(encode: Any) -> None:
    f = SpanFactory()
    span = f.llm_call(0, 1, response_id="s-1", prompt_token_ids=[1], response_token_ids=[2])
    span.attributes["gen_ai.prompt.1.content"] = encode(PARTS)
    (triplet,) = TracerTraceToTriplet()([span])
    assert triplet.prompt["image_urls"] == [PNG, REMOTE]
    (conversation,) = TraceToMessages()([span])
    assert conversation["messages"][1] == {"role": "user", "content": PARTS}


def test_image_url_given_as_a_bare_string_is_read() -> None:
    prompt = [{"role": "user", "content": [{"type": "image_url", "image_url": PNG}]}]
    assert TraceTree.extract_prompt_image_urls(prompt) == [PNG]


def test_gateway_triplets_carry_the_prompt_images_when_there_are_any() -> None:
    f = SpanFactory()
    with_images = _flattened_parts_call(f, name="agentbolt.llm_call")
    text_only = f.gateway_call(2, 3, response_id="text", prompt_token_ids=[7], response_token_ids=[8])
    triplets = LlmProxyTraceToTriplet()([with_images, text_only])
    assert [t.prompt for t in triplets] == [
        {"token_ids": [1, 2, 3], "image_urls": [PNG, REMOTE]},
        {"token_ids": [7]},
    ]
    _assert_messages_keep_parts([with_images])


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        running.config.token_ids = True
        yield running


async def _traced_image_call(server: FakeOpenAIServer, stream: bool) -> List[Span]:
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "describe"})
    tracer = AgentOpsTracer()
    with tracer.lifespan(store):
        async with tracer.trace_context(
            "describe", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
        ):
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
            result: Optional[Any] = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": PARTS}], stream=stream
            )
            if stream:
                async for _ in result:  # type: ignore[union-attr]
                    pass
    return list(await store.query_spans(rollout.rollout_id))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_openai_sdk_calls_with_images_reach_triplets_and_messages(server: FakeOpenAIServer, stream: bool) -> None:
    spans = await _traced_image_call(server, stream)
    (triplet,) = TracerTraceToTriplet()(spans)
    assert triplet.prompt["image_urls"] == [PNG, REMOTE]
    assert triplet.prompt["token_ids"] and triplet.response["token_ids"]
    _assert_messages_keep_parts(spans)
