"""The calc agent: OpenAI-SDK chat calls with the tools of an MCP calculator server.

Per rollout the agent starts ``calculator_server.py`` over stdio, lists its tools and offers them to the model as
OpenAI function tools; when the model calls one, the agent runs it through the MCP session and sends the result
back. The model's last message must end with ``ANSWER: <n>``. Two worked conversations (question, tool call, tool
result, answer) come before the question: a 135M model calls tools it is shown being used, not tools it is only
told about. Nothing here knows about training: the agent reads the ``main_llm`` resource and returns a reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import agentbolt as agl
from examples.calc.task import CalcTask, answer_instruction, reward
from examples.common.chat import McpToolAgent, worked_tool_call

__all__ = ["SERVER_SCRIPT", "SYSTEM_PROMPT", "CalcAgent", "few_shot"]

SERVER_SCRIPT = Path(__file__).resolve().with_name("calculator_server.py")
SYSTEM_PROMPT = (
    "You solve word problems. Call the calculate tool with the arithmetic expression, then reply with exactly "
    "'ANSWER: <number>'."
)


def few_shot() -> List[Dict[str, Any]]:
    """Two worked conversations in the style of the training frames (never a held-out frame)."""
    first = "A club orders 14 boxes with 23 balls in each box. How many balls are there?"
    second = "A bus had 512 riders and 187 got off. How many riders are left?"
    return worked_tool_call(
        "call_example_1", f"{first} {answer_instruction()}", "calculate", {"expression": "14 * 23"}, "322", "ANSWER: 322"
    ) + worked_tool_call(
        "call_example_2", f"{second} {answer_instruction()}", "calculate", {"expression": "512 - 187"}, "325",
        "ANSWER: 325",
    )  # fmt: skip


class CalcAgent(McpToolAgent[CalcTask]):
    """The calc agent as a ``LitAgent``: one MCP-backed conversation per rollout, its reward returned.

    Args:
        format_credit: Training-only partial credit (see :func:`examples.calc.task.reward`); validation is strict.
        max_turns: LLM calls per conversation at most.
        max_tokens: Completion budget per call.
    """

    system_prompt = SYSTEM_PROMPT
    server_script = SERVER_SCRIPT

    def few_shot(self) -> List[Dict[str, Any]]:
        """The two worked conversations of :func:`few_shot`."""
        return few_shot()

    async def training_rollout_async(
        self, task: CalcTask, resources: agl.NamedResources, rollout: agl.Rollout
    ) -> float:
        """A training conversation; the reward includes format credit."""
        episode = await self.episode(task, resources, rollout)
        return reward(episode.reply, task, called_tool=episode.tool_succeeded, format_credit=self.format_credit)

    async def validation_rollout_async(
        self, task: CalcTask, resources: agl.NamedResources, rollout: agl.Rollout
    ) -> float:
        """A held-out conversation; the reward is strict (1 correct, 0 otherwise)."""
        episode = await self.episode(task, resources, rollout)
        return reward(episode.reply, task)
