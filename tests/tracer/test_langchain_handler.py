"""The LangChain callback handler records real LangChain runs (runnables, tools, a chat model) as spans."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}"


async def test_chain_tool_and_model_become_nested_spans() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={})
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0, store)
    handler = tracer.get_langchain_handler(tags=["unit"])
    # FakeListChatModel ships with langchain-core: a deterministic chat model, so no hosted model is needed.
    model = FakeListChatModel(responses=["the answer"])

    def agent(question: str) -> str:
        # Runs started inside a runnable inherit its callbacks.
        found = lookup.invoke({"query": question})
        return f"{found} / {model.invoke(question).content}"

    chain = RunnableLambda(lambda q: q.strip()) | RunnableLambda(agent)
    async with tracer.trace_context("lc", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        output = chain.invoke("  cats ", config={"callbacks": [handler], "run_name": "agent_chain"})
    assert output == "result for cats / the answer"
    spans = {span.name: span for span in await store.query_spans(rollout.rollout_id)}
    root = spans["lc"]
    chain_span = spans["langchain.Chain.agent_chain"]
    assert chain_span.parent_id == root.span_id
    assert chain_span.attributes["lc_name"] == "agent_chain"
    assert chain_span.attributes["agentlightning.tag.0"] == "unit"
    assert chain_span.attributes["langchain.chain.outputs"] == output
    tool_span = spans["tool.lookup"]
    assert tool_span.attributes["tool.name"] == "lookup"
    assert json.loads(str(tool_span.attributes["tool.parameters"])) == {"query": "cats"}
    assert tool_span.attributes["tool.output"] == "result for cats"
    llm_span = next(span for name, span in spans.items() if name.startswith("langchain.llm."))
    assert llm_span.attributes["gen_ai.prompt.0.content"] == "cats"
    assert llm_span.attributes["gen_ai.completion.0.content"] == "the answer"
    # Child runs of the chain are nested under the chain's span.
    assert tool_span.parent_id is not None and llm_span.parent_id is not None
    assert {tool_span.parent_id, llm_span.parent_id} <= {span.span_id for span in spans.values()}


async def test_failing_tool_is_recorded_as_error() -> None:
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0)
    handler = tracer.get_langchain_handler()

    @tool
    def broken(x: int) -> int:
        """Always fails."""
        raise ValueError("tool failed")

    async with tracer.trace_context("lc"):
        with pytest.raises(ValueError):
            broken.invoke({"x": 1}, config={"callbacks": [handler]})
    (tool_span,) = [span for span in tracer.get_last_trace() if span.name == "tool.broken"]
    assert tool_span.status.status_code == "ERROR"
    assert tool_span.status.description == "tool failed"


async def test_tool_calls_and_tool_results_keep_their_ids_through_spans_and_messages() -> None:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from agentbolt.adapter import TraceToMessages

    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={})
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0, store)
    handler = tracer.get_langchain_handler()
    call = {"name": "lookup", "args": {"query": "cats"}, "id": "call_7", "type": "tool_call"}
    model = FakeMessagesListChatModel(
        responses=[
            AIMessage(content="", tool_calls=[call], response_metadata={"id": "resp-1", "finish_reason": "tool_calls"}),
            AIMessage(content="Cats are animals.", response_metadata={"id": "resp-2", "finish_reason": "stop"}),
        ]
    )
    history = [HumanMessage("What are cats?")]
    async with tracer.trace_context("lc", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        first = model.invoke(history, config={"callbacks": [handler]})
        result = lookup.invoke(first.tool_calls[0], config={"callbacks": [handler]})
        history += [first, result]
        model.invoke(history, config={"callbacks": [handler]})
    assert isinstance(result, ToolMessage)
    spans = list(await store.query_spans(rollout.rollout_id))
    first_call, second_call = [s.attributes for s in spans if s.name.startswith("langchain.llm.")]
    assert first_call["gen_ai.response.id"] == "resp-1"
    assert first_call["gen_ai.completion.0.tool_calls.0.id"] == "call_7"
    assert first_call["gen_ai.completion.0.tool_calls.0.name"] == "lookup"
    assert json.loads(str(first_call["gen_ai.completion.0.tool_calls.0.arguments"])) == {"query": "cats"}
    assert first_call["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert second_call["gen_ai.prompt.1.tool_calls.0.id"] == "call_7"
    assert second_call["gen_ai.prompt.2.role"] == "tool"
    assert second_call["gen_ai.prompt.2.tool_call_id"] == "call_7"
    conversations = TraceToMessages()(spans)
    assert len(conversations) == 2
    assert conversations[1]["messages"] == [
        {"role": "user", "content": "What are cats?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": '{"query": "cats"}'}}
            ],
        },
        {"role": "tool", "content": "result for cats", "tool_call_id": "call_7"},
        {"role": "assistant", "content": "Cats are animals."},
    ]


class FailingChatModel(BaseChatModel):
    """A chat model whose every call fails with a message holding a lone surrogate (as a server's JSON may)."""

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        raise RuntimeError("bad \ud800 answer")

    @property
    def _llm_type(self) -> str:
        return "failing"


async def test_a_failed_model_call_records_its_error_with_lone_surrogates_replaced() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={})
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0, store)
    async with tracer.trace_context("lc", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        with pytest.raises(RuntimeError):
            FailingChatModel().invoke("q", config={"callbacks": [tracer.get_langchain_handler()]})
    (llm_span,) = [
        span for span in await store.query_spans(rollout.rollout_id) if span.name.startswith("langchain.llm.")
    ]
    (event,) = [event for event in llm_span.events if event.name == "exception"]
    assert event.attributes["exception.message"] == "bad \ufffd answer"
    assert "bad \ufffd answer" in str(event.attributes["exception.stacktrace"])
    assert llm_span.status.status_code == "ERROR" and llm_span.status.description == "bad \ufffd answer"
    llm_span.model_dump_json()  # writable as JSON


class ClientCallingChatModel(BaseChatModel):
    """A chat model that, like one on the instrumented OpenAI SDK, records its LLM call as a span of its own."""

    def _record_call(self) -> Any:
        from langchain_core.messages import AIMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
        from opentelemetry import trace

        with trace.get_tracer("client").start_as_current_span("openai.chat.completion"):
            pass
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="done"))])

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        return self._record_call()

    async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        return self._record_call()

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    @property
    def _llm_type(self) -> str:
        return "client-calling"


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved:DeprecationWarning")
@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
async def test_langgraph_nodes_name_the_calls_inside_them_by_their_path(asynchronous: bool) -> None:
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import create_react_agent
    from opentelemetry import trace

    from agentbolt.adapter.triplet import TraceTree

    team = StateGraph(MessagesState)
    team.add_node("lead", create_react_agent(ClientCallingChatModel(), [lookup], name="planner"))
    team.add_node("writer", create_react_agent(ClientCallingChatModel(), [], name="writer"))
    team.add_edge(START, "lead")
    team.add_edge("lead", "writer")
    team.add_edge("writer", END)
    graph = team.compile()
    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0)
    config = {"callbacks": [tracer.get_langchain_handler()]}
    async with tracer.trace_context("lc"):
        outside = trace.get_current_span()
        if asynchronous:
            await graph.ainvoke({"messages": [("user", "go")]}, config=config)
        else:
            graph.invoke({"messages": [("user", "go")]}, config=config)
        assert trace.get_current_span() is outside  # the model runs' spans are current only while they run
    spans = tracer.get_last_trace()
    by_id = {span.span_id: span for span in spans}
    paths = sorted({str(s.attributes["langgraph.node_path"]) for s in spans if "langgraph.node_path" in s.attributes})
    # A node is named by the nodes leading to it: the subgraph node's name, not the graph's ("lead", not "planner").
    assert paths == ["lead", "lead/agent", "writer", "writer/agent"]
    calls = [span for span in spans if span.name == "openai.chat.completion"]
    assert len(calls) == 2 and all(by_id[str(call.parent_id)].name.startswith("langchain.llm.") for call in calls)
    found = TraceTree.from_spans(spans).find_llm_calls(llm_call_match=r"openai\.chat", agent_match="lead")
    assert [agent for _, agent in found] == ["lead/agent"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
async def test_a_model_call_nests_the_clients_record_and_leaves_the_current_span_as_it_was(asynchronous: bool) -> None:
    # LangChain ends an asynchronous model run in a copy of the context it started in: what the run's start made the
    # current span must not outlive the run in the caller's context (a reward emitted next would nest under it).
    from opentelemetry import trace

    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0)
    config = {"callbacks": [tracer.get_langchain_handler()]}
    async with tracer.trace_context("lc"):
        outside = trace.get_current_span()
        for _ in range(2):
            if asynchronous:
                await ClientCallingChatModel().ainvoke("q", config=config)
            else:
                ClientCallingChatModel().invoke("q", config=config)
            assert trace.get_current_span().get_span_context() == outside.get_span_context()
            with trace.get_tracer("user").start_as_current_span("after the call"):
                pass
    spans = tracer.get_last_trace()
    by_id = {span.span_id: span for span in spans}
    (root,) = [span for span in spans if span.name == "lc"]
    calls = [span for span in spans if span.name == "openai.chat.completion"]
    assert len(calls) == 2 and all(by_id[str(call.parent_id)].name.startswith("langchain.llm.") for call in calls)
    assert [span.parent_id for span in spans if span.name == "after the call"] == [root.span_id] * 2
