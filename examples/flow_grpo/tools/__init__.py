"""The solver's tools: Python runner, calculator, BM25 search over the local corpus, generalist LLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from examples.flow_grpo.tools.base import Tool, Toolbox, ToolMetadata, ToolResult, normalize_tool_name
from examples.flow_grpo.tools.calculator import CalculatorTool, evaluate_expression, extract_expression
from examples.flow_grpo.tools.generalist import GeneralistTool
from examples.flow_grpo.tools.python_runner import PythonRunResult, PythonTool, run_python
from examples.flow_grpo.tools.search import BM25Index, Document, SearchTool, load_corpus, stem

if TYPE_CHECKING:
    from examples.flow_grpo.agents import RoleLLM

__all__ = [
    "BM25Index",
    "CalculatorTool",
    "Document",
    "GeneralistTool",
    "PythonRunResult",
    "PythonTool",
    "SearchTool",
    "Tool",
    "ToolMetadata",
    "ToolResult",
    "Toolbox",
    "default_toolbox",
    "evaluate_expression",
    "extract_expression",
    "load_corpus",
    "normalize_tool_name",
    "run_python",
    "stem",
]


def default_toolbox(fixed_llm: RoleLLM, *, search: Optional[Tool] = None, python_timeout: float = 10.0) -> Toolbox:
    """The four tools in prompt order: python, calculator, search (``search``, default: a :class:`SearchTool` over
    the shipped corpus), generalist (answering with ``fixed_llm``)."""
    return Toolbox(
        [PythonTool(timeout=python_timeout), CalculatorTool(), search or SearchTool(), GeneralistTool(fixed_llm)]
    )
