"""One LLM call gives one sample, whichever recorders saw it (gateway, SDK instrumentation, framework callbacks)."""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Set

import pytest
from span_factory import SpanFactory

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, TraceToMessages
from agentbolt.adapter.calls import CallIdentities, call_identity
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


def test_two_framework_calls_with_the_same_time_range_give_two_conversations() -> None:
    # Two LangChain calls made in parallel, recorded with identical start and end times and no response id.
    f = SpanFactory()
    first = f.llm_call(0, 2, response_id=None, name="langchain.llm.ChatOpenAI", prompt="first question")
    second = f.llm_call(0, 2, response_id=None, name="langchain.llm.ChatOpenAI", prompt="second question")
    conversations = TraceToMessages()([first, second])
    assert [c["messages"][1]["content"] for c in conversations] == ["first question", "second question"]


def test_two_sdk_calls_with_the_same_time_range_and_prompt_but_other_response_ids_give_two_conversations() -> None:
    f = SpanFactory()
    first = f.llm_call(0, 2, response_id="r1", prompt="same question", answer="one")
    second = f.llm_call(0, 2, response_id="r2", prompt="same question", answer="two")
    conversations = TraceToMessages()([first, second])
    assert [c["messages"][-1]["content"] for c in conversations] == ["one", "two"]


def test_one_call_recorded_by_a_framework_and_the_sdk_with_the_same_time_range_gives_one_conversation() -> None:
    f = SpanFactory()
    framework = f.llm_call(0, 2, response_id=None, name="langchain.llm.ChatOpenAI", prompt="one question")
    sdk = _with_call_id(f.llm_call(0, 2, response_id="r1", prompt="one question", prompt_token_ids=[1]), "c1")
    (conversation,) = TraceToMessages()([framework, sdk])
    assert conversation["messages"][1]["content"] == "one question"


def test_a_framework_record_writing_the_request_otherwise_than_the_sdk_is_still_the_same_call() -> None:
    # LangChain's handler writes a call's messages its own way (content parts, tool calls, system prompt placement),
    # so a framework record is not told apart from a gateway or SDK record by its request.
    f = SpanFactory()
    framework = f.llm_call(0, 2, response_id=None, name="langchain.llm.ChatOpenAI", prompt="[{'type': 'text'}]")
    sdk = _with_call_id(f.llm_call(0.5, 1.5, response_id="r1", prompt="one question", prompt_token_ids=[1]), "c1")
    (conversation,) = TraceToMessages()([framework, sdk])
    assert conversation["messages"][1]["content"] == "one question"


def test_one_call_recorded_by_two_framework_callbacks_with_the_same_time_range_gives_one_conversation() -> None:
    f = SpanFactory()
    outer = f.llm_call(0, 2, response_id=None, name="langchain.llm.Wrapper", prompt="one question")
    inner = f.llm_call(0, 2, response_id=None, name="langchain.llm.ChatOpenAI", prompt="one question")
    assert len(TraceToMessages()([outer, inner])) == 1


def _kept_records_pairwise_reference(records: List[Span]) -> List[int]:
    """The positions of the records :class:`TraceToMessages` keeps, by its rule read literally, comparing each
    framework record with every record kept before it: records by rank (the gateway's, then other records carrying a
    call id or token ids, then framework records; recorded order within a rank), a framework record that encloses in
    time a record kept so far is dropped unless both carry response ids that differ or both are framework records
    carrying prompts that differ, the others are kept when their call is new."""

    def encloses(outer: Span, inner: Span) -> bool:
        times = (outer.start_time, outer.end_time, inner.start_time, inner.end_time)
        if any(t is None or t != t for t in times):  # unknown or NaN
            return False
        return outer.start_time <= inner.start_time and inner.end_time <= outer.end_time  # type: ignore[operator]

    def told_apart(first: Span, second: Span) -> bool:
        keys = ["gen_ai.response.id"]
        if rank(first) == rank(second) == 2:
            keys.append("gen_ai.prompt.0.content")
        for key in keys:
            one, other = first.attributes.get(key), second.attributes.get(key)
            if one is not None and other is not None and one != other:
                return True
        return False

    def rank(span: Span) -> int:
        if span.name == "agentbolt.llm_call":
            return 0
        if CALL_ID in span.attributes or "prompt_token_ids" in span.attributes:
            return 1
        return 2

    identities = CallIdentities()
    kept: Set[int] = set()
    for position in sorted(range(len(records)), key=lambda i: rank(records[i])):
        record = records[position]
        if rank(record) == 2 and any(
            encloses(record, records[other]) and not told_apart(record, records[other]) for other in kept
        ):
            continue
        if identities.claim(*call_identity(record.attributes)):
            kept.add(position)
    return sorted(kept)


def _random_time(rng: random.Random) -> Optional[float]:
    """A time on a coarse grid (so that ranges often coincide or nest), sometimes unknown or not a number."""
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.08:
        return float("nan")
    return float(rng.randint(0, 5))


def _random_records(rng: random.Random) -> List[Span]:
    """Records of a few calls by the gateway, the SDK instrumentation and framework callbacks, each with its own
    answer, with ids and prompts (sometimes none) drawn from small pools so that they often name the same call."""
    spans: List[Span] = []
    for position in range(rng.randint(1, 9)):
        attributes: Dict[str, Any] = {
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": f"record {position}",
        }
        prompt = rng.choice([None, "question a", "question b"])
        if prompt is not None:
            attributes.update({"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": prompt})
        call_id = rng.choice([None, None, "c1", "c2"])
        if call_id is not None:
            attributes[CALL_ID] = call_id
        response_id = rng.choice([None, "r1", "r2", "r3"])
        if response_id is not None:
            attributes["gen_ai.response.id"] = response_id
        if rng.random() < 0.2:
            attributes["prompt_token_ids"] = [1, 2]
        name = rng.choice(["agentbolt.llm_call", "openai.chat.completion", "langchain.llm.ChatOpenAI"])
        spans.append(
            Span.from_attributes(
                attributes=attributes,
                rollout_id="ro-test",
                attempt_id="at-test",
                sequence_id=position + 1,
                name=name,
                trace_id="1" * 32,
                span_id=f"{position + 1:016x}",
                parent_id=None,
                start_time=_random_time(rng),
                end_time=_random_time(rng),
            )
        )
    return spans


def test_messages_keep_the_records_the_pairwise_enclosure_rule_keeps() -> None:
    rng = random.Random(20240611)
    for trace in range(3000):
        records = _random_records(rng)
        expected = [f"record {position}" for position in _kept_records_pairwise_reference(records)]
        kept = [conversation["messages"][-1]["content"] for conversation in TraceToMessages()(records)]
        assert kept == expected, f"trace {trace}: {[(s.name, s.start_time, s.end_time) for s in records]}"
