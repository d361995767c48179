"""``agent_match``: one rule for which agent made a call and whether it is trained, in every adapter."""

from __future__ import annotations

import logging
import re
import uuid
from typing import List

import openai
import pytest
from span_factory import SpanFactory
from support.fake_openai import FakeOpenAIConfig, FakeOpenAIServer

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet
from agentbolt.adapter.agent_match import AgentMatchError, compile_agent_match
from agentbolt.algorithm.sft.data import CallTraceToTriplet
from agentbolt.emitter import operation
from agentbolt.llm_proxy import LLMProxy
from agentbolt.semconv import LLM_AGENT_NAME_HEADER
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer.agentops import AgentOpsTracer
from agentbolt.types import Span

GATEWAY_AND_SDK_CALLS = r"^(agentbolt\.llm_call|openai\.chat\.completion)$"


def _nested_trace() -> List[Span]:
    """planner > executor > call r1; planner > call r2 (header: critic); a call r3 outside any agent."""
    f = SpanFactory()
    planner = f.agent("planner", 0, 10)
    executor = f.agent("executor", 1, 5, parent=planner)
    return [
        planner,
        executor,
        f.llm_call(2, 3, response_id="r1", parent=executor),
        f.llm_call(6, 7, response_id="r2", parent=planner, extra={"agentbolt.llm.agent_name": "critic"}),
        f.llm_call(11, 12, response_id="r3"),
    ]


def _calls(triplets: list) -> List[tuple]:
    return [(t.metadata["response_id"], t.metadata["agent_name"]) for t in triplets]


def test_a_call_belongs_to_the_innermost_agent_and_the_header_name_wins() -> None:
    assert _calls(TracerTraceToTriplet()(_nested_trace())) == [("r1", "executor"), ("r2", "critic"), ("r3", "")]


@pytest.mark.parametrize(
    ("pattern", "kept"),
    [
        ("planner", []),  # the planner's own call is tagged critic, the nested one belongs to executor
        ("exec", ["r1"]),  # searched, not matched in full
        ("^(executor|critic)$", ["r1", "r2"]),
        ("", ["r1", "r2"]),  # every named call; the unnamed one only with agent_match=None
    ],
)
def test_agent_match_is_searched_and_never_keeps_an_unnamed_call(pattern: str, kept: List[str]) -> None:
    triplets = TracerTraceToTriplet(agent_match=pattern)(_nested_trace())
    assert [t.metadata["response_id"] for t in triplets] == kept


def test_a_pattern_searches_inside_longer_names() -> None:
    f = SpanFactory()
    spans: List[Span] = []
    for i, name in enumerate(["planner_v2", "sub-planner", "plan"]):
        agent = f.agent(name, 10 * i, 10 * i + 5)
        spans += [agent, f.llm_call(10 * i + 1, 10 * i + 2, response_id=name, parent=agent)]
    assert [t.metadata["response_id"] for t in TracerTraceToTriplet(agent_match="planner")(spans)] == [
        "planner_v2",
        "sub-planner",
    ]
    assert TracerTraceToTriplet(agent_match="^planner$")(spans) == []


@pytest.mark.parametrize("make", [TracerTraceToTriplet, LlmProxyTraceToTriplet], ids=["tracer", "gateway"])
def test_an_invalid_agent_match_fails_at_construction_naming_the_pattern(make: type) -> None:
    with pytest.raises(ValueError, match=r"agent_match must be a regular expression; '\(planner' is not"):
        make(agent_match="(planner")
    with pytest.raises(re.error):  # what re.compile raises, as before
        make(agent_match="[a")
    with pytest.raises(TypeError, match="agent_match must be a regular expression string or None, got int 3"):
        make(agent_match=3)


def test_the_invalid_pattern_error_keeps_the_pattern_and_position() -> None:
    with pytest.raises(AgentMatchError) as caught:
        compile_agent_match("ab(", "agentbolt.agent_match")
    assert (caught.value.pattern, caught.value.pos) == ("ab(", 2)
    assert str(caught.value).startswith("agentbolt.agent_match must be a regular expression; 'ab(' is not")


def test_a_pattern_that_selects_nothing_is_reported_once_with_the_names_seen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pattern = f"planer-{uuid.uuid4().hex[:6]}"  # a misspelt name, unique to this test
    adapter = TracerTraceToTriplet(agent_match=pattern)
    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.agent_match"):
        assert adapter(_nested_trace()) == []
        assert adapter(_nested_trace()) == []
    (record,) = caplog.records
    message = record.getMessage()
    assert f"agent_match {pattern!r} selects none of the 3 LLM call(s) of rollout ro-test" in message
    assert "'critic', 'executor', 1 call(s) without an agent name" in message


def test_a_pattern_that_selected_a_call_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    pattern = f"^executor$|{uuid.uuid4().hex[:6]}"
    adapter = TracerTraceToTriplet(agent_match=pattern)
    f = SpanFactory()
    other = f.agent("critic", 0, 2)
    with caplog.at_level(logging.WARNING, logger="agentbolt.adapter.agent_match"):
        assert len(adapter(_nested_trace())) == 1
        assert adapter([other, f.llm_call(0.5, 1, response_id="x", parent=other)]) == []
    assert caplog.records == []


async def test_the_gateway_header_names_the_call_in_every_adapter() -> None:
    """A call sent with the agent-name header from inside another agent's span: every adapter names it after the
    header, whichever record of the call (the gateway's or the OpenAI SDK's) it reads."""
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "plan"})
    with FakeOpenAIServer(FakeOpenAIConfig(token_ids=True)) as backend:
        model_list = [
            {"model_name": "policy", "litellm_params": {"model": "hosted_vllm/m", "api_base": backend.base_url}}
        ]
        proxy = LLMProxy(model_list=model_list, store=store, launch_mode="asyncio")
        await proxy.start()
        try:
            llm = proxy.as_resource(model="policy")
            base_url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)  # type: ignore[call-arg]
            tracer = AgentOpsTracer()
            with tracer.lifespan(store):
                async with tracer.trace_context(
                    "plan", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
                ):
                    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
                    with operation(name="planner", **{"agent.name": "planner"}):
                        await client.chat.completions.create(
                            model="policy",
                            messages=[{"role": "user", "content": "go"}],
                            extra_headers={LLM_AGENT_NAME_HEADER: "executor"},
                        )
                    await client.close()
        finally:
            await proxy.stop()
    spans = list(await store.query_spans(rollout.rollout_id))
    assert {"agentbolt.llm_call", "openai.chat.completion"} <= {s.name for s in spans}

    adapters = {
        "tracer (SDK record)": TracerTraceToTriplet(),
        "gateway record": LlmProxyTraceToTriplet(),
        "sft (both records)": CallTraceToTriplet(llm_call_match=GATEWAY_AND_SDK_CALLS),
    }
    for label, adapter in adapters.items():
        assert [t.metadata["agent_name"] for t in adapter(spans)] == ["executor"], label
        selected = type(adapter)(agent_match="^executor$")  # type: ignore[call-arg]
        if isinstance(adapter, TracerTraceToTriplet):
            selected.llm_call_match = adapter.llm_call_match
        assert len(selected(spans)) == 1, label


async def test_a_langgraph_node_names_the_calls_of_the_chains_it_runs() -> None:
    """``prompt | model`` inside a node runs as a ``RunnableSequence``: its call still belongs to the node."""
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph

    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "plan"})
    with FakeOpenAIServer(FakeOpenAIConfig(token_ids=True)) as backend:
        model = ChatOpenAI(base_url=backend.base_url, api_key="unused", model="m", max_retries=0)
        prompt = ChatPromptTemplate.from_messages([("placeholder", "{messages}")])
        graph = StateGraph(MessagesState)
        graph.add_node("planner", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("writer", lambda state: {"messages": [(prompt | model).invoke(state)]})
        graph.add_edge(START, "planner")
        graph.add_edge("planner", "writer")
        graph.add_edge("writer", END)
        tracer = AgentOpsTracer()
        with tracer.lifespan(store):
            async with tracer.trace_context(
                "plan", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
            ):
                await graph.compile().ainvoke(
                    {"messages": [("user", "hi")]}, {"callbacks": [tracer.get_langchain_handler()]}
                )
    spans = list(await store.query_spans(rollout.rollout_id))
    assert "langchain.Chain.RunnableSequence" in {s.name for s in spans}
    assert [t.metadata["agent_name"] for t in TracerTraceToTriplet()(spans)] == ["planner", "writer"]
    assert len(TracerTraceToTriplet(agent_match="^writer$")(spans)) == 1


def test_gateway_records_of_concurrent_agents_are_named_by_their_sdk_twin() -> None:
    # Two agents call the LLM at the same moment. The gateway's record of the first call lies inside both SDK records
    # in time, and the second agent's is the tighter one: only the call id the two records share says whose it is.
    factory = SpanFactory()
    root = factory.span("rollout", 0, 10)
    first_agent = factory.agent("first", 0.5, 9, parent=root)
    second_agent = factory.agent("second", 0.5, 9, parent=root)
    spans = [root, first_agent, second_agent]
    agents = {"first": first_agent, "second": second_agent}
    timings = {"first": ((1.0, 3.0), (1.001, 2.998)), "second": ((1.0005, 2.9995), (1.0015, 2.999))}
    for name, ((sdk_start, sdk_end), (gw_start, gw_end)) in timings.items():
        agent = agents[name]
        ids = {"agentbolt.llm.call_id": f"call-{name}"}
        spans.append(factory.llm_call(sdk_start, sdk_end, response_id=f"resp-{name}", parent=agent, extra=ids))
        gateway = factory.gateway_call(
            gw_start, gw_end, response_id=f"resp-{name}", prompt_token_ids=[1], response_token_ids=[2]
        )
        gateway.attributes.update(ids)
        spans.append(gateway)
    for adapter in (LlmProxyTraceToTriplet(), TracerTraceToTriplet()):
        named = {t.metadata["response_id"]: t.metadata["agent_name"] for t in adapter.adapt(spans)}
        assert named == {"resp-first": "first", "resp-second": "second"}, type(adapter).__name__
    assert [s.parent_id for s in spans if s.name == "agentbolt.llm_call"] == [None, None]  # the spans given unchanged


def test_a_gateway_record_never_goes_under_another_calls_record_that_shares_its_response_id() -> None:
    # A backend that numbers responses per process gave both calls the id chatcmpl-1; their call ids differ. The
    # executor's gateway record lies inside the executor's span only, the planner's SDK record elsewhere in time.
    factory = SpanFactory()
    root = factory.span("rollout", 0, 30)
    planner = factory.agent("planner", 1, 10, parent=root)
    executor = factory.agent("executor", 11, 29, parent=root)
    planner_call = {"agentbolt.llm.call_id": "req-P"}
    sdk = factory.llm_call(2, 3, response_id="chatcmpl-1", parent=planner, extra=planner_call)
    planner_gateway = factory.gateway_call(
        2.001, 2.999, response_id="chatcmpl-1", prompt_token_ids=[1], response_token_ids=[2]
    )
    planner_gateway.attributes.update(planner_call)
    executor_gateway = factory.gateway_call(
        12, 21, response_id="chatcmpl-1", prompt_token_ids=[3], response_token_ids=[4]
    )
    executor_gateway.attributes["agentbolt.llm.call_id"] = "req-E"
    spans = [root, planner, executor, sdk, planner_gateway, executor_gateway]
    every_record = TracerTraceToTriplet(llm_call_match=r"^(agentbolt\.llm_call|openai\.chat\.completion)$")
    for adapter in (LlmProxyTraceToTriplet(), every_record):
        named = sorted((t.metadata["agent_name"], t.response["token_ids"]) for t in adapter.adapt(spans))
        assert ("executor", [4]) in named and all(name == "planner" for name, ids in named if ids != [4]), named


@pytest.mark.parametrize("gateway_first", [False, True])
def test_a_call_recorded_twice_is_kept_by_the_gateways_record(gateway_first: bool) -> None:
    # The SDK record has no token ids (none returned, or cut by an attribute length limit); the gateway's has the
    # engine's. One triplet, with the gateway's ids, wherever the records stand in the trace.
    factory = SpanFactory()
    root = factory.span("rollout", 0, 20)
    agent = factory.agent("solver", 0.5, 19, parent=root)
    sdk = factory.llm_call(1, 3, parent=agent, response_id="x1", extra={"agentbolt.llm.call_id": "req-1"})
    gateway = factory.gateway_call(1.1, 2.9, response_id="x1", prompt_token_ids=[11, 12], response_token_ids=[13])
    gateway.attributes["agentbolt.llm.call_id"] = "req-1"
    reward = factory.reward(1.0, 4, parent=root)
    spans = [gateway, root, agent, sdk, reward] if gateway_first else [root, agent, sdk, gateway, reward]
    adapter = TracerTraceToTriplet(llm_call_match=r"^(agentbolt\.llm_call|openai\.chat\.completion)$")
    [triplet] = adapter.adapt(spans)
    assert (triplet.prompt["token_ids"], triplet.response["token_ids"]) == ([11, 12], [13])
    assert (triplet.reward, triplet.metadata["agent_name"]) == (1.0, "solver")
