"""The example's math agent: plain OpenAI-SDK code with a calculator function tool.

The agent shows the model one worked conversation, asks the question with a ``calculator`` tool, runs the tool calls
the model makes and sends the results back, and scores the final reply with :func:`examples.sft.grader
.compute_reward` (the reply must end with ``### <number> ###``). The calculator is the demo's safe arithmetic
evaluator.

**Context distillation.** In training rollouts (``rollout.mode == "train"``) the agent is its own teacher: it shows
the model one worked conversation per arithmetic shape (:data:`TEACHER_FEW_SHOT`) instead of the single one it is
deployed with (:data:`FEW_SHOT`). :func:`student_prompt`, the SFT run's ``student_prompt`` option, puts each recorded
call back into the deployed prompt, so the model learns to answer from the short prompt as it does from the long one.
The only agentbolt parts are the ``LLM`` resource it receives (an endpoint of the gateway, bound to the rollout), the
rollout (for its mode) and the reward it returns.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import agentbolt as agl
from agentbolt.demo.agent import CALCULATOR_TOOL, CalculatorError, calculate
from examples.sft.data import GsmProblem
from examples.sft.grader import compute_reward

__all__ = ["FEW_SHOT", "SYSTEM_PROMPT", "TEACHER_FEW_SHOT", "math_agent", "prompt_messages", "solve", "student_prompt"]

SYSTEM_PROMPT = (
    "You solve math word problems. Call the calculator tool with the arithmetic expression, then reply with only "
    "the numeric answer wrapped like ### <answer> ###."
)
"""The system prompt."""


def worked_example(call_id: str, question: str, expression: str) -> List[Dict[str, Any]]:
    """One worked conversation: the question, a calculator call, its result and the answer line."""
    result = calculate(expression)
    arguments = json.dumps({"expression": expression})
    return [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": f"### {result} ###"},
    ]


FEW_SHOT: List[Dict[str, Any]] = worked_example(
    "call_example", "Lena has 14 bags with 9 oranges in each bag. How many oranges does Lena have?", "14 * 9"
)
"""The worked conversation the agent is deployed with (a 135M model does not call tools from a description alone)."""

TEACHER_FEW_SHOT: List[Dict[str, Any]] = [
    *FEW_SHOT,
    *worked_example("call_sum", "A shop sells 245 red pens and 318 blue pens. How many pens does the shop sell?", "245 + 318"),
    *worked_example("call_difference", "Omar has 512 stamps and gives 187 of them to his sister. How many stamps does Omar have left?", "512 - 187"),
    *worked_example("call_quotient", "A baker splits 96 cookies evenly into 8 boxes. How many cookies go in each box?", "96 / 8"),
    *worked_example("call_product_plus", "A zoo has 7 cages with 6 birds in each cage and 13 more birds in the aviary. How many birds does the zoo have?", "7 * 6 + 13"),
    *worked_example("call_product_minus", "Nina bakes 12 trays of 8 rolls and sells 35 rolls. How many rolls are left?", "12 * 8 - 35"),
]  # fmt: skip
"""The teacher's worked conversations, one per arithmetic shape, shown in training rollouts only. Their stories are
neither training nor held-out stories."""


def prompt_messages(question: str, shots: List[Dict[str, Any]] = FEW_SHOT) -> List[Dict[str, Any]]:
    """The messages the agent asks ``question`` with: system prompt, worked conversations, the question."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, *shots, {"role": "user", "content": question}]


def student_prompt(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The deployed prompt around the conversation of a recorded call (the SFT run's ``student_prompt`` option).

    The conversation starts at the question, the last user message; what comes before it (the system prompt and the
    worked conversations, the teacher's or the deployed ones) becomes the deployed system prompt and worked example.
    """
    start = max(i for i, message in enumerate(messages) if message.get("role") == "user")
    return [*prompt_messages(messages[start]["content"]), *messages[start + 1 :]]


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


async def solve(
    client: Any,
    model: str,
    question: str,
    sampling: Optional[Dict[str, Any]] = None,
    shots: List[Dict[str, Any]] = FEW_SHOT,
) -> str:
    """Run the tool-calling conversation for ``question`` with an ``openai.AsyncOpenAI`` client; the last reply."""
    messages = prompt_messages(question, shots)
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
async def math_agent(task: GsmProblem, llm: agl.LLM, rollout: agl.Rollout) -> float:
    """Solve one problem with the served model; the reward is 1.0 for the right answer line, else 0.0.

    Training rollouts show the teacher's worked conversations, all others the deployed one.
    """
    from openai import AsyncOpenAI

    shots = TEACHER_FEW_SHOT if rollout.mode == "train" else FEW_SHOT
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        reply = await solve(client, llm.model, task["question"], llm.sampling_parameters, shots)
    return compute_reward(reply, task["answer"])
