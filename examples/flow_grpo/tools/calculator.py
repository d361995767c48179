"""Calculator: evaluates one arithmetic expression safely (an AST walk, never ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any, Callable, Dict, Optional, Union

from examples.flow_grpo.tools.base import Tool, ToolMetadata, ToolResult

__all__ = ["CalculatorTool", "evaluate_expression", "extract_expression"]

Number = Union[int, float]

_BINARY: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: Dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: Dict[str, Callable[..., Number]] = {
    "sqrt": math.sqrt,
    "log": math.log,
    "ln": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": math.factorial,
    "min": min,
    "max": max,
    "gcd": math.gcd,
}
_CONSTANTS: Dict[str, float] = {"pi": math.pi, "e": math.e}
_MAX_EXPONENT = 10_000
_MAX_FACTORIAL = 1_000
_MAX_RESULT_BITS = 100_000


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(left) not in (0, 1):
            bits = abs(right) * max(1.0, math.log2(abs(left))) if isinstance(left, int) else 0.0
            if abs(right) > _MAX_EXPONENT or bits > _MAX_RESULT_BITS:
                raise ValueError(f"the power {left}**{right} is too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise ValueError("keyword arguments are not supported")
        args = [_eval(arg) for arg in node.args]
        if node.func.id == "factorial" and args and args[0] > _MAX_FACTORIAL:
            raise ValueError(f"factorial argument {args[0]} is too large")
        return _FUNCTIONS[node.func.id](*args)
    raise ValueError(
        f"unsupported element {ast.unparse(node)!r}" if isinstance(node, ast.expr) else "unsupported input"
    )


def evaluate_expression(expression: str) -> Number:
    """Evaluate an arithmetic expression.

    Supports ``+ - * / // % **`` (``^`` is read as a power), parentheses, ``pi``, ``e`` and the functions
    ``sqrt log ln log10 log2 exp sin cos tan abs round floor ceil factorial min max gcd``. Thousands separators
    (``1,000``) are not supported: commas separate function arguments.

    Raises:
        ValueError: The expression is empty, malformed, uses anything else, or is too expensive.
        ZeroDivisionError: Division by zero.
    """
    text = expression.strip().rstrip("=").strip().replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/")
    if not text:
        raise ValueError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a valid expression: {exc.msg}") from None
    return _eval(tree)


_EXPRESSION_SPAN = re.compile(r"[\d(][\d\s+\-*/().^\u00d7\u00f7]*")
_OPERATOR = re.compile(r"\d\s*\)*\s*(?:\*\*|[-+*/^\u00d7\u00f7])\s*\(*\s*\d")


def extract_expression(text: str) -> Optional[str]:
    """The longest arithmetic expression written inside ``text`` (``"What is (10 + 21) * 2?"`` -> ``(10 + 21) * 2``).

    Only spans made of digits, spaces, parentheses and operators that join two numbers count; None when there is
    none. The calculator falls back to this when its input is a sentence rather than an expression.
    """
    spans = [m.group(0).strip().rstrip(".").strip() for m in _EXPRESSION_SPAN.finditer(text)]
    spans = [span for span in spans if _OPERATOR.search(span)]
    return max(spans, key=len) if spans else None


def _format(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class CalculatorTool(Tool):
    """Evaluates one arithmetic expression and returns its value alone (the memory shows the input next to it)."""

    metadata = ToolMetadata(
        name="calculator",
        description="Computes arithmetic on numbers exactly.",
        input_description="One expression such as 1688 - 1620.",
        examples=(
            (
                "The Iron Treaty was in force from 1620 to 1688.",
                "How many years was the Iron Treaty in force?",
                "1688 - 1620",
            ),
            ("none", "Which treaty was signed in the year 1000 + 620?", "1000 + 620"),
        ),
        aliases=("calc", "calculate", "math", "maths", "arithmetic"),
    )

    def run(self, tool_input: str) -> ToolResult:
        """Evaluate the expression (or the expression written inside a sentence); errors are observations."""
        expression = tool_input.strip()
        try:
            value = evaluate_expression(expression)
        except (ValueError, ArithmeticError, TypeError) as exc:
            inner = extract_expression(expression)
            if inner is None or inner == expression:
                return ToolResult(f"Error: {exc}", ok=False)
            try:
                value, expression = evaluate_expression(inner), inner
            except (ValueError, ArithmeticError, TypeError) as inner_exc:
                return ToolResult(f"Error: {inner_exc}", ok=False)
        return ToolResult(_format(value))
