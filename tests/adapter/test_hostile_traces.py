"""Messy and hostile traces: each gives correct triplets, skips a bad call with a logged reason, or fails clearly."""

from __future__ import annotations

import logging
import random
import sys
from typing import Dict, List, Optional, Tuple

import pytest
from span_factory import SpanFactory

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, TraceToMessages
from agentbolt.adapter.base import TraceToTripletBase
from agentbolt.adapter.triplet import RewardMatchPolicy, TraceTree, triplet_token_ids
from agentbolt.types import Span


def _tokens(triplets: list) -> List[Tuple[List[int], List[int], Optional[float]]]:
    return [(t.prompt["token_ids"], t.response["token_ids"], t.reward) for t in triplets]


def _reward_span(factory: SpanFactory, value: object, at: float, **kwargs: object) -> Span:
    return factory.span(
        "agentlightning.annotation",
        at,
        at,
        attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value},
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_reward_that_is_not_a_number_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    f = SpanFactory()
    agent = f.agent("solver", 0, 10)
    call = f.llm_call(1, 2, response_id="r1", prompt_token_ids=[1, 2], response_token_ids=[3], parent=agent)
    gateway = f.gateway_call(1, 2, response_id="r1", prompt_token_ids=[1, 2], response_token_ids=[3])
    bad = _reward_span(f, "not a number", 3, parent=agent)
    good = f.reward(0.5, 4, parent=agent)
    spans = [agent, call, gateway, bad, good]

    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.triplet"):
        assert _tokens(TracerTraceToTriplet()(spans)) == [([1, 2], [3], 0.5)]
        assert _tokens(LlmProxyTraceToTriplet()(spans)) == [([1, 2], [3], 0.5)]
    assert any("malformed reward" in r.getMessage() and bad.span_id in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "adapter",
    [
        TracerTraceToTriplet(),
        TracerTraceToTriplet(reward_match=RewardMatchPolicy.FIRST_SIBLING),
        TracerTraceToTriplet(exclude_llm_call_in_reward=False),
        LlmProxyTraceToTriplet(),
    ],
    ids=["tracer", "tracer-first-sibling", "tracer-calls-in-rewards-kept", "llm-proxy"],
)
def test_each_malformed_reward_is_reported_once_per_adaptation(
    adapter: TraceToTripletBase, caplog: pytest.LogCaptureFixture
) -> None:
    f = SpanFactory()
    agent = f.agent("solver", 0, 10)
    call = f.llm_call(1, 2, response_id="r1", prompt_token_ids=[1, 2], response_token_ids=[3], parent=agent)
    gateway = f.gateway_call(1, 2, response_id="r1", prompt_token_ids=[1, 2], response_token_ids=[3])
    bad = [_reward_span(f, "not a number", 3, parent=agent), _reward_span(f, [1, 2], 4, parent=agent)]
    spans = [agent, call, gateway, *bad]

    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.triplet"):
        assert _tokens(adapter(spans)) == [([1, 2], [3], None)]
    reported = [r.getMessage() for r in caplog.records if "malformed reward" in r.getMessage()]
    assert len(reported) == 2
    assert [sum(span.span_id in message for message in reported) for span in bad] == [1, 1]


@pytest.mark.parametrize("bad_ids", [[-1, 5], [1, "2"], [1.0, 2.0], [True, 2], "[1, 2", "[[[[", "not ids"])
def test_token_ids_that_are_not_token_ids_are_never_trained_on(
    bad_ids: object, caplog: pytest.LogCaptureFixture
) -> None:
    f = SpanFactory()
    agent = f.agent("solver", 0, 10)
    call = f.llm_call(1, 2, response_id="r1", prompt_token_ids=bad_ids, response_token_ids=[3], parent=agent)  # type: ignore[arg-type]
    gateway = f.gateway_call(1, 2, response_id="r1", prompt_token_ids=bad_ids, response_token_ids=[3])  # type: ignore[arg-type]
    ok = f.gateway_call(3, 4, response_id="r2", prompt_token_ids=[7], response_token_ids=[8])

    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.triplet"):
        traced = TracerTraceToTriplet()([agent, call])
        proxied = LlmProxyTraceToTriplet()([agent, gateway, ok])
    assert _tokens(traced) == [([], [3], None)]  # no prompt to train on: the trainer counts it as missing tokens
    assert _tokens(proxied) == [([7], [8], None)]
    messages = [r.getMessage() for r in caplog.records]
    assert any(call.span_id in m and "prompt_token_ids" in m for m in messages)
    assert any(gateway.span_id in m and "prompt_token_ids" in m for m in messages)
    assert any("1 LLM call(s) of rollout ro-test were skipped" in m for m in messages)


def test_triplets_with_negative_token_ids_give_no_token_ids() -> None:
    assert triplet_token_ids({"token_ids": [3, -1]}) == []
    assert triplet_token_ids({"token_ids": [3, 0, 151_000]}) == [3, 0, 151_000]


def test_gateway_calls_without_a_response_are_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    f = SpanFactory()
    errored = f.gateway_call(0, 1, response_id="r1", prompt_token_ids=[1, 2], response_token_ids=None)
    answered = f.gateway_call(2, 3, response_id="r2", prompt_token_ids=[1, 2], response_token_ids=[5, 6])
    cut_off = f.gateway_call(4, 5, response_id="r3", prompt_token_ids=None, response_token_ids=None)
    reward = f.reward(1.0, 6)
    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.triplet"):
        triplets = LlmProxyTraceToTriplet()([errored, answered, cut_off, reward])
    assert _tokens(triplets) == [([1, 2], [5, 6], 1.0)]
    assert any("2 LLM call(s) of rollout ro-test were skipped" in r.getMessage() for r in caplog.records)


def test_a_call_that_ends_before_it_starts_stays_where_it_was_recorded() -> None:
    f = SpanFactory()
    agent = f.agent("solver", 0, 10)
    call = f.llm_call(5, 1, response_id="r1", prompt_token_ids=[1], response_token_ids=[2], parent=agent)
    reward = f.reward(1.0, 3, parent=agent)
    spans = [agent, call, reward]

    tree = TraceTree.from_spans(spans)
    tree.repair_hierarchy()
    assert tree.names_tuple() == (
        "invoke_agent solver [agent]",
        [("openai.chat.completion", []), ("agentlightning.annotation", [])],
    )
    assert _tokens(TracerTraceToTriplet()(spans)) == [([1], [2], 1.0)]


def test_deeply_nested_spans_do_not_hit_the_recursion_limit() -> None:
    depth = sys.getrecursionlimit() * 3
    f = SpanFactory()
    spans: List[Span] = []
    parent: Optional[Span] = None
    for level in range(depth):
        parent = f.agent(f"level{level}", level * 1e-3, 100 - level * 1e-3, parent=parent)
        spans.append(parent)
    spans.append(f.llm_call(50, 51, response_id="r1", prompt_token_ids=[1], response_token_ids=[2], parent=parent))
    spans.append(f.gateway_call(50.1, 50.9, response_id="r1", prompt_token_ids=[1], response_token_ids=[2]))
    spans.append(f.reward(1.0, 52, parent=parent))

    triplets = TracerTraceToTriplet(agent_match=f"level{depth - 1}$")(spans)
    assert [(t.metadata["agent_name"], t.reward) for t in triplets] == [(f"level{depth - 1}", 1.0)]
    proxied = LlmProxyTraceToTriplet(agent_match=f"level{depth - 1}$")(spans)
    assert [(t.metadata["agent_name"], t.reward) for t in proxied] == [(f"level{depth - 1}", 1.0)]


def test_a_call_recorded_by_gateway_and_sdk_in_a_long_rollout_gives_one_triplet_each() -> None:
    f = SpanFactory()
    calls = 1500
    agent = f.agent("solver", 0, 10 * calls + 10)
    spans: List[Span] = [agent]
    for i in range(calls):
        ids = ([i, i + 1], [i + 2])
        spans.append(f.llm_call(10 * i + 1, 10 * i + 3, response_id=f"r{i}", prompt_token_ids=ids[0],
                                response_token_ids=ids[1], parent=agent))  # fmt: skip
        spans.append(f.gateway_call(10 * i + 1.5, 10 * i + 2.5, response_id=f"r{i}", prompt_token_ids=ids[0],
                                    response_token_ids=ids[1]))  # fmt: skip
        spans.append(f.reward(float(i), 10 * i + 4, parent=agent))
    expected = [([i, i + 1], [i + 2], float(i)) for i in range(calls)]
    assert _tokens(TracerTraceToTriplet()(spans)) == expected
    assert _tokens(LlmProxyTraceToTriplet()(spans)) == expected
    assert len(TraceToMessages()(spans)) == calls


# -- the repair and reward rules, against a direct reading of them ---------------------------------------------------


def _reference_parent(node: TraceTree, child: TraceTree, candidates: List[TraceTree]) -> Optional[str]:
    """The contract's rule read literally: the tightest node (not itself, outside its subtree) enclosing the child's
    time range with a positive slack; first in depth-first order among equally tight ones."""
    own = {n.id for n in child.traverse()}
    best: Optional[TraceTree] = None
    best_slack = float("inf")
    for candidate in candidates:
        if candidate is node or candidate.id in own:
            continue
        if candidate.start_time > child.start_time or candidate.end_time < child.end_time:  # type: ignore[operator]
            continue
        slack = (child.start_time - candidate.start_time) + (candidate.end_time - child.end_time)  # type: ignore[operator]
        if 0 < slack < best_slack:
            best, best_slack = candidate, slack
    return best.id if best is not None else None


@pytest.mark.parametrize("seed", range(8))
def test_repair_moves_each_top_level_span_under_its_tightest_enclosing_span(seed: int) -> None:
    rng = random.Random(seed)
    f = SpanFactory()
    spans: List[Span] = []
    for _ in range(60):  # overlapping, nested and disjoint ranges, some of them zero-length
        start = rng.uniform(0, 20)
        end = start + (rng.uniform(0, 8) if rng.random() < 0.9 else 0.0)
        parent = rng.choice(spans) if spans and rng.random() < 0.3 else None
        spans.append(f.span("step", start, end, parent=parent))
    # The reference moves the spans one by one on its own copy of the tree.
    reference = TraceTree.from_spans(spans)
    candidates = reference.traverse()
    expected: Dict[str, str] = {}
    for child in list(reference.children):
        parent_id = _reference_parent(reference, child, candidates)
        expected[child.id] = parent_id if parent_id is not None else reference.id
        if parent_id is not None:
            reference.children.remove(child)
            next(n for n in candidates if n.id == parent_id).add_child(child)

    tree = TraceTree.from_spans(spans)
    tree.repair_hierarchy()
    parents = {child.id: node.id for node in tree.traverse() for child in node.children}
    assert {span_id: parents[span_id] for span_id in expected} == expected
    assert sorted(n.id for n in tree.traverse()) == sorted(n.id for n in reference.traverse())


@pytest.mark.parametrize("seed", range(8))
def test_each_reward_goes_to_the_latest_call_finished_before_it(seed: int) -> None:
    rng = random.Random(seed)
    f = SpanFactory()
    root = f.agent("solver", 0, 1000)
    spans: List[Span] = [root]
    for i in range(80):
        start = rng.randint(0, 50)
        if rng.random() < 0.5:
            end = start + rng.randint(0, 5)
            spans.append(f.llm_call(start, end, response_id=f"r{i}", prompt_token_ids=[i], response_token_ids=[i],
                                    parent=root))  # fmt: skip
        else:
            spans.append(f.reward(float(i), start, parent=root))
    triplets = TracerTraceToTriplet(repair_hierarchy=False)(spans)

    # The rule read literally: rewards by start time, each to the call that ended most recently at or before it
    # (latest start among equal ends, then first recorded) and has no reward yet.
    calls = [s for s in spans if s.name == "openai.chat.completion"]
    rewards = sorted((s for s in spans if s.name == "agentlightning.annotation"), key=lambda s: s.start_time)
    assigned: Dict[str, float] = {}
    for reward in rewards:
        free = [c for c in calls if c.span_id not in assigned and c.end_time <= reward.start_time]  # type: ignore[operator]
        if free:
            target = max(free, key=lambda c: (c.end_time, c.start_time))
            assigned[target.span_id] = reward.attributes["agentlightning.reward.0.value"]  # type: ignore[assignment]
    assert [t.reward for t in triplets] == [assigned.get(c.span_id) for c in calls]
