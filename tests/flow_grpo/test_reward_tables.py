"""The rule-based reward against adversarial and honest answers, one table per kind of gold answer.

Each adversarial row is an answer that must score 0 although it names, contains or hedges towards the gold; each
honest row is a correct answer in a form a model may reasonably write, which must score 1.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import pytest

from examples.flow_grpo.reward import MAX_ANSWER_CHARS, RuleReward

ARITHMETIC = {"question": "What is 253 + 194 + 288?", "source": "arithmetic", "extra_info": {"ground_truth": ["735"]}}
SUM_1307 = {"question": "What is 356 + 167 + 784?", "source": "arithmetic", "extra_info": {"ground_truth": ["1307"]}}
NEGATIVE = {"question": "What is 12 - 747?", "source": "arithmetic", "extra_info": {"ground_truth": ["-735"]}}
YEAR = {
    "question": "In what year was the Eiffel Tower completed?",
    "source": "fact",
    "extra_info": {"ground_truth": ["1889"]},
}
PLACE = {"question": "In which city is the Eiffel Tower?", "source": "fact", "extra_info": {"ground_truth": ["Paris"]}}
PERSON = {
    "question": "Who was the first person to walk on the Moon?",
    "source": "fact",
    "extra_info": {"ground_truth": ["Neil Armstrong", "Armstrong"]},
}
CAPITAL = {
    "question": "What is the capital of Australia?",
    "source": "fact",
    "extra_info": {"ground_truth": ["Canberra"]},
}
HALF = {"question": "Evaluate 1/4 + 1/4.", "source": "mathhard", "extra_info": {"ground_truth": ["\\frac{1}{2}"]}}
ROOT = {
    "question": "What is the diagonal of a unit square?",
    "source": "mathhard",
    "extra_info": {"ground_truth": ["\\sqrt{2}"]},
}
SHARE = {"question": "What share of the votes did she get?", "source": "math", "extra_info": {"ground_truth": ["12%"]}}
BORN = {
    "question": "Who was born in the year 816 + 684?",
    "source": "calc_lookup",
    "extra_info": {"ground_truth": ["Felix Belloc", "Belloc"]},
}
CHOICE = {
    "question": "Which city is larger, Paris or Lyon?",
    "source": "fact",
    "extra_info": {"ground_truth": ["Paris"]},
}
WORDS = {
    "question": "Which of the words accommodate, occurrence, vacuum and villa comes last in alphabetical order?",
    "source": "python",
    "extra_info": {"ground_truth": ["villa"]},
}
REVERSED = {"question": "Reverse the word 'level'.", "source": "python", "extra_info": {"ground_truth": ["level"]}}
AGE = {
    "question": "How old was Mira Jardine when the Meadow Aqueduct was completed?",
    "source": "lookup_calc",
    "extra_info": {"ground_truth": ["56"]},
}
LIFESPAN = {
    "question": "How many years did Clara Hollis live?",
    "source": "lookup_calc",
    "extra_info": {"ground_truth": ["41"]},
}
DISTANCE = {"question": "How many km is the walk?", "source": "arithmetic", "extra_info": {"ground_truth": ["12"]}}


def _score(task: Dict[str, Any], answer: str) -> float:
    return RuleReward()(task, answer)


# --- numbers computed from the question --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("253 + 194 + 288", id="copied expression"),
        pytest.param("253+194+288", id="copied expression without spaces"),
        pytest.param("What is 253 + 194 + 288?", id="copied question"),
        pytest.param("253 + 194 + 288 = 735", id="expression and result"),
        pytest.param("5 or 6", id="two candidates"),
        pytest.param("735 or 736", id="gold or another"),
        pytest.param("734, 735, 736", id="gold inside a list"),
        pytest.param("The answers could be 12, 735 or 9", id="gold among distractors"),
        pytest.param("between 700 and 800", id="range"),
        pytest.param("735 \u00b1 1", id="plus-minus"),
        pytest.param("about 735", id="approximation"),
        pytest.param("It is not 735.", id="negation"),
        pytest.param("minus 735", id="sign in words"),
        pytest.param("-735", id="wrong sign"),
        pytest.param("\u2212735", id="wrong sign, unicode minus"),
        pytest.param("735%", id="percentage"),
        pytest.param("735 percent", id="percentage in words"),
        pytest.param("735?", id="question mark"),
        pytest.param("Is it 735?", id="question"),
        pytest.param("", id="empty"),
        pytest.param("   \n\t ", id="whitespace"),
        pytest.param("735 " * 25_000, id="very long text"),
        pytest.param("I cannot compute this.", id="non-math text"),
        pytest.param("\\boxed{735} \\boxed{736}", id="two boxed answers"),
        pytest.param("\\boxed{735}\\text{ or }\\boxed{12}", id="boxed answers joined by text"),
        pytest.param("\\boxed{\\text{735 or 736}}", id="hedge inside the box"),
        pytest.param("\\boxed{735", id="unclosed box"),
        pytest.param("Answer: 12\n\\boxed{735}", id="marker and box disagree"),
        pytest.param("ANSWER: 735 ANSWER: 12", id="two markers"),
        pytest.param("Answer: 12\nFinal answer: 735", id="two markers on two lines"),
        pytest.param("Final answer: 735\nor maybe 736", id="hedge after the marked answer"),
        pytest.param("\\boxed{735}\nOr 736.", id="hedge after the box"),
        pytest.param("Final answer: 735 (or 736)", id="hedge on the marked line"),
        pytest.param("\\phantom{12}735", id="LaTeX injection, phantom"),
        pytest.param("\\color{white}{12}735", id="LaTeX injection, color"),
        pytest.param("7\\,35", id="LaTeX thin space inside a number"),
        pytest.param('{"answer": 735, "alternatives": [736]}', id="JSON blob"),
        pytest.param("735735", id="gold repeated"),
        pytest.param("7 3 5", id="digits spaced"),
        pytest.param("735 735", id="two numbers"),
        pytest.param("seven hundred 735", id="number word and number"),
        pytest.param("735.5", id="another decimal"),
        pytest.param("1470/2", id="unreduced fraction"),
        pytest.param("735 * 1", id="multiplication by one"),
        pytest.param("735 + 0", id="adding zero"),
        pytest.param("(735)(1)", id="implicit product"),
        pytest.param("sqrt(540225)", id="root of a perfect square"),
        pytest.param("the 735s", id="number with a suffix"),
    ],
)
def test_arithmetic_adversarial_answers_score_0(answer: str) -> None:
    assert _score(ARITHMETIC, answer) == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        "735",
        "735.",
        "735.0",
        "+735",
        "The answer is 735.",
        "the answer is 735",
        "Answer: 735",
        "ANSWER: 735",
        "Final answer: 735",
        "Final answer:\n735",
        "\\boxed{735}",
        "The sum is $\\boxed{735}$.",
        "\\boxed{735} and once more \\boxed{735}",
        "\\boxed{735}\nFinal answer: 735",
        "Final answer: 735\nI used the calculator.",
        "Is it 734 or 736? Neither: 253 + 194 = 447 and 447 + 288 = 735.\nFinal answer: 735",
        "$735$",
        "\\(735\\)",
        "**735**",
        '"735"',
        "The total is 735.",
        "735 dollars",
        "\uff17\uff13\uff15",
    ],
)
def test_arithmetic_honest_answers_score_1(answer: str) -> None:
    assert _score(ARITHMETIC, answer) == 1.0


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("1,307", 1.0),
        ("$1,307", 1.0),
        ("1307 dollars", 1.0),
        ("1{,}307", 1.0),
        ("1\\,307", 1.0),
        ("1307.00", 1.0),
        ("1 307", 0.0),  # a space is not a thousands separator: two numbers
        ("1,307 or 1,308", 0.0),
        ("1,30,7", 0.0),
        ("13,07", 0.0),
        ("1.307", 0.0),  # a decimal point, not a separator
    ],
)
def test_thousands_separators(answer: str, expected: float) -> None:
    assert _score(SUM_1307, answer) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("-735", 1.0), ("\u2212735", 1.0), ("\u2013735", 1.0), ("\uff0d735", 1.0), ("735", 0.0), ("--735", 0.0)],
)
def test_signs_matter(answer: str, expected: float) -> None:
    assert _score(NEGATIVE, answer) == expected


@pytest.mark.parametrize(
    ("task", "answer", "expected"),
    [
        (DISTANCE, "12 km", 1.0),
        (DISTANCE, "12km", 1.0),
        (DISTANCE, "12 kilometres", 1.0),
        (DISTANCE, "12 m", 0.0),  # a unit the question does not ask for
        (DISTANCE, "12 miles", 0.0),
        (DISTANCE, "12 km or 13 km", 0.0),
        (AGE, "56 years", 1.0),  # the question names no unit: any unit passes
        (AGE, "He was 56 years old.", 1.0),
        (LIFESPAN, "41 years", 1.0),
        (LIFESPAN, "41 days", 0.0),
        (SHARE, "12%", 1.0),
        (SHARE, "12 percent", 1.0),
        (SHARE, "12", 1.0),  # a percentage gold accepts the bare number
        (SHARE, "0.12", 0.0),
        (SHARE, "12%?", 0.0),
    ],
)
def test_units_and_percentages(task: Dict[str, Any], answer: str, expected: float) -> None:
    assert _score(task, answer) == expected


# --- closed forms ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        (HALF, "1/2"),
        (HALF, "\\frac{1}{2}"),
        (HALF, "\\dfrac{1}{2}"),
        (HALF, "0.5"),
        (HALF, "0.50"),
        (HALF, "$\\boxed{\\frac{1}{2}}$"),
        (HALF, "It is 1/2."),
        (ROOT, "\\sqrt{2}"),
        (ROOT, "sqrt(2)"),
        (ROOT, "\\frac{2}{\\sqrt{2}}"),
        ({**ROOT, "extra_info": {"ground_truth": ["2\\sqrt{2}"]}}, "2\\sqrt{2}"),
        ({**ROOT, "extra_info": {"ground_truth": ["\\sqrt{8}"]}}, "2\\sqrt{2}"),
        ({**ROOT, "extra_info": {"ground_truth": ["1/sqrt(2)"]}}, "\\frac{\\sqrt{2}}{2}"),
        ({**ROOT, "extra_info": {"ground_truth": ["(1+sqrt(5))/2"]}}, "\\frac{1 + \\sqrt{5}}{2}"),
        ({**ROOT, "extra_info": {"ground_truth": ["\\pi/4"]}}, "\\frac{\\pi}{4}"),
        ({**ROOT, "extra_info": {"ground_truth": ["1/e"]}}, "e^{-1}"),
        ({**HALF, "extra_info": {"ground_truth": ["-1/2"]}}, "-\\frac{1}{2}"),
        ({**HALF, "extra_info": {"ground_truth": ["-1/2"]}}, "\\frac{-1}{2}"),
    ],
)
def test_closed_forms_equal_to_the_gold_score_1(task: Dict[str, Any], answer: str) -> None:
    assert _score(task, answer) == 1.0


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        pytest.param(HALF, "1/4 + 1/4", id="copied expression"),
        pytest.param(HALF, "2/4", id="unreduced fraction"),
        pytest.param(HALF, "\\frac{2}{4}", id="unreduced LaTeX fraction"),
        pytest.param(HALF, "0.5 or 0.25", id="two candidates"),
        pytest.param(HALF, "-1/2", id="wrong sign"),
        pytest.param(HALF, "0.49999", id="rounded"),
        pytest.param(HALF, "1/2 \u00b1 0.1", id="plus-minus"),
        pytest.param(HALF, "\\frac{1}{2}?", id="question mark"),
        pytest.param(ROOT, "sqrt(2)*sqrt(2)/sqrt(2)", id="unsimplified product"),
        pytest.param(ROOT, "\\sqrt{2} + \\sqrt{2} - \\sqrt{2}", id="like terms"),
        pytest.param(ROOT, "2^{1/2}", id="power of a number"),
        pytest.param(ROOT, "1.41421356", id="rounded irrational"),
        pytest.param(ROOT, "\\sqrt[2]{2}", id="unsupported root"),
        pytest.param({**ROOT, "extra_info": {"ground_truth": ["2\\sqrt{2}"]}}, "\\sqrt{8}", id="reducible root"),
        pytest.param({**ROOT, "extra_info": {"ground_truth": ["4"]}}, "\\sqrt{16}", id="root of a square"),
    ],
)
def test_closed_form_adversarial_answers_score_0(task: Dict[str, Any], answer: str) -> None:
    assert _score(task, answer) == 0.0


# --- facts: years and names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("1889", 1.0),
        ("1,889", 1.0),
        ("1889.", 1.0),
        ("\\boxed{1889}", 1.0),
        ("It was completed in 1889.", 1.0),
        ("The Eiffel Tower was completed in 1889.", 1.0),
        ("In 1889", 1.0),
        ("1889 or 1890", 0.0),
        ("in 1889 or 1890", 0.0),
        ("1888-1889", 0.0),
        ("It was begun in 1887 and completed in 1889.", 0.0),
        ("It was probably completed in 1889.", 0.0),
        ("It was not completed in 1889.", 0.0),
        ("around 1889", 0.0),
        ("the 1880s", 0.0),
        ("1889?", 0.0),
        ("It was completed in 1889, the year of the World's Fair, after two years of work on it.", 0.0),
        ("Eighteen eighty-nine, 1889", 0.0),
    ],
)
def test_year_answers(answer: str, expected: float) -> None:
    assert _score(YEAR, answer) == expected


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        pytest.param(YEAR, "after 1889", id="after"),
        pytest.param(YEAR, "It was completed before 1889.", id="before"),
        pytest.param(YEAR, "since 1889", id="since"),
        pytest.param(YEAR, "until 1889", id="until"),
        pytest.param(YEAR, "1889 at the latest", id="at the latest"),
        pytest.param(YEAR, "It was completed in 1889 at the earliest.", id="at the earliest"),
        pytest.param(YEAR, "pre-1889", id="pre-"),
        pytest.param(YEAR, "post-1889", id="post-"),
        pytest.param(YEAR, "c. 1889", id="c."),
        pytest.param(YEAR, "c.1889", id="c. glued"),
        pytest.param(ARITHMETIC, "c 735", id="c"),
        pytest.param(ARITHMETIC, "est. 735", id="est."),
        pytest.param(ARITHMETIC, "abt. 735", id="abt."),
        pytest.param(ARITHMETIC, "up to 735", id="up to"),
        pytest.param(ARITHMETIC, "735-ish", id="-ish"),
        pytest.param(ARITHMETIC, "\u2265735", id="at least sign"),
        pytest.param(ARITHMETIC, "\u2264 735", id="at most sign"),
    ],
)
def test_a_bound_or_estimate_of_the_gold_number_scores_0(task: Dict[str, Any], answer: str) -> None:
    # The right number stated as a bound or an estimate commits to no single value.
    assert _score(task, answer) == 0.0


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        (PLACE, "Paris"),
        (PLACE, "Paris."),
        (PLACE, "paris"),
        (PLACE, "\\boxed{Paris}"),
        (PLACE, "\\boxed{\\text{Paris}}"),
        (PLACE, "The answer is Paris."),
        (PLACE, "It is in Paris."),
        (PERSON, "Neil Armstrong"),
        (PERSON, "Armstrong"),
        (PERSON, "It was Neil Armstrong."),
        (PERSON, "The first person to walk on the Moon was Neil Armstrong."),
        (CAPITAL, "Canberra"),
        (CAPITAL, "It is Canberra."),
        (CAPITAL, "The capital of Australia is Canberra."),
        (BORN, "Felix Belloc"),
        (BORN, "Belloc"),
        (BORN, "It was Felix Belloc."),
        (CHOICE, "Paris"),
        (CHOICE, "It is Paris."),
        (WORDS, "villa"),
        (WORDS, "'villa'"),
        (WORDS, "It is villa."),
        (REVERSED, "level"),
    ],
)
def test_name_honest_answers_score_1(task: Dict[str, Any], answer: str) -> None:
    assert _score(task, answer) == 1.0


@pytest.mark.parametrize(
    ("task", "answer"),
    [
        pytest.param(PLACE, "Paris, London or Rome", id="list with or"),
        pytest.param(PLACE, "Paris, London", id="comma list"),
        pytest.param(PLACE, "Paris/London", id="slash list"),
        pytest.param(PLACE, "Paris; Lyon", id="semicolon list"),
        pytest.param(PLACE, "Paris & Lyon", id="ampersand list"),
        pytest.param(PLACE, "Paris or London", id="two candidates"),
        pytest.param(PLACE, "either Paris or Lyon", id="either"),
        pytest.param(PLACE, "Not Paris", id="negation"),
        pytest.param(PLACE, "Maybe Paris", id="hedge"),
        pytest.param(PLACE, "Paris London Rome", id="names side by side"),
        pytest.param(PLACE, "It is in Paris or Lyon.", id="hedge in a sentence"),
        pytest.param(PLACE, "It is in Lyon, not Paris.", id="gold in a negation"),
        pytest.param(PLACE, "It is Lyon.", id="wrong name in a sentence"),
        pytest.param(PLACE, "paris lyon", id="lower-case names side by side"),
        pytest.param(PLACE, "Paris Paris", id="gold twice"),
        pytest.param(PLACE, "Paris?", id="question mark"),
        pytest.param(PLACE, "In which city is the Eiffel Tower?", id="copied question"),
        pytest.param(PLACE, "\\boxed{Paris}\\boxed{Lyon}", id="two boxed names"),
        pytest.param(PLACE, "Answer: Paris\nAnswer: Lyon", id="two markers"),
        pytest.param(PLACE, '{"answer": "Paris", "or": "Lyon"}', id="JSON blob"),
        pytest.param(PLACE, "Paris " * 20_000, id="very long text"),
        pytest.param(CHOICE, "Paris Lyon", id="both alternatives of the question"),
        pytest.param(CHOICE, "Lyon is smaller than Paris", id="both alternatives in a sentence"),
        pytest.param(CHOICE, "The larger city is Paris or Lyon.", id="both alternatives with or"),
        pytest.param(CHOICE, "larger Paris", id="question words when the question lists alternatives"),
        pytest.param(WORDS, "vacuum villa", id="two listed words"),
        pytest.param(WORDS, "accommodate, occurrence, vacuum and villa", id="the question's list"),
        pytest.param(REVERSED, "Reverse the word 'level'.", id="copied question containing the gold"),
        pytest.param(CAPITAL, "Sydney is the capital, Canberra.", id="another name and the gold"),
        pytest.param(BORN, "816 + 684", id="copied expression for a name"),
        pytest.param(BORN, "Felix Belloc or Ada Hesketh", id="two people with or"),
        pytest.param(BORN, "Ada Hesketh Felix Belloc", id="two people side by side"),
        pytest.param(PERSON, "Neil Armstrong and Buzz Aldrin", id="two people"),
        pytest.param(PERSON, "Neil Armstrong 1969", id="name and a number"),
        pytest.param(PERSON, "Louis Armstrong", id="another Armstrong"),
        pytest.param(PERSON, "Armstrong or Aldrin", id="surnames with or"),
    ],
)
def test_name_adversarial_answers_score_0(task: Dict[str, Any], answer: str) -> None:
    assert _score(task, answer) == 0.0


# --- the rule does not depend on the source name ---------------------------------------------------------------


@pytest.mark.parametrize("source", ["arithmetic", "fact", "nq", "renamed-source", ""])
@pytest.mark.parametrize(
    ("task", "answer", "expected"),
    [
        (ARITHMETIC, "253 + 194 + 288", 0.0),
        (ARITHMETIC, "735.0", 1.0),
        (YEAR, "1,889", 1.0),
        (YEAR, "1889 or 1890", 0.0),
        (PLACE, "Paris.", 1.0),
        (HALF, "0.5", 1.0),
    ],
)
def test_the_gold_answer_not_the_source_decides(
    source: str, task: Dict[str, Any], answer: str, expected: float
) -> None:
    assert _score({**task, "source": source}, answer) == expected


# --- bounded time ----------------------------------------------------------------------------------------------


def _score_within(task: Dict[str, Any], answer: str, seconds: float) -> Optional[float]:
    """The score, or None when scoring did not finish within ``seconds`` (the thread is left behind, a daemon)."""
    result: List[float] = []
    worker = threading.Thread(target=lambda: result.append(_score(task, answer)), daemon=True)
    worker.start()
    worker.join(seconds)
    return result[0] if result else None


@pytest.mark.parametrize(
    "answer",
    [
        "9^9^9^9",
        "10**10**10",
        "9**9**9",
        "\\boxed{9^{9^{9^{9}}}}",
        "2^(2^(2^(2^(2^10))))",
        "(10^10)!",
        "99999999999999999999^99999999999999999999",
        "sqrt(" * 60 + "2" + ")" * 60,
        "(" * 3000 + "1" + ")" * 3000,
        "1" * (MAX_ANSWER_CHARS - 1),
        "\\frac{" * 1000 + "1" + "}{2}" * 1000,
        "9" * 100_000,
        "{" * 1999 + "1" + "}" * 1999,
        "(" * 150 + "1" + ")" * 150,
        "Answer: " * 500,
        "\\boxed{" * 400 + "1" + "}" * 400,
    ],
)
def test_hostile_answers_score_0_within_a_bounded_time(answer: str) -> None:
    # A generous guard, not a timing test: before, the first three never returned.
    assert _score_within(ARITHMETIC, answer, seconds=5.0) == 0.0


@pytest.mark.parametrize("gold", ["(((10^10)^10)^10)^10", "9^9^9^9", "{" * 1999 + "1" + "}" * 1999])
def test_hostile_gold_answers_are_read_within_a_bounded_time(gold: str) -> None:
    assert _score_within({**ARITHMETIC, "extra_info": {"ground_truth": [gold]}}, "2", seconds=5.0) == 0.0


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("It was completed in 1889.", 1.0),
        ("1889 AD", 1.0),
        ("1889 BC", 0.0),  # the year -1889
        ("It was completed in 1889 BCE.", 0.0),
        ("1889 B.C.", 0.0),
        ("1889 b.c", 0.0),
    ],
)
def test_years_before_the_common_era_are_negative(answer: str, expected: float) -> None:
    assert _score(YEAR, answer) == expected
