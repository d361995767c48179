"""Numbers and closed forms written by a model, read without running anything unbounded.

The reward needs three things from a math answer: its plain-text form (the LaTeX it understands rewritten:
``\\frac{1}{2}`` -> ``(1)/(2)``), whether it is a *closed form* with nothing left to evaluate (``1/2`` is, ``2/4``
and ``220 + 108 + 193`` are not), and its value. Model output is never evaluated as code nor handed to a
computer-algebra system: a small recursive-descent parser reads ``+ - * / ^``, parentheses, ``sqrt``, ``pi`` and
``e``; values are exact fractions for rationals and floats otherwise; every size is capped (text length, nesting,
literal digits, exponents, result size), so a tower of powers such as ``9^9^9^9`` fails fast instead of hanging.

A closed form (:func:`is_closed_form`) is a sum of distinct terms (at most one of them rational), each a number
optionally times distinct irrational factors (``sqrt(n)`` with square-free ``n``, ``pi``, ``e``, ``pi^k``,
``e^k`` with ``2 <= |k| <= 10``), optionally over an integer denominator coprime with the integer coefficients
(``(1 + sqrt(5))/2``, ``sqrt(2)/2``), or an integer over one irrational factor (``1/sqrt(2)``). The coefficient of
an irrational term is not 0 or 1.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, List, Optional, Tuple, Union

__all__ = [
    "LATEX_COMMANDS",
    "ExpressionError",
    "Node",
    "Value",
    "braced_group",
    "evaluate",
    "is_closed_form",
    "latex_to_plain",
    "parse_expression",
    "same_value",
]

Value = Union[Fraction, float]
"""A value: exact for rationals, a float for irrational values."""

Node = Tuple[Any, ...]
"""A parsed expression: ``("num", Fraction, is_integer)``, ``("atom", "pi" | "e")``, ``("sqrt", node)``,
``("neg", node)`` or ``(op, left, right)`` with ``op`` one of ``+ - * / ^``."""

MAX_EXPRESSION_CHARS = 200
MAX_NESTING = 20
MAX_LITERAL_DIGITS = 30
MAX_EXPONENT = 10
MAX_RADICAND = 10**9
MAX_VALUE_BITS = 4096
RELATIVE_TOLERANCE = 1e-9


class ExpressionError(ValueError):
    """The text is not an expression this module reads (malformed, unknown command or name, beyond a size cap)."""


def braced_group(text: str, start: int) -> Optional[Tuple[str, int]]:
    """The content of the ``{...}`` group opening at ``text[start]`` and the index after it (None if unbalanced)."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : index], index + 1
    return None


# --- LaTeX -------------------------------------------------------------------------------------------------------

_LATEX_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
_LATEX_DROPPED = {"left": "", "right": "", "displaystyle": "", "!": "", ";": "", ":": "", " ": " ", "quad": " "}
_LATEX_TEXT = frozenset({"text", "textrm", "textbf", "textit", "mathrm", "mathbf", "mathit", "operatorname"})
_LATEX_SYMBOLS = {"cdot": "*", "times": "*", "div": "/", "pi": "pi", "%": "%", "$": "$", ",": ",", "{": "(", "}": ")"}
LATEX_COMMANDS = frozenset({"frac", "dfrac", "tfrac", "sqrt", *_LATEX_TEXT, *_LATEX_DROPPED, *_LATEX_SYMBOLS})
"""The LaTeX commands :func:`latex_to_plain` reads (``\\frac``, ``\\sqrt``, ``\\text``...); any other is an error."""


def _latex_argument(text: str, index: int) -> Tuple[str, int]:
    while index < len(text) and text[index] == " ":
        index += 1
    if index >= len(text):
        raise ExpressionError("a LaTeX command lacks its argument")
    if text[index] == "{":
        group = braced_group(text, index)
        if group is None:
            raise ExpressionError("unbalanced braces")
        return group
    return text[index], index + 1


def latex_to_plain(text: str, _depth: int = 0) -> str:
    """Rewrite the LaTeX this module understands into plain text (``2\\sqrt{2}`` -> ``2sqrt(2)``).

    Understood: ``\\frac``/``\\dfrac``/``\\tfrac``, ``\\sqrt{}``, ``\\pi``, ``\\cdot``, ``\\times``, ``\\div``,
    text commands (``\\text{...}``: their content), spacing (``\\,`` is a thousands separator), ``\\left``/``\\right``
    and braces (as parentheses). Text without a backslash or brace is returned unchanged.

    Raises:
        ExpressionError: An unknown command (``\\phantom``, ``\\color``...), unbalanced braces, or nesting deeper
            than 20 levels.
    """
    if "\\" not in text and "{" not in text and "}" not in text:
        return text
    if _depth > MAX_NESTING:
        raise ExpressionError("LaTeX nested too deeply")
    out: List[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\":
            match = _LATEX_COMMAND.match(text, index)
            if match is None:
                raise ExpressionError("a dangling backslash")
            name, index = match.group(1), match.end()
            if name in ("frac", "dfrac", "tfrac"):
                numerator, index = _latex_argument(text, index)
                denominator, index = _latex_argument(text, index)
                out.append(f"({latex_to_plain(numerator, _depth + 1)})/({latex_to_plain(denominator, _depth + 1)})")
            elif name == "sqrt":
                if text[index : index + 1] == "[":
                    raise ExpressionError("only square roots are read")
                radicand, index = _latex_argument(text, index)
                out.append(f"sqrt({latex_to_plain(radicand, _depth + 1)})")
            elif name in _LATEX_TEXT:
                content, index = _latex_argument(text, index)
                out.append(latex_to_plain(content, _depth + 1))
            elif name in _LATEX_DROPPED:
                out.append(_LATEX_DROPPED[name])
            elif name in _LATEX_SYMBOLS:
                out.append(_LATEX_SYMBOLS[name])
            else:
                raise ExpressionError(f"unknown LaTeX command \\{name}")
        elif char == "{":
            if text.startswith("{,}", index):  # 1{,}307: a thousands separator in math mode
                out.append(",")
                index += 3
                continue
            group = braced_group(text, index)
            if group is None:
                raise ExpressionError("unbalanced braces")
            out.append(f"({latex_to_plain(group[0], _depth + 1)})")
            index = group[1]
        elif char == "}":
            raise ExpressionError("unbalanced braces")
        else:
            out.append(char)
            index += 1
    return "".join(out)


# --- parsing -----------------------------------------------------------------------------------------------------

_THOUSANDS = re.compile(r"(?<![0-9.,])([0-9]{1,3}(?:,[0-9]{3})+)(?![0-9,])")
_TOKEN = re.compile(r"\s*(?:(?P<num>[0-9]+(?:\.[0-9]+)?)|(?P<name>[A-Za-z]+)|(?P<op>\*\*|[-+*/^()]))")
_NAMES = frozenset({"pi", "e", "sqrt"})


def _tokenize(text: str) -> List[Tuple[str, str]]:
    text = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), text).strip()
    tokens: List[Tuple[str, str]] = []
    index = 0
    while index < len(text):
        match = _TOKEN.match(text, index)
        if match is None:
            raise ExpressionError(f"unexpected {text[index:].strip()[:1]!r}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        if kind == "name" and value not in _NAMES:
            raise ExpressionError(f"unknown name {value!r}")
        tokens.append((kind, "^" if value == "**" else value))
        index = match.end()
        if not text[index:].strip():
            break
    return tokens


class _Parser:
    """Recursive descent over ``+ - * / ^``, parentheses, ``sqrt(...)``, ``pi``, ``e`` and implicit products.

    Two numbers side by side (``1 307``) are not a product; a number after a name or a closing parenthesis is.
    """

    def __init__(self, text: str) -> None:
        if len(text) > MAX_EXPRESSION_CHARS:
            raise ExpressionError(f"longer than {MAX_EXPRESSION_CHARS} characters")
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise ExpressionError("empty expression")
        node = self._sum()
        if self.index != len(self.tokens):
            raise ExpressionError(f"unexpected {self._peek()[1]!r}")
        return node

    def _peek(self) -> Tuple[str, str]:
        return self.tokens[self.index] if self.index < len(self.tokens) else ("end", "")

    def _take(self) -> Tuple[str, str]:
        token = self._peek()
        self.index += 1
        return token

    def _sum(self) -> Node:
        node = self._product()
        while self._peek() in (("op", "+"), ("op", "-")):
            op = self._take()[1]
            node = (op, node, self._product())
        return node

    def _product(self) -> Node:
        node = self._unary()
        while True:
            kind, value = self._peek()
            if (kind, value) in (("op", "*"), ("op", "/")):
                self._take()
                node = (value, node, self._unary())
            elif kind == "name" or (kind, value) == ("op", "(") or (kind == "num" and self._after_parenthesis()):
                node = ("*", node, self._power())  # implicit product: 2sqrt(2), 2pi, (1)(2); never 1 307
            else:
                return node

    def _after_parenthesis(self) -> bool:
        return self.tokens[self.index - 1] == ("op", ")")

    def _unary(self) -> Node:
        if self._peek() == ("op", "-"):
            self._take()
            return ("neg", self._nested(self._unary))
        if self._peek() == ("op", "+"):
            self._take()
            return self._nested(self._unary)
        return self._power()

    def _power(self) -> Node:
        base = self._atom()
        if self._peek() == ("op", "^"):
            self._take()
            return ("^", base, self._nested(self._unary))
        return base

    def _atom(self) -> Node:
        kind, value = self._take()
        if kind == "num":
            if len(value.replace(".", "")) > MAX_LITERAL_DIGITS:
                raise ExpressionError(f"a number longer than {MAX_LITERAL_DIGITS} digits")
            return ("num", Fraction(value), "." not in value)
        if (kind, value) == ("name", "sqrt"):
            if self._take() != ("op", "("):
                raise ExpressionError("sqrt needs parentheses")
            return ("sqrt", self._parenthesized())
        if kind == "name":
            return ("atom", value)
        if (kind, value) == ("op", "("):
            return self._parenthesized()
        raise ExpressionError(f"unexpected {value or 'end'!r}")

    def _parenthesized(self) -> Node:
        inner = self._nested(self._sum)
        if self._take() != ("op", ")"):
            raise ExpressionError("unbalanced parentheses")
        return inner

    def _nested(self, rule: Any) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise ExpressionError("nested too deeply")
        node: Node = rule()
        self.depth -= 1
        return node


def parse_expression(text: str) -> Node:
    """Parse plain-text math (see :func:`latex_to_plain` for LaTeX); commas between digit triples are separators.

    Raises:
        ExpressionError: Not an expression of numbers, ``+ - * / ^``, parentheses, ``sqrt``, ``pi`` and ``e``, or
            beyond a size cap (200 characters, 20 nesting levels, 30-digit numbers).
    """
    return _Parser(text).parse()


# --- closed forms ------------------------------------------------------------------------------------------------

Monomial = Tuple[Fraction, bool, Tuple[str, ...]]


def _integer_literal(node: Node) -> Optional[int]:
    """The integer of ``5`` or ``-5`` written as a literal (None for anything else)."""
    if node[0] == "neg" and node[1][0] == "num" and node[1][2]:
        return -int(node[1][1])
    if node[0] == "num" and node[2]:
        return int(node[1])
    return None


def _square_free(n: int) -> bool:
    return all(n % (p * p) for p in range(2, math.isqrt(n) + 1))


def _flatten(node: Node, operators: Tuple[str, ...]) -> List[Node]:
    """The operands of a chain of ``operators`` (``a + b - c`` -> ``[a, b, c]``), left to right."""
    operands: List[Node] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if current[0] in operators:
            pending.extend((current[2], current[1]))
        else:
            operands.append(current)
    return operands


def _monomial(node: Node) -> Optional[Monomial]:
    """``(coefficient, coefficient is an integer, irrational factors)`` of a product in closed form, else None."""
    factors = _flatten(node, ("*",))
    coefficients = [factor for factor in factors if factor[0] == "num"]
    irrational: List[str] = []
    bases: List[str] = []
    for factor in factors:
        if factor[0] == "num":
            continue
        if factor[0] == "atom":
            bases.append(factor[1])
            irrational.append(factor[1])
        elif factor[0] == "sqrt":
            radicand = _integer_literal(factor[1])
            if radicand is None or not 2 <= radicand <= MAX_RADICAND or not _square_free(radicand):
                return None
            bases.append("sqrt")
            irrational.append(f"sqrt{radicand}")
        elif factor[0] == "^" and factor[1][0] == "atom":
            exponent = _integer_literal(factor[2])
            if exponent is None or exponent in (0, 1) or abs(exponent) > MAX_EXPONENT:
                return None
            bases.append(factor[1][1])
            irrational.append(f"{factor[1][1]}^{exponent}")
        else:
            return None  # a power of a number, a sum or a quotient inside a product: something left to evaluate
    if len(coefficients) > 1 or len(bases) != len(set(bases)):
        return None  # 3*4, sqrt(2)*sqrt(3), pi*pi
    coefficient = coefficients[0][1] if coefficients else Fraction(1)
    if coefficients and irrational and coefficient in (0, 1):
        return None  # 1*pi, 0*e
    return coefficient, not coefficients or coefficients[0][2], tuple(sorted(irrational))


def _sum_terms(node: Node) -> Optional[List[Monomial]]:
    """The monomials of a sum in closed form (at most one rational term, no like terms), else None."""
    monomials = []
    for position, term in enumerate(_flatten(node, ("+", "-"))):
        if term[0] == "neg":
            if position > 0 or term[1][0] == "neg":
                return None  # 1 + -2, --3
            term = term[1]
        monomial = _monomial(term)
        if monomial is None:
            return None
        monomials.append(monomial)
    signatures = [monomial[2] for monomial in monomials]
    if len(signatures) != len(set(signatures)):
        return None  # 220 + 108 + 193, sqrt(2) + sqrt(2)
    if len(monomials) > 1 and any(monomial[0] == 0 for monomial in monomials):
        return None
    return monomials


def is_closed_form(node: Node) -> bool:
    """Whether ``node`` has nothing left to evaluate (see the module docstring for the exact forms)."""
    if node[0] == "neg":
        node = node[1]
        if node[0] == "neg":
            return False
    if node[0] != "/":
        return _sum_terms(node) is not None
    numerator, denominator = node[1], node[2]
    integer = _integer_literal(denominator)
    if integer is not None:
        terms = _sum_terms(numerator)
        if integer <= 1 or terms is None or not all(is_integer for _, is_integer, _ in terms):
            return False
        return math.gcd(integer, *(int(coefficient) for coefficient, _, _ in terms)) == 1
    monomial = _monomial(denominator)
    top = _integer_literal(numerator)
    return monomial is not None and monomial[0] == 1 and bool(monomial[2]) and top not in (None, 0)


# --- values ------------------------------------------------------------------------------------------------------


def _bounded(value: Value) -> Value:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ExpressionError("not a finite number")
    elif max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_VALUE_BITS:
        raise ExpressionError("a number too large")
    return value


def evaluate(node: Node) -> Value:
    """The value of a parsed expression: a :class:`~fractions.Fraction` for rationals, else a float.

    Powers need an integer exponent up to 10 in size and every intermediate result stays under 4096 bits, so the
    time is bounded whatever the expression (the reward evaluates answers only once they are closed forms).

    Raises:
        ExpressionError: Division by zero, the square root of a negative number, a non-integer or large exponent,
            a value too large or not finite.
    """
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "atom":
        return math.pi if node[1] == "pi" else math.e
    if kind == "neg":
        return -evaluate(node[1])
    if kind == "sqrt":
        inner = evaluate(node[1])
        if inner < 0:
            raise ExpressionError("the square root of a negative number")
        if isinstance(inner, Fraction):
            top, bottom = math.isqrt(inner.numerator), math.isqrt(inner.denominator)
            if top * top == inner.numerator and bottom * bottom == inner.denominator:
                return Fraction(top, bottom)
        return math.sqrt(inner)
    left, right = evaluate(node[1]), evaluate(node[2])
    try:
        if kind == "+":
            return _bounded(left + right)
        if kind == "-":
            return _bounded(left - right)
        if kind == "*":
            return _bounded(left * right)
        if kind == "/":
            if right == 0:
                raise ExpressionError("division by zero")
            return _bounded(left / right)
        if not (isinstance(right, Fraction) and right.denominator == 1 and abs(right) <= MAX_EXPONENT):
            raise ExpressionError("only integer exponents up to 10 are evaluated")
        if left == 0 and right < 0:
            raise ExpressionError("division by zero")
        if (
            isinstance(left, Fraction)
            and max(left.numerator.bit_length(), left.denominator.bit_length()) * abs(right) > MAX_VALUE_BITS
        ):
            raise ExpressionError("a number too large")
        return _bounded(left ** int(right))
    except (OverflowError, ZeroDivisionError) as exc:
        raise ExpressionError(str(exc)) from exc


def same_value(left: Value, right: Value) -> bool:
    """Equal values: exactly for two rationals, else within a relative 1e-9."""
    if isinstance(left, Fraction) and isinstance(right, Fraction):
        return left == right
    try:
        return math.isclose(float(left), float(right), rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)
    except OverflowError:
        return False
