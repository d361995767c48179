"""The reward's building blocks: the committed answer, refusals, gold answers, text rules and the public helpers."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import pytest

from examples.flow_grpo.reward import (
    RuleReward,
    assess_answer,
    committed_answer,
    gold_answers,
    math_equivalent,
    normalize_answer,
    qa_match,
)


def _task(gold: Union[str, List[str]], source: str = "nq", question: str = "q?") -> Dict[str, Any]:
    return {"question": question, "source": source, "extra_info": {"ground_truth": gold}}


@pytest.mark.parametrize(
    ("text", "committed"),
    [
        ("735", "735"),
        ("  The answer is 735.  ", "735"),
        ("Reasoning first.\nFinal answer: \\boxed{735}.", "735"),
        ("We get $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("ANSWER:\n\n735", "735"),
        ("answer = 12 km", "12 km"),
        ("**Paris**", "Paris"),
        ("\\boxed{735} \\boxed{ 735 }", "735"),
        ("\\boxed{735} \\boxed{736}", None),
        ("Answer: 735\nAnswer: 736", None),
        ("\\boxed{\\boxed{735}}", None),
        ("\\boxed{735", None),
        ("Final answer: 735\nmaybe 736", None),
        ("", None),
        ("x" * 5000, None),
    ],
)
def test_committed_answer(text: str, committed: Optional[str]) -> None:
    assert committed_answer(text) == committed


@pytest.mark.parametrize(
    ("answer", "golds", "refused"),
    [
        ("5 or 6", ["6"], True),
        ("220 + 108 + 193", ["521"], True),
        ("\\boxed{5}\\boxed{6}", ["6"], True),
        ("Paris, Lyon", ["Paris"], True),
        ("Paris?", ["Paris"], True),
        ("\\phantom{6}5", ["6"], True),
        ("6", [], True),
        ("", ["6"], True),
        # Single committed answers that the rule does not match: a judge may still call them equivalent.
        ("7", ["6"], False),
        ("six", ["6"], False),
        ("-6", ["6"], False),
        ("W. Shakespeare", ["William Shakespeare"], False),
        ("the painter Leonardo da Vinci", ["Leonardo da Vinci"], False),
        ("Felix Belloc was born in 1500.", ["Felix Belloc"], False),  # a number is not a rival name
    ],
)
def test_refused_answers_are_told_apart_from_unmatched_ones(answer: str, golds: List[str], refused: bool) -> None:
    assessment = assess_answer(answer, golds, "What is it?")
    assert assessment.score == 0.0 and assessment.refused is refused, assessment.reason


def test_an_expression_copied_from_the_question_is_refused_even_in_closed_form() -> None:
    assessment = assess_answer("5/2", ["2.5"], "What is 5/2?")
    assert assessment.score == 0.0 and assessment.refused and "copied" in assessment.reason
    assert assess_answer("5/2", ["2.5"], "What is 10/4?").score == 1.0
    assert assess_answer("5/2", ["5/2"], "What is 5/2 in lowest terms?").score == 1.0  # literally the gold


def test_gold_answers_come_from_extra_info_or_result() -> None:
    assert gold_answers({"extra_info": {"ground_truth": ["a", " ", None, "b"]}}) == ["a", "b"]
    assert gold_answers({"extra_info": {"ground_truth": "x"}}) == ["x"]
    assert gold_answers({"result": 12}) == ["12"]
    assert gold_answers({}) == []
    assert RuleReward()({"question": "q", "source": "nq"}, "anything") == 0.0


def test_any_gold_answer_matches_after_normalization() -> None:
    task = _task(["Leonardo da Vinci", "Leonardo", "da Vinci"])
    reward = RuleReward()
    assert [reward(task, a) for a in ["leonardo da vinci.", "Da Vinci", "The Leonardo!", "Michelangelo"]] == [
        1.0,
        1.0,
        1.0,
        0.0,
    ]
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffel tower"


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("Saint-Etienne", "Saint Etienne", 1.0),  # a hyphen joining two words is punctuation
        ("x^2 + 1", "x^2+1", 1.0),
        ("x^2 - 1", "x^2+1", 0.0),  # math symbols are kept
        ("2x + 2", "2(x + 1)", 0.0),  # expressions with variables match as written (the judge sees the rest)
        ("x < 3", "x > 3", 0.0),
        ("Au", "Au", 1.0),
    ],
)
def test_text_answers_keep_math_symbols(answer: str, gold: str, expected: float) -> None:
    assert RuleReward()(_task([gold]), answer) == expected


def test_public_helpers_judge_the_committed_answer() -> None:
    assert math_equivalent("The answer is \\frac{1}{2}.", ["0.5"])
    assert not math_equivalent("1/4 + 1/4", ["0.5"])
    assert not math_equivalent("abc", ["not math either"])
    assert qa_match("Final answer: Ottawa", ["Ottawa"])
    assert not qa_match("Ottawa or Toronto", ["Ottawa"])
    assert not qa_match("Ottawa", [])


def test_math_sources_is_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="ignored"):
        reward = RuleReward(math_sources=frozenset({"arithmetic"}))
    assert reward(_task(["144"], "arithmetic"), "144") == 1.0
