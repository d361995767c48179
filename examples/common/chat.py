"""What the examples' agents share: the OpenAI client of a rollout, and a chat loop over an MCP server's tools.

:class:`McpToolAgent` is the ``LitAgent`` shape of the calc and rag agents (one such chat per rollout).
:func:`rollout_client` opens an ``openai.AsyncOpenAI`` client on the rollout's ``main_llm`` (during training, the
gateway URL bound to the rollout's attempt). :func:`tool_conversation` starts an MCP server over stdio, offers its
tools to the model as OpenAI function tools, runs each tool call the model makes through the MCP session and sends
the result back, until the model answers without a tool call or the turns run out.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

import agentbolt as agl
from examples.common.rewards import check_format_credit

__all__ = [
    "Episode",
    "McpToolAgent",
    "mcp_tools_as_openai",
    "rollout_client",
    "stdio_server",
    "tool_conversation",
    "worked_tool_call",
]

T = TypeVar("T", bound=Mapping[str, Any])

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def rollout_client(resources: agl.NamedResources, rollout: agl.Rollout) -> AsyncIterator[Tuple[Any, agl.LLM]]:
    """``(client, llm)``: an ``AsyncOpenAI`` client on the ``main_llm`` resource, bound to this rollout's attempt.

    Raises:
        TypeError: ``main_llm`` is missing or not an LLM.
    """
    from openai import AsyncOpenAI

    llm = resources.get("main_llm")
    if not isinstance(llm, agl.LLM):
        raise TypeError(f"the agent needs an LLM resource named 'main_llm', got {type(llm).__name__}")
    attempt_id = rollout.attempt.attempt_id if isinstance(rollout, agl.AttemptedRollout) else None
    base_url = llm.get_base_url(rollout.rollout_id, attempt_id)
    async with AsyncOpenAI(base_url=base_url, api_key=llm.api_key or "unused", max_retries=0) as client:
        yield client, llm


def stdio_server(script: Path) -> Any:
    """MCP ``StdioServerParameters`` running ``python script`` with this repository importable (``examples.*``).

    The MCP client starts servers with a minimal environment (no ``PYTHONPATH``), so the repository root is put
    there explicitly.
    """
    from mcp import StdioServerParameters

    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return StdioServerParameters(command=sys.executable, args=[str(script)], env={"PYTHONPATH": path})


def mcp_tools_as_openai(tools: Sequence[Any]) -> List[Dict[str, Any]]:
    """MCP tool descriptions (``list_tools().tools``) as OpenAI function-tool schemas."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in tools
    ]


@dataclass
class Episode:
    """What happened in one conversation.

    Attributes:
        reply: The model's last message.
        tool_calls: ``(name, arguments, result)`` of every tool call, in order.
        turns: LLM calls made.
    """

    reply: str = ""
    tool_calls: List[Tuple[str, str, str]] = field(default_factory=list)
    turns: int = 0

    @property
    def tool_succeeded(self) -> bool:
        """Whether some tool call ran and returned something other than an error."""
        return any(not result.startswith("error") for _, _, result in self.tool_calls)


async def _call_tool(session: Any, name: str, arguments: str, known: set) -> str:
    """Run one tool call through the MCP session; every failure becomes an ``error: ...`` text for the model."""
    if name not in known:
        return f"error: unknown tool {name!r}"
    try:
        payload = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return "error: the arguments are not JSON"
    if not isinstance(payload, dict):
        return "error: the arguments must be a JSON object"
    result = await session.call_tool(name, payload)
    text = "".join(getattr(part, "text", "") for part in result.content)
    return f"error: {text}" if result.is_error and not text.startswith("error") else text


async def tool_conversation(
    client: Any,
    model: str,
    messages: List[Dict[str, Any]],
    server_script: Path,
    *,
    sampling_parameters: Optional[Dict[str, Any]] = None,
    max_turns: int = 2,
    max_tokens: int = 48,
) -> Episode:
    """Chat with the model, the tools of the MCP server ``server_script`` (started over stdio) offered to it.

    Args:
        client: An ``openai.AsyncOpenAI`` client.
        model: Model name to request.
        messages: The conversation so far (system prompt, worked examples, question); extended in place.
        server_script: The MCP server, run as ``python server_script``.
        sampling_parameters: Extra ``chat.completions.create`` arguments (temperature, ...).
        max_turns: LLM calls at most.
        max_tokens: Completion budget of each call (a ``max_tokens`` in ``sampling_parameters`` wins).
    """
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    params = {"max_tokens": max_tokens, **dict(sampling_parameters or {})}
    episode = Episode()
    async with stdio_client(stdio_server(server_script)) as streams, ClientSession(*streams) as session:
        await session.initialize()
        listed = (await session.list_tools()).tools
        tools = mcp_tools_as_openai(listed)
        known = {t.name for t in listed}
        for _ in range(max_turns):
            response = await client.chat.completions.create(model=model, messages=messages, tools=tools, **params)
            episode.turns += 1
            message = response.choices[0].message
            episode.reply = message.content or ""
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
            for call in message.tool_calls:
                result = await _call_tool(session, call.function.name, call.function.arguments, known)
                episode.tool_calls.append((call.function.name, call.function.arguments, result))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return episode


def worked_tool_call(
    call_id: str, question: str, tool: str, arguments: Dict[str, Any], result: str, answer: str
) -> List[Dict[str, Any]]:
    """One worked conversation: the question, a tool call, its result, the answer (shown before the real question)."""
    call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": answer},
    ]


class McpToolAgent(agl.LitAgent[T]):
    """An agent answering each task's ``question`` in one chat with the tools of an MCP server offered.

    Subclasses set :attr:`system_prompt` and :attr:`server_script`, may show worked conversations
    (:meth:`few_shot`), and turn the :class:`Episode` of :meth:`episode` into a reward.

    Args:
        format_credit: Training-only partial credit for steps done right (subclasses decide which; a wrong answer
            earns it at most twice, so it is below 0.5).
        max_turns: LLM calls per conversation at most.
        max_tokens: Completion budget per call.

    Raises:
        ValueError: ``format_credit`` is negative or not below 0.5.
    """

    system_prompt: ClassVar[str] = ""
    server_script: ClassVar[Path]

    def __init__(self, *, format_credit: float = 0.1, max_turns: int = 2, max_tokens: int = 48) -> None:
        super().__init__()
        self.format_credit = check_format_credit(format_credit)
        self.max_turns = max_turns
        self.max_tokens = max_tokens

    def few_shot(self) -> List[Dict[str, Any]]:
        """Worked conversations shown before the question (none by default)."""
        return []

    async def converse(
        self, client: Any, model: str, question: str, sampling_parameters: Optional[Dict[str, Any]] = None
    ) -> Episode:
        """The conversation for one question, with an ``openai.AsyncOpenAI`` client."""
        messages = [{"role": "system", "content": self.system_prompt}, *self.few_shot()]
        messages.append({"role": "user", "content": question})
        return await tool_conversation(
            client, model, messages, self.server_script,
            sampling_parameters=sampling_parameters, max_turns=self.max_turns, max_tokens=self.max_tokens,
        )  # fmt: skip

    async def episode(self, task: T, resources: agl.NamedResources, rollout: agl.Rollout) -> Episode:
        """The rollout's conversation, on its ``main_llm`` (through the gateway during training)."""
        async with rollout_client(resources, rollout) as (client, llm):
            return await self.converse(client, llm.model, str(task["question"]), llm.sampling_parameters)
