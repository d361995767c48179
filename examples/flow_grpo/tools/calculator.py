"""Calculator: evaluates one arithmetic expression safely (an AST walk, never ``eval``)."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Dict, Union

from examples.flow_grpo.tools.base import Tool, ToolMetadata, ToolResult

__all__ = ["CalculatorTool", "evaluate_expression"]

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


def _format(value: Number) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class CalculatorTool(Tool):
    """Evaluates one arithmetic expression."""

    metadata = ToolMetadata(
        name="calculator",
        description="Evaluates one arithmetic expression exactly; use for single calculations.",
        input_description="One expression such as (17 + 25) * 3 or sqrt(144).",
        example_input="12 ** 2",
    )

    def run(self, tool_input: str) -> ToolResult:
        """Evaluate the expression; errors are observations."""
        try:
            value = evaluate_expression(tool_input)
        except (ValueError, ArithmeticError, TypeError) as exc:
            return ToolResult(f"Error: {exc}", ok=False)
        return ToolResult(f"{tool_input.strip()} = {_format(value)}")
