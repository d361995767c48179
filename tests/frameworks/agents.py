"""Agents written with real frameworks, as a user would write them; each one asks for a sum and uses an ``add`` tool.

The frameworks are imported inside the agents, where a user's code would import them, so that collecting the
tests does not need them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import agentbolt as agl
from agentbolt.tracer import get_active_tracer

MCP_SERVER = Path(__file__).with_name("mcp_add_server.py")
INSTRUCTIONS = "You add numbers with the add tool."


def _reward(answer: Any) -> float:
    return 1.0 if "5" in str(answer) else 0.0


def _langchain_model_and_tool(task: Dict[str, Any], llm: agl.LLM) -> Tuple[Any, Any]:
    """``ChatOpenAI`` on the served model (streaming when the task asks) and the ``add`` tool."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = ChatOpenAI(
        base_url=llm.endpoint,
        api_key="unused",
        model=llm.model,
        temperature=0.7,
        streaming=bool(task.get("streaming")),
        max_retries=0,
    )
    return model, add


@agl.rollout
def langgraph_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """A LangGraph ReAct agent on ``ChatOpenAI``, traced by the LangChain handler too."""
    from langgraph.prebuilt import create_react_agent

    model, add = _langchain_model_and_tool(task, llm)
    graph = create_react_agent(model, [add])
    handler = get_active_tracer().get_langchain_handler()  # type: ignore[attr-defined]
    result = graph.invoke({"messages": [("user", task["question"])]}, config={"callbacks": [handler]})
    return _reward(result["messages"][-1].content)


def _langgraph_team(task: Dict[str, Any], llm: agl.LLM) -> Any:
    """Two prebuilt LangGraph agents in one graph: a researcher with the ``add`` tool, then a writer without tools."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import create_react_agent

    model, add = _langchain_model_and_tool(task, llm)
    team = StateGraph(MessagesState)
    team.add_node("researcher", create_react_agent(model, [add], name="researcher"))
    team.add_node("writer", create_react_agent(model, [], name="writer"))
    team.add_edge(START, "researcher")
    team.add_edge("researcher", "writer")
    team.add_edge("writer", END)
    return team.compile()


@agl.rollout
def langgraph_team_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """The LangGraph team, run synchronously."""
    handler = get_active_tracer().get_langchain_handler()  # type: ignore[attr-defined]
    messages = {"messages": [("user", task["question"])]}
    result = _langgraph_team(task, llm).invoke(messages, config={"callbacks": [handler]})
    return _reward(result["messages"][-1].content)


@agl.rollout
async def langgraph_team_agent_async(task: Dict[str, Any], llm: agl.LLM) -> float:
    """The LangGraph team, run asynchronously."""
    handler = get_active_tracer().get_langchain_handler()  # type: ignore[attr-defined]
    messages = {"messages": [("user", task["question"])]}
    result = await _langgraph_team(task, llm).ainvoke(messages, config={"callbacks": [handler]})
    return _reward(result["messages"][-1].content)


@agl.rollout
async def openai_agents_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """An OpenAI Agents SDK agent with a function tool, or with the tools of an MCP server over stdio."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.mcp import MCPServerStdio
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK's own traces go to OpenAI's platform, which is not reachable here
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=AsyncOpenAI(base_url=llm.endpoint, api_key="x"))
    settings = ModelSettings(temperature=0.7)
    if task.get("mcp"):
        params = {"command": sys.executable, "args": [str(MCP_SERVER)]}
        async with MCPServerStdio(params=params, cache_tools_list=True, client_session_timeout_seconds=30) as server:
            agent = Agent(
                name="calculator", instructions=INSTRUCTIONS, model=model, model_settings=settings, mcp_servers=[server]
            )
            result = await Runner.run(agent, task["question"])
    else:

        @function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        agent = Agent(name="calculator", instructions=INSTRUCTIONS, model=model, model_settings=settings, tools=[add])
        result = await Runner.run(agent, task["question"])
    return _reward(result.final_output)


async def _solve_with_mcp_tools(client: Any, session: Any, model: str, question: str) -> str:
    """A hand-written tool loop: one streamed call that asks for tools, the MCP calls, one raw-response call."""
    listed = await session.list_tools()
    tools = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in listed.tools
    ]
    messages: List[Dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": question},
    ]
    stream = await client.chat.completions.create(
        model=model, messages=messages, tools=tools, temperature=0.7, stream=True
    )
    calls: Dict[int, Dict[str, str]] = {}
    async for chunk in stream:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            if delta.function is not None:
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    requested = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()
    ]
    messages.append({"role": "assistant", "content": None, "tool_calls": requested})
    for call in calls.values():
        outcome = await session.call_tool(call["name"], json.loads(call["arguments"]))
        text = "".join(getattr(part, "text", "") for part in outcome.content)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=tools, temperature=0.7
    )
    return str(raw.parse().choices[0].message.content)


@agl.rollout
async def openai_mcp_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """The OpenAI SDK with the tools of an MCP server over stdio, in a hand-written tool loop."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=llm.endpoint, api_key="unused", max_retries=0)
    server = StdioServerParameters(command=sys.executable, args=[str(MCP_SERVER)])
    async with stdio_client(server) as streams, ClientSession(*streams) as session:
        await session.initialize()
        answer = await _solve_with_mcp_tools(client, session, llm.model, task["question"])
    return _reward(answer)
