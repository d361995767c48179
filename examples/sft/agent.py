"""The example's math agent: plain OpenAI-SDK code with a calculator function tool.

The agent shows the model one worked conversation, asks the question with a ``calculator`` tool, runs the tool calls
the model makes and sends the results back, and scores the final reply with :func:`examples.sft.grader
.compute_reward` (the reply must end with ``### <number> ###``). Nothing here knows about training: the only
agentbolt parts are the ``LLM`` resource it receives (an endpoint of the gateway, bound to the rollout) and the
reward it returns. The calculator is the demo's safe arithmetic evaluator.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import agentbolt as agl
from agentbolt.demo.agent import CALCULATOR_TOOL, CalculatorError, calculate
from examples.sft.data import GsmProblem
from examples.sft.grader import compute_reward

__all__ = ["FEW_SHOT", "SYSTEM_PROMPT", "math_agent", "solve"]

SYSTEM_PROMPT = (
    "You solve math word problems. Call the calculator tool with the arithmetic expression, then reply with only "
    "the numeric answer wrapped like ### <answer> ###."
)
"""The system prompt."""

FEW_SHOT: List[Dict[str, Any]] = [
    {"role": "user", "content": "Lena has 14 bags with 9 oranges in each bag. How many oranges does Lena have?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": "14 * 9"})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_example", "content": "126"},
    {"role": "assistant", "content": "### 126 ###"},
]
"""One worked conversation shown before the question (a 135M model does not call tools from a description alone)."""

MAX_TURNS = 3
MAX_TOKENS = 48


def _run_tool(name: str, arguments: str) -> str:
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        payload = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return "error: arguments are not JSON"
    expression = payload.get("expression") if isinstance(payload, dict) else None
    if not isinstance(expression, (str, int, float)):
        return "error: missing 'expression'"
    try:
        return calculate(str(expression))
    except CalculatorError as exc:
        return f"error: {exc}"


async def solve(client: Any, model: str, question: str, sampling: Optional[Dict[str, Any]] = None) -> str:
    """Run the tool-calling conversation for ``question`` with an ``openai.AsyncOpenAI`` client; the last reply."""
    messages: List[Dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, *FEW_SHOT]
    messages.append({"role": "user", "content": question})
    params = {"max_tokens": MAX_TOKENS, **(sampling or {})}
    reply = ""
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR_TOOL], **params
        )
        message = response.choices[0].message
        reply = message.content or ""
        if not message.tool_calls:
            break
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
        messages.append({"role": "assistant", "content": reply, "tool_calls": calls})
        for call in message.tool_calls:
            result = _run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return reply


@agl.rollout
async def math_agent(task: GsmProblem, llm: agl.LLM) -> float:
    """Solve one problem with the served model; the reward is 1.0 for the right answer line, else 0.0."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        reply = await solve(client, llm.model, task["question"], llm.sampling_parameters)
    return compute_reward(reply, task["answer"])
