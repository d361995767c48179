"""Generalist: answers a question from the fixed LLM's own knowledge (may be wrong; the prompts say so)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from examples.flow_grpo.tools.base import Tool, ToolMetadata, ToolResult

if TYPE_CHECKING:
    from examples.flow_grpo.agents import RoleLLM

__all__ = ["GeneralistTool"]


class GeneralistTool(Tool):
    """Asks the fixed LLM directly (recorded under the role name ``generalist``, never trained).

    Args:
        llm: The fixed LLM.
        max_tokens: Answer budget.
    """

    metadata = ToolMetadata(
        name="generalist",
        description="Asks a general language model; for common knowledge, may be wrong.",
        input_description="A self-contained question.",
        examples=(("none", "Why is the sky blue?", "Why is the sky blue?"),),
    )

    def __init__(self, llm: RoleLLM, max_tokens: int = 64) -> None:
        self.llm = llm
        self.max_tokens = max_tokens

    def run(self, tool_input: str) -> ToolResult:
        """Ask the question; an endpoint failure raises and becomes an error observation."""
        from examples.flow_grpo.agents import GENERALIST
        from examples.flow_grpo.prompts import GENERALIST_SYSTEM

        answer = self.llm.chat(GENERALIST, GENERALIST_SYSTEM, tool_input.strip(), max_tokens=self.max_tokens)
        return ToolResult(answer.strip() or "(no answer)", ok=bool(answer.strip()))
