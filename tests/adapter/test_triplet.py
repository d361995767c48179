"""TracerTraceToTriplet and TraceTree on realistic agent traces."""

from __future__ import annotations

import importlib.util
import json
import logging
import re

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from span_factory import SpanFactory

from agentbolt.adapter import TracerTraceToTriplet
from agentbolt.adapter.triplet import RewardMatchPolicy, TraceTree
from agentbolt.types import Span


def _two_agent_trace(f: SpanFactory) -> list[Span]:
    """planner -> executor -> planner, then the final reward; all linked by parent ids."""
    root = f.span("rollout", 0, 20)
    planner = f.agent("planner", 0.5, 19, parent=root)
    p1 = f.llm_call(1, 2, parent=planner, response_id="p1", prompt_token_ids=[1, 2], response_token_ids=[3])
    executor = f.agent("executor", 3, 10, parent=planner)
    e1 = f.llm_call(4, 5, parent=executor, response_id="e1", prompt_token_ids=[4], response_token_ids=[5, 6])
    tool = f.tool("search", {"q": "x"}, "call-1", 6, 7, parent=executor)
    e2 = f.llm_call(8, 9, parent=executor, response_id="e2", prompt_token_ids=[7], response_token_ids=[8])
    p2 = f.llm_call(11, 12, parent=planner, response_id="p2", prompt_token_ids=[9], response_token_ids=[10])
    reward = f.reward(1.0, 19.5, parent=root)
    return [root, planner, p1, executor, e1, tool, e2, p2, reward]


def test_single_agent_triplets_carry_tokens_text_logprobs_and_reward() -> None:
    f = SpanFactory()
    root = f.agent("solver", 0, 10)
    c1 = f.llm_call(
        1, 2, parent=root, response_id="r1", prompt="2+2?", answer="4", prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5], logprobs=[-0.1, -0.2],
    )  # fmt: skip
    c2 = f.llm_call(3, 4, parent=root, response_id="r2", prompt_token_ids=[6], response_token_ids=[7])
    reward = f.reward(0.5, 5, parent=root)

    triplets = TracerTraceToTriplet()([root, c1, c2, reward])

    assert [t.metadata["response_id"] for t in triplets] == ["r1", "r2"]
    first, second = triplets
    assert first.prompt["token_ids"] == [1, 2, 3]
    assert first.response["token_ids"] == [4, 5]
    assert [entry["logprob"] for entry in first.response["logprobs"]] == [-0.1, -0.2]
    assert first.prompt["raw_content"] == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "2+2?"},
    ]
    assert first.response["raw_content"] == [{"role": "assistant", "content": "4", "finish_reason": "stop"}]
    assert first.prompt["image_urls"] == []
    assert first.metadata["agent_name"] == "solver"
    assert first.metadata["request"] == {"model": "smollm2-135m", "temperature": 0.7}
    assert first.metadata["response"] == {"model": "smollm2-135m", "id": "r1"}
    assert "logprobs" not in second.response
    assert (first.reward, second.reward) == (None, 0.5)


def test_agent_match_keeps_only_the_selected_agents_calls() -> None:
    f = SpanFactory()
    spans = _two_agent_trace(f)

    everything = TracerTraceToTriplet()(spans)
    assert [(t.metadata["response_id"], t.metadata["agent_name"]) for t in everything] == [
        ("p1", "planner"),
        ("e1", "executor"),
        ("e2", "executor"),
        ("p2", "planner"),
    ]

    planner_only = TracerTraceToTriplet(agent_match="planner")(spans)
    assert [t.metadata["response_id"] for t in planner_only] == ["p1", "p2"]
    assert {t.metadata["agent_name"] for t in planner_only} == {"planner"}
    # The final reward goes to the planner's last call, not to a call of the agent that is not trained.
    assert [t.reward for t in planner_only] == [None, 1.0]
    assert [t.prompt["token_ids"] for t in planner_only] == [[1, 2], [9]]

    executor_only = TracerTraceToTriplet(agent_match=r"^exec")(spans)
    assert [t.metadata["response_id"] for t in executor_only] == ["e1", "e2"]

    assert TracerTraceToTriplet(agent_match="nobody")(spans) == []


def test_repair_hierarchy_reattaches_orphan_calls_to_the_enclosing_agent() -> None:
    f = SpanFactory()
    root = f.span("rollout", 0, 20)
    planner = f.agent("planner", 1, 9, parent=root)
    executor = f.agent("executor", 10, 19, parent=root)
    # Recorded in worker threads without context propagation: no parent, another trace.
    p1 = f.llm_call(2, 3, response_id="p1", trace_id="2" * 32)
    e1 = f.llm_call(11, 12, response_id="e1", trace_id="3" * 32)
    spans = [root, planner, executor, p1, e1]

    tree = TraceTree.from_spans(spans)
    assert tree.id == "virtual-root"
    tree.repair_hierarchy()
    assert tree.names_tuple() == (
        "virtual-root",
        [
            (
                "rollout",
                [
                    ("invoke_agent planner [agent]", [("openai.chat.completion", [])]),
                    ("invoke_agent executor [agent]", [("openai.chat.completion", [])]),
                ],
            )
        ],
    )

    repaired = TracerTraceToTriplet(agent_match="planner")(spans)
    assert [t.metadata["response_id"] for t in repaired] == ["p1"]
    unrepaired = TracerTraceToTriplet(agent_match="planner", repair_hierarchy=False)(spans)
    assert unrepaired == []


def test_repair_inserts_moved_spans_in_chronological_order() -> None:
    f = SpanFactory()
    agent = f.agent("solo", 0, 10)
    late = f.llm_call(6, 7, parent=agent, response_id="late")
    early = f.llm_call(1, 2, response_id="early", trace_id="4" * 32)
    tree = TraceTree.from_spans([agent, late, early])
    tree.repair_hierarchy()
    assert [child.id for child in tree.find_id(agent.span_id).children] == [early.span_id, late.span_id]  # type: ignore[union-attr]
    assert [t.metadata["response_id"] for t in tree.to_trajectory()] == ["early", "late"]


def test_missing_parent_becomes_a_virtual_node_spanning_its_children() -> None:
    f = SpanFactory()
    a = f.llm_call(1, 2, parent_id="feedfacefeedface", response_id="a")
    b = f.llm_call(3, 5, parent_id="feedfacefeedface", response_id="b")
    tree = TraceTree.from_spans([a, b])
    assert tree.id == "feedfacefeedface"
    assert tree.span.name == "agentlightning.virtual"
    assert (tree.start_time, tree.end_time) == (a.start_time, b.end_time)
    assert tree.span.rollout_id == a.rollout_id and tree.span.sequence_id == a.sequence_id
    assert [child.id for child in tree.children] == [a.span_id, b.span_id]


def test_tree_helpers_and_errors() -> None:
    with pytest.raises(ValueError, match=r"No spans provided to create TraceTree\."):
        TraceTree.from_spans([])
    f = SpanFactory()
    spans = _two_agent_trace(f)
    tree = TraceTree.from_spans(spans)
    assert [node.span.span_id for node in tree.traverse()] == [s.span_id for s in spans]
    assert tree.find_id(spans[3].span_id) is not None and tree.find_id("missing") is None
    dumped = json.loads(json.dumps(tree.to_json()))
    assert dumped["id"] == spans[0].span_id and dumped["children"][0]["span"]["name"] == "invoke_agent planner"

    cyclic = [f.span("a", 0, 1, span_id="aa", parent_id="bb"), f.span("b", 0, 1, span_id="bb", parent_id="aa")]
    with pytest.raises(ValueError, match="cycle"):
        TraceTree.from_spans(cyclic)


def test_spans_in_a_parent_cycle_beside_a_root_are_kept(caplog: pytest.LogCaptureFixture) -> None:
    f = SpanFactory()
    root = f.span("rollout", 0, 10)
    a = f.agent("solver", 1, 4, span_id="aaaaaaaaaaaaaaaa", parent_id="bbbbbbbbbbbbbbbb")
    b = f.span("b", 1, 5, span_id="bbbbbbbbbbbbbbbb", parent_id="aaaaaaaaaaaaaaaa")
    call = f.llm_call(2, 3, parent=a, response_id="r1", prompt_token_ids=[1], response_token_ids=[2])
    reward = f.reward(1.0, 6, parent=root)
    with caplog.at_level("WARNING", logger="agentbolt.adapter.triplet"):
        tree = TraceTree.from_spans([root, a, b, call, reward])
    assert {node.id for node in tree.traverse()} >= {s.span_id for s in (root, a, b, call, reward)}
    assert "form a cycle" in caplog.text and a.span_id in caplog.text
    [triplet] = TracerTraceToTriplet().adapt([root, a, b, call, reward])
    assert triplet.metadata["response_id"] == "r1" and triplet.metadata["agent_name"] == "solver"
    assert triplet.reward == 1.0


@pytest.mark.parametrize(
    ("name", "attributes", "expected"),
    [
        ("x", {"agent.name": "writer"}, "writer"),
        ("x", {"agentops.span.kind": "agent", "operation.name": "checker"}, "checker"),
        ("x", {"recipient_agent_type": "assistant"}, "assistant"),
        ("x", {"langchain.chain.type": "AgentExecutor"}, "AgentExecutor"),
        ("x", {"executor.id": "exec-1"}, "exec-1"),
        ("agentlightning.operation", {"type": "agent", "agentlightning.operation.input.name": "op"}, "op"),
        ("langchain.Chain.write_query", {}, "write_query"),
        ("openai.chat.completion", {"agentops.span.kind": "llm", "operation.name": "x"}, None),
    ],
)
def test_agent_name_rules(name: str, attributes: dict, expected: str | None) -> None:
    node = TraceTree("n", SpanFactory().span(name, 0, 1, attributes=attributes))
    assert node.agent_name() == expected


def test_duplicate_instrumentation_of_one_call_is_deduplicated() -> None:
    f = SpanFactory()
    agent = f.agent("solo", 0, 10)
    outer = f.llm_call(1, 4, parent=agent, response_id="same", name="openai.chat.completion")
    inner = f.llm_call(1.5, 3.5, parent=outer, response_id="same", name="openai.chat.completion.raw")
    nested_no_id = f.llm_call(2, 3, parent=inner, response_id=None, name="openai.chat.completion.http")
    spans = [agent, outer, inner, nested_no_id]

    assert [t.metadata["response_id"] for t in TracerTraceToTriplet()(spans)] == ["same"]
    tree = TraceTree.from_spans(spans)
    assert len(tree.to_trajectory(dedup_llm_call=False)) == 3


def test_llm_calls_inside_reward_computation_are_excluded_by_default() -> None:
    f = SpanFactory()
    agent = f.agent("solo", 0, 20)
    call = f.llm_call(1, 2, parent=agent, response_id="policy")
    judge = f.span(
        "agentlightning.operation",
        3,
        8,
        parent=agent,
        attributes={"agentlightning.operation.name": "agentlightning.reward", "agentlightning.operation.output": 0.75},
    )
    judge_call = f.llm_call(4, 5, parent=judge, response_id="judge")
    spans = [agent, call, judge, judge_call]

    triplets = TracerTraceToTriplet()(spans)
    assert [t.metadata["response_id"] for t in triplets] == ["policy"]
    assert triplets[0].reward == 0.75  # legacy reward operation's output
    included = TracerTraceToTriplet(exclude_llm_call_in_reward=False)(spans)
    assert [t.metadata["response_id"] for t in included] == ["policy", "judge"]


def test_reward_match_policies_differ_on_nested_calls() -> None:
    f = SpanFactory()
    root = f.span("rollout", 0, 10)
    c1 = f.llm_call(1, 2, parent=root, response_id="c1")
    agent = f.agent("helper", 2.5, 5, parent=root)
    c2 = f.llm_call(3, 4, parent=agent, response_id="c2")
    reward = f.reward(1.0, 6, parent=root)
    spans = [root, c1, agent, c2, reward]

    occurrence = TracerTraceToTriplet(reward_match=RewardMatchPolicy.FIRST_OCCURRENCE)(spans)
    assert [(t.metadata["response_id"], t.reward) for t in occurrence] == [("c1", None), ("c2", 1.0)]
    sibling = TracerTraceToTriplet(reward_match=RewardMatchPolicy.FIRST_SIBLING)(spans)
    assert [(t.metadata["response_id"], t.reward) for t in sibling] == [("c1", 1.0), ("c2", None)]


def test_each_reward_goes_to_one_earlier_call(caplog: pytest.LogCaptureFixture) -> None:
    f = SpanFactory()
    root = f.agent("solo", 0, 20)
    early_reward = f.reward(9.0, 0.5, parent=root)  # before any call: matched to nothing
    c1 = f.llm_call(1, 2, parent=root, response_id="c1")
    r1 = f.reward(0.1, 3, parent=root)
    c2 = f.llm_call(4, 5, parent=root, response_id="c2")
    c3 = f.llm_call(6, 7, parent=root, response_id="c3")
    r2 = f.reward(0.3, 8, parent=root)
    r3 = f.reward(0.2, 9, parent=root)
    with caplog.at_level(logging.DEBUG, logger="agentbolt.adapter.triplet"):
        triplets = TracerTraceToTriplet()([root, early_reward, c1, r1, c2, c3, r2, r3])
    assert [t.reward for t in triplets] == [0.1, 0.2, 0.3]
    assert f"Reward 9.0 (span {early_reward.span_id}) goes to no LLM call" in caplog.text

    tree = TraceTree.from_spans([root, c1, c2, r1])
    assert tree.to_trajectory(final_reward=5.0)[-1].reward == 5.0


def test_skip_empty_token_spans() -> None:
    f = SpanFactory()
    agent = f.agent("solo", 0, 10)
    with_ids = f.llm_call(1, 2, parent=agent, response_id="a", prompt_token_ids=[1], response_token_ids=[2])
    without = f.llm_call(3, 4, parent=agent, response_id="b")
    reward = f.reward(1.0, 5, parent=agent)
    spans = [agent, with_ids, without, reward]
    kept = TracerTraceToTriplet(_skip_empty_token_spans=True)(spans)
    assert [(t.metadata["response_id"], t.reward) for t in kept] == [("a", 1.0)]
    assert TracerTraceToTriplet()(spans)[1].prompt["token_ids"] == []


def test_operation_spans_and_image_urls() -> None:
    f = SpanFactory()
    parts = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]
    span = f.span(
        "agentlightning.operation",
        0,
        1,
        attributes={
            "agentlightning.operation.name": "chat",
            "agentlightning.operation.input.messages.0.role": "user",
            "agentlightning.operation.input.messages.0.content": json.dumps(parts),
            "agentlightning.operation.input.model": "m",
            "agentlightning.operation.output.id": "op-1",
            "agentlightning.operation.output.prompt_token_ids": [1, 2],
            "agentlightning.operation.output.choices.0.token_ids": [3],
            "agentlightning.operation.output.choices.0.message.content": "a cat",
        },
    )
    (triplet,) = TracerTraceToTriplet(llm_call_match=r"agentlightning\.operation")([span])
    assert triplet.prompt["token_ids"] == [1, 2]
    assert triplet.response["token_ids"] == [3]
    assert triplet.prompt["image_urls"] == ["http://x/a.png"]
    assert triplet.metadata["response_id"] == "op-1"
    assert triplet.metadata["request"] == {"model": "m"}

    assert TraceTree.extract_prompt_image_urls({"1": {"content": parts}, "0": {"content": "plain"}}) == [
        "http://x/a.png"
    ]
    assert TraceTree.extract_prompt_image_urls("garbage") == []


def test_adapts_raw_opentelemetry_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("agent", attributes={"agent.name": "otel-agent"}):
        with tracer.start_as_current_span(
            "openai.chat.completion",
            attributes={"gen_ai.response.id": "otel-1", "prompt_token_ids": [1, 2], "response_token_ids": [3]},
        ):
            pass
        with tracer.start_as_current_span(
            "agentlightning.annotation",
            attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 2.0},
        ):
            pass
    provider.shutdown()

    (triplet,) = TracerTraceToTriplet()(exporter.get_finished_spans())
    assert triplet.prompt["token_ids"] == [1, 2]
    assert triplet.reward == 2.0
    assert triplet.metadata["agent_name"] == "otel-agent"


def test_invalid_regex_fails_at_construction_and_empty_trace_gives_nothing() -> None:
    with pytest.raises(re.error):
        TracerTraceToTriplet(agent_match="(")
    assert TracerTraceToTriplet()([]) == []


@pytest.mark.skipif(importlib.util.find_spec("graphviz") is not None, reason="graphviz is installed")
def test_visualize_without_graphviz_names_the_package(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spans = _two_agent_trace(SpanFactory())
    with pytest.raises(ImportError, match="pip install graphviz"):
        TracerTraceToTriplet().visualize(spans, filename=str(tmp_path / "tree"))
