"""One interface for every tool: metadata shown to the planner and executor, and an ``execute`` that never raises."""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = ["Tool", "ToolMetadata", "ToolResult", "Toolbox", "normalize_tool_name"]

logger = logging.getLogger(__name__)


def normalize_tool_name(name: str) -> str:
    """Case- and punctuation-insensitive form of a tool name (``"Python_Code"`` == ``"python code"``)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class ToolMetadata:
    """What the prompts say about a tool.

    Attributes:
        name: The exact name the planner must use.
        description: One line: what the tool does and when to use it.
        input_description: What the single input string must contain.
        examples: Worked executor examples ``(last_result, sub_goal, tool_input)``, shown to the executor as
            earlier chat turns (a 135M model copies demonstrated inputs far more reliably than it follows a
            description); ``last_result`` is the newest tool result the executor sees ("none" before any).
        aliases: Other names the planner may use for this tool (``math`` for the calculator); not shown in prompts.
    """

    name: str
    description: str
    input_description: str
    examples: Tuple[Tuple[str, str, str], ...] = ()
    aliases: Tuple[str, ...] = ()

    def one_line(self) -> str:
        """``name: description``, the form used in the planner's and analyzer's tool lists (the executor alone
        needs the input format)."""
        return f"{self.name}: {self.description}"


@dataclass
class ToolResult:
    """What a tool returned: the observation text stored in memory, and whether it succeeded."""

    output: str
    ok: bool = True


class Tool(ABC):
    """A tool taking one input string. Subclasses set :attr:`metadata` and implement :meth:`run`."""

    metadata: ToolMetadata

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.metadata.name

    @abstractmethod
    def run(self, tool_input: str) -> ToolResult:
        """Do the work; may raise, :meth:`execute` turns exceptions into error observations."""

    def execute(self, tool_input: str) -> ToolResult:
        """Run the tool; any failure becomes an error observation (never an exception)."""
        if not tool_input.strip():
            return ToolResult(f"Error: {self.name} needs an input ({self.metadata.input_description}).", ok=False)
        try:
            return self.run(tool_input)
        except Exception as exc:  # tool errors are observations for the agent, not crashes
            logger.debug("Tool %s failed on %r", self.name, tool_input, exc_info=True)
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", ok=False)


class Toolbox:
    """The tools of one solver, looked up by (tolerantly matched) name or alias.

    Raises:
        ValueError: Two tools share a name or an alias.
    """

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: Dict[str, Tool] = {}
        self._by_key: Dict[str, Tool] = {}
        for tool in tools:
            self._tools[normalize_tool_name(tool.name)] = tool
            for key in {normalize_tool_name(n) for n in (tool.name, *tool.metadata.aliases)}:
                if key in self._by_key:
                    raise ValueError(f"duplicate tool name {key!r}")
                self._by_key[key] = tool

    @property
    def names(self) -> List[str]:
        """Tool names, in registration order."""
        return [tool.name for tool in self._tools.values()]

    def get(self, name: str) -> Optional[Tool]:
        """The tool called ``name`` or one of its aliases (case and ``_``/``-``/space insensitive), or None."""
        return self._by_key.get(normalize_tool_name(name))

    def describe(self) -> str:
        """One line per tool, for prompts."""
        return "\n".join(f"- {tool.metadata.one_line()}" for tool in self._tools.values())

    def execute(self, name: str, tool_input: str) -> ToolResult:
        """Run tool ``name``; an unknown name is an error observation listing the valid names."""
        tool = self.get(name)
        if tool is None:
            return ToolResult(f"Error: unknown tool {name!r}; available tools: {', '.join(self.names)}.", ok=False)
        return tool.execute(tool_input)
