"""The expression reader behind the math reward: LaTeX rewriting, closed forms, values and size caps."""

from __future__ import annotations

from fractions import Fraction

import pytest

from examples.flow_grpo.expressions import (
    ExpressionError,
    evaluate,
    is_closed_form,
    latex_to_plain,
    parse_expression,
    same_value,
)


@pytest.mark.parametrize(
    ("latex", "plain"),
    [
        ("\\frac{1}{2}", "(1)/(2)"),
        ("\\dfrac12", "(1)/(2)"),
        ("2\\sqrt{2}", "2sqrt(2)"),
        ("\\frac{\\pi}{4}", "(pi)/(4)"),
        ("e^{-1}", "e^(-1)"),
        ("1{,}307", "1,307"),
        ("\\text{12 km}", "12 km"),
        ("\\left(3\\right)", "(3)"),
        ("735", "735"),
    ],
)
def test_latex_to_plain(latex: str, plain: str) -> None:
    assert latex_to_plain(latex) == plain


@pytest.mark.parametrize("latex", ["\\phantom{1}", "\\sqrt[3]{2}", "\\frac{1}", "{1", "1}", "\\", "{" * 30 + "}" * 30])
def test_latex_that_is_not_read_is_an_error(latex: str) -> None:
    with pytest.raises(ExpressionError):
        latex_to_plain(latex)


@pytest.mark.parametrize(
    ("text", "closed"),
    [
        ("735", True),
        ("-735", True),
        ("735.0", True),
        ("1,307", True),
        ("1/2", True),
        ("-1/2", True),
        ("sqrt(2)", True),
        ("2sqrt(3)", True),
        ("sqrt(2)/2", True),
        ("1/sqrt(2)", True),
        ("(1+sqrt(5))/2", True),
        ("pi/4", True),
        ("2pi", True),
        ("e^(-1)", True),
        ("1 + sqrt(2)", True),
        ("253 + 194 + 288", False),
        ("3*4", False),
        ("2/4", False),
        ("4/2", False),
        ("5/1", False),
        ("0.5/2", False),
        ("--735", False),
        ("1 + -2", False),
        ("2^10", False),
        ("9^9^9^9", False),
        ("sqrt(4)", False),
        ("sqrt(8)", False),
        ("sqrt(2)*sqrt(3)", False),
        ("sqrt(2) + sqrt(2)", False),
        ("pi*pi", False),
        ("1*pi", False),
        ("(2 + 2sqrt(5))/2", False),
        ("2(3)", False),
        ("sqrt(2) + 0", False),
    ],
)
def test_closed_forms(text: str, closed: bool) -> None:
    assert is_closed_form(parse_expression(text)) is closed


@pytest.mark.parametrize(
    "text", ["1 307", "x + 1", "2 ++", "(1", "sqrt 2", "1e3", "9" * 31, "(" * 25 + "1" + ")" * 25, "1" * 201, ""]
)
def test_what_the_parser_refuses(text: str) -> None:
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_values_are_exact_for_rationals_and_bounded() -> None:
    assert evaluate(parse_expression("1/4 + 1/4")) == Fraction(1, 2)
    assert evaluate(parse_expression("sqrt(9/4)")) == Fraction(3, 2)
    assert same_value(evaluate(parse_expression("sqrt(2)/2")), evaluate(parse_expression("1/sqrt(2)")))
    assert not same_value(Fraction(1, 3), Fraction(3333333333, 10**10))
    assert evaluate(parse_expression("((10^10)^10)^10")) == 10**1000
    for text in ["9^9^9^9", "(((10^10)^10)^10)^10", "2^0.5", "1/0", "0^(-1)", "sqrt(-1)"]:
        with pytest.raises(ExpressionError):
            evaluate(parse_expression(text))
