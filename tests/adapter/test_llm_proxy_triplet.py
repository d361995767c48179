"""LlmProxyTraceToTriplet: token-exact triplets from LLM gateway spans."""

from __future__ import annotations

import random

from span_factory import SpanFactory

from agentbolt.adapter import LlmProxyTraceToTriplet
from agentbolt.semconv import AGL_LLM_CALL, LLM_AGENT_NAME, PROMPT_TOKEN_IDS, RESPONSE_LOGPROBS, RESPONSE_TOKEN_IDS


def test_gateway_spans_give_token_ids_logprobs_and_rewards_in_sequence_order() -> None:
    f = SpanFactory()
    g1 = f.gateway_call(
        1, 2, response_id="g1", prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5], logprobs=[-0.5, -1.0]
    )
    g2 = f.gateway_call(3, 4, response_id="g2", prompt_token_ids=[1, 2, 3, 4, 5, 6], response_token_ids=[7])
    reward = f.reward(0.8, 5)
    spans = [g1, g2, reward]
    random.Random(0).shuffle(spans)

    triplets = LlmProxyTraceToTriplet()(spans)

    assert [t.metadata["response_id"] for t in triplets] == ["g1", "g2"]
    assert triplets[0].prompt == {"token_ids": [1, 2, 3]}
    assert triplets[0].response == {"token_ids": [4, 5], "logprobs": [-0.5, -1.0]}
    assert triplets[1].response == {"token_ids": [7]}
    assert [t.reward for t in triplets] == [None, 0.8]
    assert {t.metadata["agent_name"] for t in triplets} == {""}


def test_logprobs_read_back_from_a_store_keep_their_non_finite_values() -> None:
    """Stored JSON holds -inf as the string "-Infinity"; the triplet gets the float back."""
    span = SpanFactory().gateway_call(
        0, 1, response_id="x", prompt_token_ids=[1], response_token_ids=[2, 3], logprobs=[-0.25, "-Infinity"]
    )
    (triplet,) = LlmProxyTraceToTriplet()([span])
    assert triplet.response == {"token_ids": [2, 3], "logprobs": [-0.25, float("-inf")]}
    bad = SpanFactory().gateway_call(
        0, 1, response_id="y", prompt_token_ids=[1], response_token_ids=[2], logprobs=["x"]
    )
    assert "logprobs" not in LlmProxyTraceToTriplet()([bad])[0].response


def test_span_keys_are_the_shared_semconv_constants() -> None:
    span = SpanFactory().gateway_call(
        0, 1, response_id="x", prompt_token_ids=[1], response_token_ids=[2], logprobs=[-1.0], agent_name="a"
    )
    assert span.name == AGL_LLM_CALL
    assert {PROMPT_TOKEN_IDS, RESPONSE_TOKEN_IDS, RESPONSE_LOGPROBS, LLM_AGENT_NAME} <= set(span.attributes)


def test_duplicates_and_calls_without_token_ids_are_dropped() -> None:
    f = SpanFactory()
    g1 = f.gateway_call(1, 2, response_id="dup", prompt_token_ids=[1], response_token_ids=[2])
    g1_again = f.gateway_call(1, 2, response_id="dup", prompt_token_ids=[1], response_token_ids=[2])
    no_ids = f.gateway_call(3, 4, response_id="no-ids", prompt_token_ids=None, response_token_ids=[3])
    assert [t.metadata["response_id"] for t in LlmProxyTraceToTriplet()([g1, g1_again, no_ids])] == ["dup"]
    assert LlmProxyTraceToTriplet()([]) == []


def test_each_reward_goes_to_the_latest_earlier_call_without_one() -> None:
    f = SpanFactory()
    early = f.reward(9.0, 0)
    g1 = f.gateway_call(1, 2, response_id="g1", prompt_token_ids=[1], response_token_ids=[2])
    g2 = f.gateway_call(3, 4, response_id="g2", prompt_token_ids=[1], response_token_ids=[2])
    r1 = f.reward(0.1, 5)
    r2 = f.reward(0.2, 6)
    triplets = LlmProxyTraceToTriplet()([early, g1, g2, r1, r2])
    assert [t.reward for t in triplets] == [0.2, 0.1]


def test_reference_litellm_layouts() -> None:
    f = SpanFactory()
    raw = f.span(
        "raw_gen_ai_request",
        1,
        2,
        attributes={
            "llm.hosted_vllm.id": "chatcmpl-1",
            "llm.hosted_vllm.prompt_token_ids": "[1, 2, 3]",
            "llm.hosted_vllm.response_token_ids": "[[4, 5]]",
        },
    )
    raw_choices = f.span(
        "raw_gen_ai_request",
        3,
        4,
        attributes={
            "llm.hosted_vllm.id": "chatcmpl-2",
            "llm.hosted_vllm.prompt_token_ids": [6],
            "llm.hosted_vllm.choices": "[{'index': 0, 'token_ids': [7, 8]}]",
        },
    )
    litellm = f.span(
        "litellm_request",
        5,
        6,
        attributes={"gen_ai.response.id": "chatcmpl-3", "prompt_token_ids": [9], "response_token_ids": [10]},
    )
    other = f.span("openai.chat.completion", 7, 8, attributes={"prompt_token_ids": [1], "response_token_ids": [2]})
    reward = f.reward(1.0, 9)
    triplets = LlmProxyTraceToTriplet()([raw, raw_choices, litellm, other, reward])
    assert [(t.metadata["response_id"], t.prompt["token_ids"], t.response["token_ids"]) for t in triplets] == [
        ("chatcmpl-1", [1, 2, 3], [4, 5]),
        ("chatcmpl-2", [6], [7, 8]),
        ("chatcmpl-3", [9], [10]),
    ]
    assert triplets[-1].reward == 1.0


def test_agent_match_by_agent_name_attribute() -> None:
    f = SpanFactory()
    spans = [
        f.gateway_call(1, 2, response_id="p1", prompt_token_ids=[1], response_token_ids=[2], agent_name="planner"),
        f.gateway_call(3, 4, response_id="e1", prompt_token_ids=[3], response_token_ids=[4], agent_name="executor"),
        f.gateway_call(5, 6, response_id="p2", prompt_token_ids=[5], response_token_ids=[6], agent_name="planner"),
        f.gateway_call(7, 8, response_id="e2", prompt_token_ids=[7], response_token_ids=[8], agent_name="executor"),
        f.reward(1.0, 9),
    ]
    planner = LlmProxyTraceToTriplet(agent_match="planner")(spans)
    assert [(t.metadata["response_id"], t.metadata["agent_name"], t.reward) for t in planner] == [
        ("p1", "planner", None),
        ("p2", "planner", 1.0),
    ]
    assert len(LlmProxyTraceToTriplet()(spans)) == 4


def test_agent_match_by_enclosing_tracer_agent_span() -> None:
    """Multi-agent rollout: gateway spans have no parent (recorded by another process); the agent is the tracer's
    agent span that encloses them in time, the innermost one when agents nest."""
    f = SpanFactory()
    root = f.span("rollout", 0, 30)
    planner = f.agent("planner", 1, 29, parent=root)
    executor = f.agent("executor", 10, 20, parent=planner)
    p1 = f.gateway_call(2, 3, response_id="p1", prompt_token_ids=[1], response_token_ids=[2])
    e1 = f.gateway_call(11, 12, response_id="e1", prompt_token_ids=[3], response_token_ids=[4])
    labelled = f.gateway_call(
        13, 14, response_id="x1", prompt_token_ids=[5], response_token_ids=[6], agent_name="planner"
    )
    p2 = f.gateway_call(21, 22, response_id="p2", prompt_token_ids=[7], response_token_ids=[8])
    reward = f.reward(0.5, 28, parent=planner)
    spans = [root, planner, executor, p1, e1, labelled, p2, reward]

    planner_calls = LlmProxyTraceToTriplet(agent_match=r"^planner$")(spans)
    assert [(t.metadata["response_id"], t.reward) for t in planner_calls] == [("p1", None), ("x1", None), ("p2", 0.5)]
    executor_calls = LlmProxyTraceToTriplet(agent_match="executor")(spans)
    assert [t.metadata["response_id"] for t in executor_calls] == ["e1"]
    everything = LlmProxyTraceToTriplet()(spans)
    assert [(t.metadata["response_id"], t.metadata["agent_name"]) for t in everything] == [
        ("p1", "planner"),
        ("e1", "executor"),
        ("x1", "planner"),
        ("p2", "planner"),
    ]
