"""Real agent frameworks run through Trainer.dev and the LLM gateway, recorded exactly once per LLM call.

Each agent asks for 2 + 3 with an ``add`` tool. The served model (see ``tool_model.py``) calls the tool in its first
answer and answers "The sum is 5." once the tool result is in its prompt, so every rollout makes two LLM calls and
one tool call, and earns reward 1. Each call is recorded by the gateway and by the OpenAI SDK instrumentation (and,
for LangGraph, by the LangChain handler); the adapters must give one sample per call, with the backend's token ids,
the tool call and its id intact, and the reward on the last call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, TraceToMessages
from agentbolt.emitter import find_final_reward
from agentbolt.serving.server import InferenceServer
from agentbolt.types import Span

from .agents import (
    langgraph_agent,
    langgraph_team_agent,
    langgraph_team_agent_async,
    openai_agents_agent,
    openai_mcp_agent,
)
from .conftest import run_dev
from .tool_model import ANSWER, TOOL_ARGUMENTS

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved:DeprecationWarning"),
]

QUESTION = "What is 2 + 3?"
CALL_ID = "agentbolt.llm.call_id"


def _by_name(spans: Sequence[Span], name: str) -> List[Span]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.sequence_id)


def _require(*modules: str) -> None:
    for module in modules:
        pytest.importorskip(module, reason="install the 'agents' extra")


def _text(content: Any) -> str:
    """Message content as text (the Agents SDK sends MCP tool results as text parts)."""
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def check_rollout(spans: Sequence[Span], *, framework_spans: str = "") -> None:
    """Two LLM calls, each recorded by the gateway and the SDK under one call id; one sample per call."""
    assert find_final_reward(spans) == 1.0
    gateway = _by_name(spans, "agentbolt.llm_call")
    sdk = _by_name(spans, "openai.chat.completion")
    assert len(gateway) == len(sdk) == 2
    sdk_by_call = {s.attributes[CALL_ID]: s for s in sdk}
    assert [s.attributes[CALL_ID] for s in gateway] == list(sdk_by_call)  # same calls, in the same order
    for record in gateway:
        twin = sdk_by_call[record.attributes[CALL_ID]]
        for key in ("prompt_token_ids", "response_token_ids", "gen_ai.response.id"):
            assert record.attributes[key] and list(record.attributes[key]) == list(twin.attributes[key]), key
    first, second = gateway
    call_id = first.attributes["gen_ai.completion.0.tool_calls.0.id"]
    if framework_spans:  # the framework's own records keep the tool call and its id too
        calling, answering = (s.attributes for s in _by_name(spans, framework_spans))
        assert calling["gen_ai.completion.0.tool_calls.0.id"] == call_id
        assert answering["gen_ai.prompt.1.tool_calls.0.id"] == call_id
        assert answering["gen_ai.prompt.2.tool_call_id"] == call_id
    assert first.attributes["gen_ai.completion.0.tool_calls.0.name"] == "add"
    assert json.loads(str(first.attributes["gen_ai.completion.0.tool_calls.0.arguments"])) == TOOL_ARGUMENTS
    assert second.attributes["gen_ai.completion.0.content"] == ANSWER

    for adapter in (TracerTraceToTriplet(), LlmProxyTraceToTriplet()):
        triplets = adapter.adapt(spans)
        assert len(triplets) == 2, type(adapter).__name__
        assert [t.reward for t in triplets] == [None, 1.0]
        for triplet, record in zip(triplets, gateway, strict=True):
            assert triplet.prompt["token_ids"] == list(record.attributes["prompt_token_ids"])
            assert triplet.response["token_ids"] == list(record.attributes["response_token_ids"])
    first_triplet, second_triplet = TracerTraceToTriplet().adapt(spans)
    assert first_triplet.response["raw_content"][0]["tool_calls"][0]["id"] == call_id
    prompt_messages: List[Dict[str, Any]] = second_triplet.prompt["raw_content"]
    assert any(m.get("tool_calls", [{}])[0].get("id") == call_id for m in prompt_messages if m["role"] == "assistant")
    assert [m.get("tool_call_id") for m in prompt_messages if m["role"] == "tool"] == [call_id]

    conversations = TraceToMessages().adapt(spans)
    assert len(conversations) == 2
    for conversation in conversations:
        assert [tool["function"]["name"] for tool in conversation["tools"] or []] == ["add"]
    calling, answering = (c["messages"] for c in conversations)
    assert calling[-1]["tool_calls"][0]["id"] == call_id
    assert calling[-1]["tool_calls"][0]["function"]["name"] == "add"
    tool_result = answering[-2]
    assert (tool_result["role"], tool_result["tool_call_id"], _text(tool_result["content"])) == ("tool", call_id, "5")
    assert answering[-1] == {"role": "assistant", "content": ANSWER}


def test_langgraph_agent_in_one_process(tool_server: InferenceServer, tmp_path: Path) -> None:
    # The quick case, in the default suite: one rollout, runner and algorithm in this process.
    _require("langgraph", "langchain_openai")
    for spans in run_dev(langgraph_agent, [{"question": QUESTION}], tool_server, tmp_path, strategy="shm"):
        check_rollout(spans, framework_spans="langchain.llm.ChatOpenAI")


@pytest.mark.parametrize(
    "agent, streaming",
    [(langgraph_team_agent, False), (langgraph_team_agent_async, True)],
    ids=["invoke", "ainvoke-streaming"],
)
def test_one_agent_of_a_langgraph_team_is_selected_by_its_name(
    agent: Any, streaming: bool, tool_server: InferenceServer, tmp_path: Path
) -> None:
    # Both prebuilt agents call their model node "agent": the calls are named by the node's path in the graph.
    _require("langgraph", "langchain_openai")
    tasks = [{"question": QUESTION, "streaming": streaming}]
    for spans in run_dev(agent, tasks, tool_server, tmp_path, strategy="shm"):
        assert find_final_reward(spans) == 1.0
        gateway = _by_name(spans, "agentbolt.llm_call")
        assert len(gateway) == 3  # the researcher calls the tool, then answers; the writer answers
        everyone = TracerTraceToTriplet().adapt(spans)
        assert [t.metadata["agent_name"] for t in everyone] == ["researcher/agent"] * 2 + ["writer/agent"]
        from_gateway = LlmProxyTraceToTriplet(agent_match="researcher").adapt(spans)
        assert [t.metadata["agent_name"] for t in from_gateway] == ["researcher/agent"] * 2
        for triplet, record in zip(everyone, gateway, strict=True):
            assert triplet.response["token_ids"] == list(record.attributes["response_token_ids"])
        researcher = TracerTraceToTriplet(agent_match="researcher").adapt(spans)
        assert [t.prompt["token_ids"] for t in researcher] == [t.prompt["token_ids"] for t in everyone[:2]]
        (writer,) = TracerTraceToTriplet(agent_match="^writer/").adapt(spans)
        assert writer.response["token_ids"] == everyone[2].response["token_ids"]
        assert writer.reward == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("streaming", [False, True], ids=["raw-response", "streaming"])
def test_langgraph_react_agent(streaming: bool, tool_server: InferenceServer, tmp_path: Path) -> None:
    _require("langgraph", "langchain_openai")
    tasks = [{"question": QUESTION, "streaming": streaming}] * 2
    for spans in run_dev(langgraph_agent, tasks, tool_server, tmp_path):
        check_rollout(spans, framework_spans="langchain.llm.ChatOpenAI")


@pytest.mark.slow
@pytest.mark.parametrize("mcp", [False, True], ids=["function-tool", "mcp-server"])
def test_openai_agents_sdk_agent(mcp: bool, tool_server: InferenceServer, tmp_path: Path) -> None:
    _require("agents", "mcp")
    for spans in run_dev(openai_agents_agent, [{"question": QUESTION, "mcp": mcp}] * 2, tool_server, tmp_path):
        check_rollout(spans)
        # The SDK's tracing is disabled in the agent; the agent's run is recorded all the same, and names its calls.
        (agent,) = _by_name(spans, "openai_agents.agent.calculator")
        assert agent.attributes["agent.name"] == "calculator"
        triplets = TracerTraceToTriplet(agent_match="^calculator$").adapt(spans)
        assert [t.metadata["agent_name"] for t in triplets] == ["calculator", "calculator"]


@pytest.mark.slow
def test_openai_sdk_agent_with_mcp_tools(tool_server: InferenceServer, tmp_path: Path) -> None:
    _require("mcp")
    for spans in run_dev(openai_mcp_agent, [{"question": QUESTION}] * 2, tool_server, tmp_path):
        check_rollout(spans)
