"""Per-rollout memory of the solver: the actions taken so far and what they returned.

Each rollout (or ``solve`` call) owns one :class:`Memory`, so concurrent rollouts never share state. Everything
stored is text cut to a fixed budget, keeping prompts short enough for a small model's context: long tool outputs
keep their head and tail, which is where results and error messages usually are.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List

__all__ = ["Action", "Memory", "truncate"]


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` characters, keeping its head and tail around a ``...`` marker."""
    if limit < 5:
        raise ValueError(f"limit must be at least 5, got {limit}")
    text = text.strip()
    if len(text) <= limit:
        return text
    head = (limit - 5) * 2 // 3
    tail = limit - 5 - head
    return f"{text[:head]} ... {text[len(text) - tail :]}" if tail else f"{text[:head]} ..."


@dataclass
class Action:
    """One executed step."""

    step: int
    tool_name: str
    sub_goal: str
    tool_input: str
    result: str


@dataclass
class Memory:
    """Actions of one rollout, truncated on insertion.

    Args:
        max_result_chars: Budget of each stored tool result.
        max_input_chars: Budget of each stored sub-goal and tool input.
        max_actions_in_prompt: How many of the most recent actions :meth:`render` shows.
    """

    max_result_chars: int = 400
    max_input_chars: int = 200
    max_actions_in_prompt: int = 5
    actions: List[Action] = field(default_factory=list)

    def add(self, tool_name: str, sub_goal: str, tool_input: str, result: str) -> Action:
        """Record an executed step (texts are truncated) and return it."""
        action = Action(
            step=len(self.actions) + 1,
            tool_name=tool_name,
            sub_goal=truncate(sub_goal, self.max_input_chars),
            tool_input=truncate(tool_input, self.max_input_chars),
            result=truncate(result, self.max_result_chars),
        )
        self.actions.append(action)
        return action

    def render(self) -> str:
        """The recent actions as compact prompt text, one line each (``"none yet"`` when empty).

        A line is ``Step N (tool): input -> result``: what a small model needs to carry a value from one step to the
        next, without the sub-goals (the planner wrote them; the input says what was actually done).
        """
        if not self.actions:
            return "none yet"
        hidden = len(self.actions) - self.max_actions_in_prompt
        lines = [f"({hidden} earlier step(s) omitted)"] if hidden > 0 else []
        for action in self.actions[-self.max_actions_in_prompt :]:
            lines.append(f"Step {action.step} ({action.tool_name}): {action.tool_input} -> {action.result}")
        return "\n".join(lines)

    def last_result(self) -> str:
        """The newest tool result (``"none"`` before the first step): where the solution generator copies from."""
        return self.actions[-1].result if self.actions else "none"

    def to_list(self) -> List[Dict[str, Any]]:
        """The actions as plain dicts (JSON-serialisable)."""
        return [asdict(action) for action in self.actions]
