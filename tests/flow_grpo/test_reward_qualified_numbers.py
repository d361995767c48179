"""A number qualified into a bound or a part of a period, or written with a leading zero, is not the gold number."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from examples.flow_grpo.reward import LLMJudge, RuleReward, assess_answer

YEAR = {
    "question": "In what year was the Eiffel Tower completed?",
    "source": "fact",
    "extra_info": {"ground_truth": ["1889"]},
}
WHEN = {"question": "When was the Eiffel Tower completed?", "source": "fact", "extra_info": {"ground_truth": ["1889"]}}
ARITHMETIC = {"question": "What is 253 + 194 + 288?", "source": "arithmetic", "extra_info": {"ground_truth": ["735"]}}
ENDED = {"question": "When did the war end?", "source": "fact", "extra_info": {"ground_truth": ["1905"]}}
PADDED_GOLD = {"question": "Which flight number is it?", "source": "fact", "extra_info": {"ground_truth": ["0735"]}}


def _score(task: Dict[str, Any], answer: str) -> float:
    return RuleReward()(task, answer)


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        pytest.param(YEAR, "by 1889", id="by"),
        pytest.param(WHEN, "By 1889.", id="By."),
        pytest.param(WHEN, "It was completed by the end of 1889.", id="by the end of"),
        pytest.param(YEAR, "by the year 1889", id="by the year"),
        pytest.param(YEAR, "early 1889", id="early"),
        pytest.param(YEAR, "in early 1889", id="in early"),
        pytest.param(YEAR, "late 1889", id="late"),
        pytest.param(YEAR, "late in the year 1889", id="late in the year"),
        pytest.param(YEAR, "mid 1889", id="mid"),
        pytest.param(YEAR, "mid-1889", id="mid-"),
        pytest.param(YEAR, "in the middle of 1889", id="in the middle of"),
        pytest.param(YEAR, "at the end of 1889", id="at the end of"),
        pytest.param(YEAR, "at the beginning of 1889", id="at the beginning of"),
        pytest.param(YEAR, "the start of 1889", id="the start of"),
        pytest.param(YEAR, "1889 onwards", id="onwards"),
        pytest.param(YEAR, "around 1889", id="around"),
        pytest.param(YEAR, "circa 1889", id="circa"),
        pytest.param(YEAR, "ca. 1889", id="ca."),
        pytest.param(YEAR, "approx. 1889", id="approx."),
        pytest.param(YEAR, "approximately 1889", id="approximately"),
        pytest.param(ARITHMETIC, "close to 735", id="close to"),
        pytest.param(ENDED, "at the end of 1905", id="a qualifier the question uses as a verb"),
    ],
)
def test_a_qualified_year_or_number_is_refused(task: Dict[str, Any], answer: str) -> None:
    assessment = RuleReward().assess(task, answer)
    assert assessment.score == 0.0 and assessment.refused, assessment


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        pytest.param(YEAR, "0735", id="another value padded"),
        pytest.param(YEAR, "01889", id="year"),
        pytest.param(YEAR, "It was completed in 01889.", id="year in a sentence"),
        pytest.param(ARITHMETIC, "0735", id="padded"),
        pytest.param(ARITHMETIC, "00735", id="two zeros"),
        pytest.param(ARITHMETIC, "\\boxed{0735}", id="boxed"),
        pytest.param(ARITHMETIC, "$0735$", id="latex"),
        pytest.param(ARITHMETIC, "-0735", id="negative"),
        pytest.param(ARITHMETIC, "0735.0", id="decimal"),
        pytest.param(ARITHMETIC, "The sum is 0735.", id="sentence"),
        pytest.param({**ARITHMETIC, "extra_info": {"ground_truth": ["1307"]}}, "01,307", id="thousands"),
        pytest.param({**ARITHMETIC, "extra_info": {"ground_truth": ["0.5"]}}, "00.5", id="fraction"),
    ],
)
def test_a_number_written_with_a_leading_zero_is_refused(task: Dict[str, Any], answer: str) -> None:
    assessment = RuleReward().assess(task, answer)
    assert assessment.score == 0.0 and assessment.refused, assessment


def test_a_refused_padded_answer_never_reaches_the_judge() -> None:
    class Unreachable:
        def chat(self, *args: Any, **kwargs: Any) -> str:
            raise AssertionError("the judge was asked")

    judge = LLMJudge(Unreachable())  # type: ignore[arg-type]
    assert judge(ARITHMETIC, "0735") == 0.0 and judge.stats()["calls"] == 0


@pytest.mark.parametrize("answer", ["0735", "In 0735.", "\\boxed{0735}", "It is 0735."])
def test_a_gold_written_with_a_leading_zero_accepts_it(answer: str) -> None:
    assert _score(PADDED_GOLD, answer) == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "1889",
        "1889.",
        "1,889",
        "\\boxed{1889}",
        "In 1889",
        "in 1889.",
        "the year 1889",
        "In the year 1889.",
        "AD 1889",
        "1889 AD",
        "It was completed in 1889.",
        "It was built by Gustave Eiffel's company in 1889.",
    ],
)
def test_a_plain_year_still_scores_1(answer: str) -> None:
    assert _score(YEAR, answer) == 1.0
    assert _score(WHEN, answer) == 1.0


@pytest.mark.parametrize(
    ("question", "gold", "answer"),
    [
        ("By what year had the Eiffel Tower been completed?", "1889", "By 1889."),
        ("How much did the price rise, in percent?", "12%", "It rose by 12%."),
        ("How much did the price rise?", "12", "by 12"),
        ("What is the middle number of 1, 5 and 9?", "5", "The middle number is 5."),
        ("What is 0.25 + 0.25?", "0.5", "0.5"),
        ("What is 1000 + 307?", "1307", "1,307"),
        ("What is 5 - 5?", "0", "0"),
        ("What is 2 + 3?", "5", "5.0"),
        ("When did the war end?", "1905", "It ended in 1905."),
    ],
)
def test_words_and_numbers_that_qualify_nothing_still_score_1(question: str, gold: str, answer: str) -> None:
    # "by" is a bound only in a question asking for a time; a word the question uses is the question's own.
    assessment = assess_answer(answer, [gold], question)
    assert assessment.score == 1.0, assessment
