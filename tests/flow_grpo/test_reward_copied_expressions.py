"""An expression written in the question, given back in any trivial rewrite, is refused; the answer itself is not.

The question is read as the answers are (LaTeX rewritten, parentheses and a unary ``+`` dropped, terms in any
order), and an answer equal to one of its expressions is a copy, unless that expression is the answer: a plain
number of a gold's value ("What is 7?", "Which is larger, 7 or 5?") or the expression a gold is written as.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from examples.flow_grpo.evaluation import copied_question_credit
from examples.flow_grpo.reward import RuleReward, assess_answer, question_copies

FIVE_HALVES = "What is 5/2?"
LATEX_FIVE_HALVES = "What is $\\frac{5}{2}$ as a decimal?"
SIMPLIFY = "Simplify $\\frac{1}{\\sqrt{2}}$."


@pytest.mark.parametrize(
    ("question", "gold", "answer"),
    [
        pytest.param(FIVE_HALVES, "2.5", "5/2", id="as written"),
        pytest.param(FIVE_HALVES, "2.5", "\\frac{5}{2}", id="in LaTeX"),
        pytest.param(FIVE_HALVES, "2.5", "+5/2", id="unary plus"),
        pytest.param(FIVE_HALVES, "2.5", "(5)/2", id="parenthesized numerator"),
        pytest.param(FIVE_HALVES, "2.5", "5/(2)", id="parenthesized denominator"),
        pytest.param(FIVE_HALVES, "2.5", "\\dfrac52", id="dfrac"),
        pytest.param(FIVE_HALVES, "2.5", "It is 5/2.", id="in a sentence"),
        pytest.param(LATEX_FIVE_HALVES, "2.5", "$\\frac{5}{2}$", id="the question's own LaTeX"),
        pytest.param(LATEX_FIVE_HALVES, "2.5", "\\frac{5}{2}", id="LaTeX question, bare LaTeX"),
        pytest.param(LATEX_FIVE_HALVES, "2.5", "5/2", id="LaTeX question, plain answer"),
        pytest.param("What is \\(\\frac{5}{2}\\) as a decimal?", "2.5", "5/2", id="inline-math delimiters"),
        pytest.param(SIMPLIFY, "\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", id="the expression to simplify"),
        pytest.param(SIMPLIFY, "\\frac{\\sqrt{2}}{2}", "1/sqrt(2)", id="the expression to simplify, plain"),
        pytest.param("What is $\\frac{1}{2} + \\frac{1}{3}$?", "\\frac{5}{6}", "\\frac{1}{2}", id="a part of it"),
        pytest.param("Compute $2\\pi \\cdot 3$.", "6\\pi", "\\pi \\cdot 2", id="factors in another order"),
    ],
)
def test_an_expression_of_the_question_given_back_is_refused(question: str, gold: str, answer: str) -> None:
    assessment = assess_answer(answer, [gold], question)
    assert assessment.score == 0.0 and assessment.refused, assessment


@pytest.mark.parametrize(
    ("question", "gold", "answer"),
    [
        pytest.param("What is 7?", "7", "7", id="what is 7"),
        pytest.param("What is 7?", "7", "It is 7.", id="what is 7, in a sentence"),
        pytest.param("Which is larger, 7 or 5?", "7", "7", id="a choice"),
        pytest.param("Which is larger, 7 or 5?", "7", "+7", id="a choice, unary plus"),
        pytest.param("What is the middle number of 1, 5 and 9?", "5", "The middle number is 5.", id="a listed number"),
        pytest.param("What is 5/2 in lowest terms?", "5/2", "5/2", id="the gold as written"),
        pytest.param("What is 5/2 in lowest terms?", "5/2", "\\frac{5}{2}", id="the gold's expression in LaTeX"),
        pytest.param("What is 5/2 in lowest terms?", "5/2", "2.5", id="the gold's value"),
        pytest.param(FIVE_HALVES, "2.5", "2.5", id="the value asked for"),
        pytest.param(LATEX_FIVE_HALVES, "2.5", "It is 2.5.", id="the value in a sentence"),
        pytest.param(SIMPLIFY, "\\frac{\\sqrt{2}}{2}", "\\frac{\\sqrt{2}}{2}", id="the simplified form"),
        pytest.param(SIMPLIFY, "\\frac{\\sqrt{2}}{2}", "sqrt(2)/2", id="the simplified form, plain"),
        pytest.param("What is 11/2 - 5?", "1/2", "\\frac{1}{2}", id="text that only contains the answer (11/2)"),
        pytest.param("What is 1000 + 307?", "1307", "1,307", id="a sum"),
    ],
)
def test_an_answer_that_appears_in_the_question_legitimately_still_scores_1(
    question: str, gold: str, answer: str
) -> None:
    assessment = assess_answer(answer, [gold], question)
    assert assessment.score == 1.0, assessment


def test_a_number_copied_from_the_question_that_is_not_the_answer_is_refused() -> None:
    assessment = assess_answer("1841", ["41"], "How many years passed between 1800 and 1841?")
    assert assessment.score == 0.0 and assessment.refused and "copied" in assessment.reason


def test_question_copies_lists_the_expressions_an_answer_may_not_give_back() -> None:
    assert question_copies(LATEX_FIVE_HALVES, ["2.5"]) == ["(5)/(2)", "$\\frac{5}{2}$"]
    assert question_copies("What is 253 + 194 + 288?", ["735"]) == ["253 + 194 + 288"]
    assert question_copies("What is 5/2 in lowest terms?", ["5/2"]) == []  # the gold's own expression
    assert question_copies("Which is larger, 7 or 5?", ["7"]) == []  # plain numbers are answers too


def _task(question: str, gold: str) -> Dict[str, Any]:
    return {"id": question, "question": question, "source": "math", "extra_info": {"ground_truth": [gold]}}


LATEX_TASKS: List[Dict[str, Any]] = [
    _task(FIVE_HALVES, "2.5"),
    _task(LATEX_FIVE_HALVES, "2.5"),
    _task(SIMPLIFY, "\\frac{\\sqrt{2}}{2}"),
]


def test_the_copied_question_check_credits_no_copy_of_a_latex_question() -> None:
    check = copied_question_credit(LATEX_TASKS, RuleReward())
    assert check.credited == 0 and check.candidates == 8, check


def test_the_copied_question_check_catches_a_reward_that_credits_latex_copies() -> None:
    def value_only(task: Any, answer: str) -> float:  # a reward comparing values only: every copy has the value
        return 1.0 if answer.strip("$") in {"(5)/(2)", "\\frac{5}{2}", "(1)/(sqrt(2))", "\\frac{1}{\\sqrt{2}}"} else 0.0

    check = copied_question_credit(LATEX_TASKS, value_only)
    assert check.credited == 4, check
