"""The demo agent: ordinary OpenAI-SDK code with a calculator function tool.

Nothing here knows about training. The agent asks the model the question with a ``calculator`` tool, runs the
tool call the model makes, sends the result back, and reads ``ANSWER: <n>`` from the model's final message. The
only agentbolt parts are the ``LLM`` resource it is given (an endpoint on the gateway) and the reward it returns.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from agentbolt.demo.task import DEMONSTRATIONS, ArithmeticTask, parse_answer
from agentbolt.litagent import LitAgent
from agentbolt.types import LLM, AttemptedRollout, NamedResources, Rollout

__all__ = [
    "CALCULATOR_TOOL",
    "CalculatorAgent",
    "CalculatorError",
    "Episode",
    "FEW_SHOT",
    "RewardConfig",
    "SYSTEM_PROMPT",
    "calculate",
    "run_episode",
    "score",
]

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a math assistant. To compute, call the calculator tool with the expression. When you get the "
    "result, reply with exactly 'ANSWER: <number>'."
)
"""The system prompt of the demo agent."""

CALCULATOR_TOOL: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "For example '37 * 12'."}},
            "required": ["expression"],
        },
    },
}
"""The OpenAI function-tool schema of the calculator."""


def _demonstration(call_id: str, task: ArithmeticTask) -> List[Dict[str, Any]]:
    arguments = json.dumps({"expression": task["expression"]})
    return [
        {"role": "user", "content": task["question"]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": str(task["answer"])},
        {"role": "assistant", "content": f"ANSWER: {task['answer']}"},
    ]


FEW_SHOT: List[Dict[str, Any]] = [
    message
    for number, task in enumerate(DEMONSTRATIONS, start=1)
    for message in _demonstration(f"call_demo_{number}", task)
]
"""Two worked conversations shown before the question (a 135M model does not call tools from a description alone).

Their questions are :data:`agentbolt.demo.task.DEMONSTRATIONS`, which no generated question repeats."""

_BINARY: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_MAX_MAGNITUDE = 10**12
_TIMES = re.compile("[xX\u00d7]")
_NON_DECIMAL_LITERAL = re.compile(r"(?<![\w.])0[xXbBoO]\w")


class CalculatorError(ValueError):
    """The expression is not plain arithmetic (or is too large)."""


def calculate(expression: str) -> str:
    """Evaluate ``+ - * /`` arithmetic on decimal numbers, safely (no names, no calls, bounded size); ``x``, ``X`` and
    ``\u00d7`` also mean times.

    Returns:
        The result as text: an integer when the value is whole, else rounded to 6 decimals.

    Raises:
        CalculatorError: Anything but arithmetic on numbers, division by zero, a result beyond 1e12, or an
            expression nested or long beyond what Python parses.
    """
    if _NON_DECIMAL_LITERAL.search(expression):  # "0x10": hexadecimal 16, or 0 times 10?
        raise CalculatorError(f"write numbers in decimal: {expression!r} reads as a hexadecimal, octal or binary one")
    try:
        tree = ast.parse(_TIMES.sub("*", expression), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # the parser's limits: nesting, digits
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from exc

    def bounded(value: float) -> float:
        if abs(value) > _MAX_MAGNITUDE:
            raise CalculatorError("number too large")
        return value

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return evaluate(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return bounded(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = evaluate(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise CalculatorError("division by zero")
            return bounded(_BINARY[type(node.op)](left, right))
        raise CalculatorError(f"not an arithmetic expression: {expression!r}")

    try:
        value = evaluate(tree)
    except RecursionError as exc:
        raise CalculatorError("expression nested too deeply") from exc
    return str(int(value)) if float(value).is_integer() else str(round(value, 6))


@dataclass
class Episode:
    """What happened in one conversation.

    Attributes:
        tool_calls: Calculator calls the model made (expressions), in order.
        tool_results: What the tool answered to each (a number or an error message).
        final_text: The model's last message.
        answer: The integer parsed from ``final_text`` (None if not in the required format).
        turns: LLM calls made.
    """

    tool_calls: List[str] = field(default_factory=list)
    tool_results: List[str] = field(default_factory=list)
    final_text: str = ""
    answer: Optional[int] = None
    turns: int = 0


WRONG_ANSWER_CREDIT_LIMIT = 0.5
"""What a wrong answer may earn at most, exclusive: a correct answer (1.0) always earns more than twice as much."""


@dataclass(frozen=True)
class RewardConfig:
    """How an episode is scored.

    A correct answer always scores 1.0; only a correct answer does, so held-out accuracy (reward >= 1) is the strict
    metric. Partial *format credit* (below 1) rewards the steps towards it and gives GRPO a signal when correct
    answers are rare.

    Attributes:
        tool_credit: Reward for a well-formed calculator call when the answer is wrong.
        format_credit: Reward for an ``ANSWER: <n>`` line when the answer is wrong (added to ``tool_credit``).

    Raises:
        ValueError: A credit is negative or not finite, or a wrong answer could earn :data:`WRONG_ANSWER_CREDIT_LIMIT`
            or more (the two credits together).
    """

    tool_credit: float = 0.0
    format_credit: float = 0.0

    def __post_init__(self) -> None:
        for name in ("tool_credit", "format_credit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number of at least 0, got {value!r}")
        if self.tool_credit + self.format_credit >= WRONG_ANSWER_CREDIT_LIMIT:
            raise ValueError(
                f"tool_credit + format_credit must be below {WRONG_ANSWER_CREDIT_LIMIT:g} so that a correct answer "
                f"earns more than twice what a wrong one can, got {self.tool_credit:g} + {self.format_credit:g}"
            )


def score(episode: Episode, task: ArithmeticTask, config: RewardConfig = RewardConfig()) -> float:
    """The reward of an episode: 1.0 for the correct number in the required format, else format credit."""
    if episode.answer is not None and episode.answer == task["answer"]:
        return 1.0
    reward = 0.0
    if any(not result.startswith("error") for result in episode.tool_results):
        reward += config.tool_credit
    if episode.answer is not None:
        reward += config.format_credit
    return reward


def _run_tool(name: str, arguments: str) -> tuple[Optional[str], str]:
    """Run one tool call; returns (expression, result text)."""
    if name != "calculator":
        return None, f"error: unknown tool {name!r}"
    try:
        payload = json.loads(arguments or "{}")
    except (ValueError, RecursionError):  # not JSON, nested too deeply, or a number of thousands of digits
        return None, "error: arguments are not JSON"
    expression = payload.get("expression") if isinstance(payload, dict) else None
    if not isinstance(expression, (str, int, float)):
        return None, "error: missing 'expression'"
    try:
        return str(expression), calculate(str(expression))
    except CalculatorError as exc:
        return str(expression), f"error: {exc}"


async def run_episode(
    client: Any,
    model: str,
    task: ArithmeticTask,
    *,
    sampling_parameters: Optional[Dict[str, Any]] = None,
    system_prompt: Optional[str] = SYSTEM_PROMPT,
    few_shot: bool = True,
    max_turns: int = 2,
    max_tokens: int = 48,
) -> Episode:
    """Run the tool-calling conversation for one task with an ``openai.AsyncOpenAI`` client.

    Args:
        client: The OpenAI client (its base URL is the gateway).
        model: Model name to request.
        task: The question.
        sampling_parameters: Extra ``chat.completions.create`` arguments (temperature, ...).
        system_prompt: System message (None: the model's default).
        few_shot: Show the worked conversations of :data:`FEW_SHOT` before the question.
        max_turns: LLM calls at most; the last one may still only answer.
        max_tokens: Completion budget of each call.

    Returns:
        The episode (reward it with :func:`score`).
    """
    messages: List[Dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    if few_shot:
        messages.extend(FEW_SHOT)
    messages.append({"role": "user", "content": task["question"]})
    episode = Episode()
    params = dict(sampling_parameters or {})
    params.setdefault("max_tokens", max_tokens)
    for _ in range(max_turns):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR_TOOL], **params
        )
        episode.turns += 1
        message = response.choices[0].message
        episode.final_text = message.content or ""
        if not message.tool_calls:
            break
        messages.append(
            {
                "role": "assistant",
                "content": message.content or "",
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in message.tool_calls
                ],
            }
        )
        for call in message.tool_calls:
            expression, result = _run_tool(call.function.name, call.function.arguments)
            episode.tool_calls.append(expression or "")
            episode.tool_results.append(result)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    episode.answer = parse_answer(episode.final_text)
    return episode


class CalculatorAgent(LitAgent[ArithmeticTask]):
    """The demo agent as a :class:`~agentbolt.litagent.LitAgent`: one conversation per rollout, reward returned.

    Args:
        reward: Format-credit settings used for training rollouts (validation is always strict).
        system_prompt: System message.
        few_shot: Show worked conversations before the question.
        max_turns: LLM calls per episode at most.
        max_tokens: Completion budget per call.
    """

    def __init__(
        self,
        *,
        reward: RewardConfig = RewardConfig(),
        system_prompt: Optional[str] = SYSTEM_PROMPT,
        few_shot: bool = True,
        max_turns: int = 2,
        max_tokens: int = 48,
    ) -> None:
        super().__init__()
        self.reward = reward
        self.system_prompt = system_prompt
        self.few_shot = few_shot
        self.max_turns = max_turns
        self.max_tokens = max_tokens

    async def _episode(self, task: ArithmeticTask, resources: NamedResources, rollout: Rollout) -> Episode:
        from openai import AsyncOpenAI

        llm = next((r for r in resources.values() if isinstance(r, LLM)), None)
        if llm is None:
            raise ValueError("the demo agent needs an LLM resource")
        attempt_id = rollout.attempt.attempt_id if isinstance(rollout, AttemptedRollout) else None
        base_url = llm.get_base_url(rollout.rollout_id, attempt_id)
        async with AsyncOpenAI(base_url=base_url, api_key=llm.api_key or "unused", max_retries=0) as client:
            return await run_episode(
                client,
                llm.model,
                task,
                sampling_parameters=llm.sampling_parameters,
                system_prompt=self.system_prompt,
                few_shot=self.few_shot,
                max_turns=self.max_turns,
                max_tokens=self.max_tokens,
            )

    async def training_rollout_async(self, task: ArithmeticTask, resources: NamedResources, rollout: Rollout) -> float:
        """Run one training episode; the reward includes format credit."""
        return score(await self._episode(task, resources, rollout), task, self.reward)

    async def validation_rollout_async(
        self, task: ArithmeticTask, resources: NamedResources, rollout: Rollout
    ) -> float:
        """Run one validation episode; the reward is strict (1 correct, 0 otherwise)."""
        return score(await self._episode(task, resources, rollout), task)
