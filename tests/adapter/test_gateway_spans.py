"""The adapters read the spans the LLM gateway actually builds (shared span format, both sides real code)."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

from span_factory import SpanFactory

from agentbolt.adapter import LlmProxyTraceToTriplet, TraceToMessages
from agentbolt.gateway.recording import CallRecord, build_span

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _record(request: Dict[str, Any], agent: str, start: float, end: float) -> CallRecord:
    call = CallRecord(
        rollout_id="ro-gw", attempt_id="at-gw", sequence_id=None, endpoint="chat/completions", request=request,
        start_time=start, agent_name=agent,
    )  # fmt: skip
    call.end_time = end
    call.status_code = 200
    return call


def _sse(chunks: List[Dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def test_gateway_spans_become_triplets_and_conversations() -> None:
    now = time.time()
    planner_call = _record(
        {"model": "policy", "messages": [{"role": "user", "content": "Plan a trip"}], "tools": [WEATHER_TOOL]},
        "planner",
        now,
        now + 1,
    )
    planner_call.response = {
        "id": "chatcmpl-plan",
        "model": "policy",
        "prompt_token_ids": [11, 12, 13],
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "token_ids": [21, 22],
                "logprobs": {"content": [{"token": "a", "logprob": -0.25}, {"token": "b", "logprob": -0.5}]},
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
            }
        ],
    }
    executor_call = _record(
        {"model": "policy", "messages": [{"role": "user", "content": "Go"}], "stream": True},
        "executor",
        now + 2,
        now + 3,
    )
    executor_call.stream_body = _sse(
        [
            {"id": "chatcmpl-exec", "model": "policy", "prompt_token_ids": [31],
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Do"}, "token_ids": [41],
                          "logprobs": {"content": [{"token": "Do", "logprob": -0.1}]}}]},
            {"id": "chatcmpl-exec", "choices": [{"index": 0, "delta": {"content": "ne"}, "token_ids": [42],
                                                  "logprobs": {"content": [{"token": "ne", "logprob": -0.2}]},
                                                  "finish_reason": "stop"}]},
        ]
    )  # fmt: skip
    spans = [build_span(planner_call, sequence_id=1), build_span(executor_call, sequence_id=2)]
    reward = SpanFactory(rollout_id="ro-gw", attempt_id="at-gw").reward(1.0, 0, sequence_id=3)
    reward.start_time = reward.end_time = now + 4
    spans.append(reward)

    triplets = LlmProxyTraceToTriplet()(spans)
    assert [(t.metadata["response_id"], t.metadata["agent_name"]) for t in triplets] == [
        ("chatcmpl-plan", "planner"),
        ("chatcmpl-exec", "executor"),
    ]
    assert triplets[0].prompt == {"token_ids": [11, 12, 13]}
    assert triplets[0].response == {"token_ids": [21, 22], "logprobs": [-0.25, -0.5]}
    assert triplets[1].prompt == {"token_ids": [31]}
    assert triplets[1].response == {"token_ids": [41, 42], "logprobs": [-0.1, -0.2]}
    assert [t.reward for t in triplets] == [None, 1.0]

    planner_only = LlmProxyTraceToTriplet(agent_match="planner")(spans)
    assert [(t.metadata["response_id"], t.reward) for t in planner_only] == [("chatcmpl-plan", 1.0)]

    conversations = TraceToMessages()(spans)
    assert conversations[0] == {
        "messages": [
            {"role": "user", "content": "Plan a trip"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
        ],
        "tools": [WEATHER_TOOL],
    }
    assert conversations[1]["messages"][-1] == {"role": "assistant", "content": "Done"}


def _answered_call(response_id: str, start: float) -> CallRecord:
    call = _record({"model": "policy", "messages": [{"role": "user", "content": "Hi"}]}, "solver", start, start + 1)
    call.response = {
        "id": response_id,
        "model": "policy",
        "prompt_token_ids": [1, 2],
        "choices": [
            {"index": 0, "finish_reason": "stop", "token_ids": [3], "message": {"role": "assistant", "content": "x"}}
        ],
    }
    return call


def test_a_reward_sharing_its_calls_sequence_id_goes_to_the_call_that_started_before_it() -> None:
    # A tracer counting sequence ids on its own (the contract allows a local counter) can give a reward span the id
    # the gateway gave a call: start times order them.
    now = time.time()
    first = build_span(_answered_call("chatcmpl-1", now), sequence_id=1)
    second = build_span(_answered_call("chatcmpl-2", now + 2), sequence_id=2)
    reward = SpanFactory(rollout_id="ro-gw", attempt_id="at-gw").reward(1.0, 0, sequence_id=2)
    reward.start_time = reward.end_time = now + 4

    triplets = LlmProxyTraceToTriplet()([reward, second, first])
    assert [(t.metadata["response_id"], t.reward) for t in triplets] == [("chatcmpl-1", None), ("chatcmpl-2", 1.0)]

    reward.start_time = reward.end_time = now + 1.5  # before the second call, at its sequence id
    triplets = LlmProxyTraceToTriplet()([reward, second, first])
    assert [(t.metadata["response_id"], t.reward) for t in triplets] == [("chatcmpl-1", 1.0), ("chatcmpl-2", None)]
