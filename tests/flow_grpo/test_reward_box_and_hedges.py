"""A marker line that holds a box names nothing else, and a number is refused when the words around it doubt it.

The words after a sentence's number may only say what it counts (its unit, ``old``, the question's words): a
statement about the number (``1345 is a typo``, ``1345 seems off``) is not an answer, whatever its words. Before the
number, hedges, words of doubt and an adverb qualifying it (``hardly``, ``reputedly``) are refused.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest

from examples.flow_grpo.reward import RuleReward, committed_answer

FOUNDED = {
    "question": "In what year was the city that hosted the Midsummer Regatta founded?",
    "source": "multihop",
    "extra_info": {"ground_truth": ["1345"]},
}
SUM = {
    "question": "What is the sum of 253 + 194 + 288?",
    "source": "arithmetic",
    "extra_info": {"ground_truth": ["735"]},
}
AGE = {
    "question": "How old was Mira Jardine when the Meadow Aqueduct was completed?",
    "source": "lookup_calc",
    "extra_info": {"ground_truth": ["56"]},
}
PLACE = {"question": "In which city is the Eiffel Tower?", "source": "fact", "extra_info": {"ground_truth": ["Paris"]}}


def _assess(task: Dict[str, Any], answer: str) -> Any:
    return RuleReward().assess(task, answer)


# --- a final-answer marker and a box ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("Answer: 1344 or \\boxed{1345}", id="another number before the box"),
        pytest.param("Answer: \\boxed{1345} or 1344", id="another number after the box"),
        pytest.param("The answer is \\boxed{1345}, but it may be 1344", id="a hedge after the box"),
        pytest.param("Answer: 1344 \\boxed{1345}", id="another number beside the box"),
        pytest.param("Final answer: 1344, $\\boxed{1345}$", id="another number, LaTeX box"),
        pytest.param("\\boxed{1345}\nAnswer: \\boxed{1345} 1344", id="a second marked box with a number"),
        pytest.param("Answer: \\boxed{1345} (approximately)", id="a hedge word beside the box"),
        pytest.param("Answer: \\boxed{1345}, if I read it right", id="a condition beside the box"),
    ],
)
def test_a_marker_line_naming_more_than_its_box_scores_0(answer: str) -> None:
    assessment = _assess(FOUNDED, answer)
    assert assessment.score == 0.0 and assessment.refused, assessment


def test_a_marker_line_naming_another_name_than_its_box_scores_0() -> None:
    assessment = _assess(PLACE, "Answer: Lyon \\boxed{Paris}")
    assert assessment.score == 0.0 and assessment.refused, assessment


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        (FOUNDED, "The answer is \\boxed{1345}."),
        (FOUNDED, "The answer is $\\boxed{1345}$."),
        (FOUNDED, "Final answer: \\boxed{1345}"),
        (FOUNDED, "**Final answer:** \\boxed{1345}"),
        (FOUNDED, "It was founded in 1345.\nFinal answer: $\\boxed{1345}$"),
        (FOUNDED, "\\boxed{1345}\nFinal answer: 1345"),
        (SUM, "Final answer: the sum is \\boxed{735}."),  # "sum" is a word of the question
        (PLACE, "The answer is: \\boxed{\\text{Paris}}"),
        (PLACE, "Answer: the city is \\boxed{Paris}"),
    ],
)
def test_a_marker_that_only_introduces_its_box_still_scores_1(task: Dict[str, Any], answer: str) -> None:
    assert _assess(task, answer).score == 1.0


def test_committed_answer_reads_the_question_a_marker_line_may_use() -> None:
    assert committed_answer("Final answer: the sum is \\boxed{735}", SUM["question"]) == "735"
    assert committed_answer("Final answer: the sum is \\boxed{735}") is None  # "sum" names nothing known
    assert committed_answer("Answer: 1344 or \\boxed{1345}", FOUNDED["question"]) is None


# --- words around a number -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("1345 is a mistake", id="is a mistake"),
        pytest.param("1345 is a typo", id="is a typo"),
        pytest.param("1345 is a lie", id="is a lie"),
        pytest.param("The year 1345 is a myth", id="is a myth"),
        pytest.param("hardly 1345", id="hardly"),
        pytest.param("Hardly 1345.", id="Hardly"),
        pytest.param("1345 unless I misread", id="unless"),
        pytest.param("1345, if I am right", id="if"),
        pytest.param("1345 seems off", id="seems off"),
        pytest.param("It is supposedly 1345", id="supposedly"),
        pytest.param("It appears to be 1345", id="appears"),
        pytest.param("near 1345", id="near"),
        pytest.param("1345 (typo)", id="typo in parentheses"),
        pytest.param("It was founded in 1345, I think.", id="I think"),
        # No list of words names these: the rule refuses them by where the words stand.
        pytest.param("1345 is a blunder", id="a statement about the number"),
        pytest.param("1345 yes yes yes", id="words after the number"),
        pytest.param("Reputedly 1345", id="an adverb qualifying the number"),
        pytest.param("It was founded in 1345 ١٣٤٤", id="a number in another script"),
    ],
)
def test_a_number_the_words_around_it_doubt_scores_0(answer: str) -> None:
    assessment = _assess(FOUNDED, answer)
    assert assessment.score == 0.0 and assessment.refused, assessment


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("Paris is a myth", id="is a myth"),
        pytest.param("Paris unless I misread", id="unless"),
        pytest.param("It is in Paris, if I recall.", id="if"),
        pytest.param("Hardly Paris", id="hardly"),
    ],
)
def test_a_name_the_words_around_it_doubt_scores_0(answer: str) -> None:
    assessment = _assess(PLACE, answer)
    assert assessment.score == 0.0 and assessment.refused, assessment


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        (FOUNDED, "1345"),
        (FOUNDED, "It was founded in 1345."),
        (FOUNDED, "The city was founded in 1345."),
        (FOUNDED, "It was founded by Duke Oren's men in 1345."),
        (FOUNDED, "1345 AD"),
        (FOUNDED, "1345 A.D."),
        (FOUNDED, "In July 1345."),
        (FOUNDED, "exactly 1345"),
        (FOUNDED, "It was finally founded in 1345."),
        (FOUNDED, "1345 is the year"),
        (SUM, "735 in total"),
        (SUM, "The total is 735."),
        (SUM, "It equals 735."),
        (SUM, "735 dollars"),
        (AGE, "56 years"),
        (AGE, "He was 56 years old."),
        (AGE, "She was 56 years old when the Meadow Aqueduct was completed."),
    ],
)
def test_plain_statements_of_the_number_still_score_1(task: Dict[str, Any], answer: str) -> None:
    assessment = _assess(task, answer)
    assert assessment.score == 1.0, assessment


def test_a_word_of_doubt_the_question_uses_itself_is_no_hedge() -> None:
    task = {
        "question": "In what year was the claim on Ashwood made?",
        "source": "fact",
        "extra_info": {"ground_truth": ["1345"]},
    }
    assert _assess(task, "The claim was made in 1345.").score == 1.0
    assert _assess({**task, "question": "In what year was Ashwood founded?"}, "The claim was made in 1345.").refused
