"""One LLM call gives one sample, whichever recorders saw it (gateway, SDK instrumentation, framework callbacks)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
from span_factory import SpanFactory

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, TraceToMessages
from agentbolt.adapter.calls import CallIdentities
from agentbolt.types import Span

CALL_ID = "agentbolt.llm.call_id"


def _with_call_id(span: Span, call_id: str) -> Span:
    return span.model_copy(update={"attributes": {**span.attributes, CALL_ID: call_id}})


@pytest.mark.parametrize(
    ("first", "second", "same_call"),
    [
        (("c1", "r1"), ("c1", "r1"), True),  # the gateway's and the SDK's record
        (("c1", "r1"), ("c1", None), True),  # the SDK saw the headers but no body
        (("c1", "r1"), (None, "r1"), True),  # a framework callback knows only the response id
        ((None, "r1"), ("c1", "r1"), True),
        ((None, "r1"), (None, "r1"), True),  # records without call ids: the response id decides
        (("c1", "r1"), ("c2", "r1"), False),  # a backend that repeats response ids: two calls
        (("c1", None), ("c2", None), False),
        ((None, "r1"), (None, "r2"), False),
        ((None, None), (None, None), False),  # no identity at all: never merged
    ],
)
def test_the_same_call_rule(
    first: tuple[Optional[str], Optional[str]], second: tuple[Optional[str], Optional[str]], same_call: bool
) -> None:
    identities = CallIdentities()
    assert identities.claim(*first)
    assert identities.claim(*second) is not same_call


def test_plain_response_id_sets_keep_their_meaning() -> None:
    taken = {"r1"}
    identities = CallIdentities(taken)
    assert not identities.claim(None, "r1") and not identities.claim("c9", "r1")
    assert identities.claim(None, "r2") and "r2" in taken


def _recorded_twice(f: SpanFactory, call_id: str, response_id: str, start: float) -> List[Span]:
    """One call as the SDK instrumentation (inside the agent's trace) and the gateway (own trace) record it."""
    ids: Dict[str, Any] = {"prompt_token_ids": [1, 2], "response_token_ids": [3]}
    sdk = _with_call_id(f.llm_call(start, start + 1, response_id=response_id, **ids), call_id)
    gateway = _with_call_id(f.gateway_call(start + 0.1, start + 0.9, response_id=response_id, **ids), call_id)
    return [sdk, gateway]


def test_gateway_and_sdk_records_give_one_sample_each_call_even_with_repeated_response_ids() -> None:
    f = SpanFactory()
    spans = [
        *_recorded_twice(f, "call-a", "chatcmpl-1", 0),
        *_recorded_twice(f, "call-b", "chatcmpl-1", 2),  # the backend gave both calls the same response id
        f.reward(1.0, 4),
    ]
    assert len(TraceToMessages()(spans)) == 2
    proxy_triplets = LlmProxyTraceToTriplet()(spans)
    assert [t.reward for t in proxy_triplets] == [None, 1.0]
    both = TracerTraceToTriplet(llm_call_match=r"openai\.chat\.completion|agentbolt\.llm_call")(spans)
    assert len(both) == 2 and [t.reward for t in both] == [None, 1.0]
    assert len(TracerTraceToTriplet()(spans)) == 2


def test_messages_take_the_gateway_record_then_the_sdk_record_then_the_framework_record() -> None:
    f = SpanFactory()
    framework = f.llm_call(0, 3, response_id="r1", name="langchain.llm.ChatOpenAI", prompt="from the framework")
    sdk = _with_call_id(f.llm_call(0.5, 2.5, response_id="r1", prompt="from the sdk"), "c1")
    gateway = _with_call_id(f.gateway_call(1, 2, response_id="r1", prompt_token_ids=[1], response_token_ids=[2]), "c1")
    assert TraceToMessages()([framework, sdk, gateway])[0]["messages"][0] == {"role": "user", "content": "hi"}
    assert TraceToMessages()([framework, sdk])[0]["messages"][1] == {"role": "user", "content": "from the sdk"}
    (only,) = TraceToMessages()([framework])
    assert only["messages"][1] == {"role": "user", "content": "from the framework"}


def test_a_framework_record_without_ids_around_an_sdk_record_is_the_same_call() -> None:
    # LangChain learns no response id when it streams: its record is paired with the SDK record it encloses.
    f = SpanFactory()
    framework = f.llm_call(0, 3, response_id=None, name="langchain.llm.ChatOpenAI", prompt="same call")
    sdk = _with_call_id(f.llm_call(1, 2, response_id="r1", prompt="same call"), "c1")
    later = f.llm_call(4, 5, response_id=None, name="langchain.llm.ChatAnthropic", prompt="another call")
    conversations = TraceToMessages()([framework, sdk, later])
    assert [c["messages"][1]["content"] for c in conversations] == ["same call", "another call"]
