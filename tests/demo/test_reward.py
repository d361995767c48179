"""The demo's reward against adversarial and honest final messages: only one ``ANSWER: <integer>`` line counts."""

from __future__ import annotations

from typing import Optional

import pytest

from agentbolt.demo.agent import Episode, RewardConfig, score
from agentbolt.demo.task import ArithmeticTask, parse_answer

TASK = ArithmeticTask(
    id="val-0", question="What is 37 * 12? Reply with 'ANSWER: <number>'.", expression="37 * 12", answer=444
)
NEGATIVE = ArithmeticTask(id="val-1", question="What is 120 - 564?", expression="120 - 564", answer=-444)
LARGE = ArithmeticTask(id="val-2", question="What is 97 * 98?", expression="97 * 98", answer=9506)


def _reward(task: ArithmeticTask, final_text: str, config: RewardConfig = RewardConfig()) -> float:
    return score(Episode(final_text=final_text, answer=parse_answer(final_text)), task, config)


@pytest.mark.parametrize(
    "final_text",
    [
        pytest.param("ANSWER: 37 * 12", id="copied expression"),
        pytest.param("ANSWER: 444 * 1", id="expression starting with the result"),
        pytest.param("ANSWER: 444 + 0", id="adding zero"),
        pytest.param("ANSWER: 443\nANSWER: 444", id="two answer lines"),
        pytest.param("ANSWER: 444 ANSWER: 445", id="two answers on one line"),
        pytest.param("answer: 443\nANSWER: 444", id="second marker in lower case"),
        pytest.param("ANSWER: 444 or 445", id="gold or another"),
        pytest.param("ANSWER: 443, 444, 445", id="gold among distractors"),
        pytest.param("ANSWER: 444\nor maybe 445", id="hedge after the answer line"),
        pytest.param("ANSWER: -444", id="wrong sign"),
        pytest.param("ANSWER: 444.5", id="decimal"),
        pytest.param("ANSWER: 444%", id="percentage"),
        pytest.param("ANSWER: 444?", id="question mark"),
        pytest.param("ANSWER: 4445", id="longer number"),
        pytest.param("ANSWER: 4 44", id="digits spaced"),
        pytest.param("ANSWER:", id="empty answer"),
        pytest.param("", id="empty message"),
        pytest.param("   ", id="whitespace"),
        pytest.param("444", id="no marker"),
        pytest.param("The answer is 444.", id="another format"),
        pytest.param("ANSWER: 444" + " 444" * 20_000, id="very long"),
        pytest.param("ANSWER: 9^9^9^9", id="tower of powers"),
        pytest.param("ANSWER: \uff14\uff14\uff14", id="full-width digits"),
        pytest.param('{"ANSWER": 444}', id="JSON blob"),
        pytest.param("ANSWER: " + "9" * 5000, id="number beyond int conversion limit"),
        pytest.param("ANSWER: 444" + ",444" * 2000, id="grouped number beyond int conversion limit"),
    ],
)
def test_gameable_final_messages_score_0(final_text: str) -> None:
    assert _reward(TASK, final_text) == 0.0


@pytest.mark.parametrize(
    ("task", "final_text"),
    [
        (TASK, "ANSWER: 444"),
        (TASK, "ANSWER:444"),
        (TASK, "ANSWER: 444."),
        (TASK, "  ANSWER: 444  \n"),
        (TASK, "The calculator says 444.\nANSWER: 444"),
        (NEGATIVE, "ANSWER: -444"),
        (LARGE, "ANSWER: 9506"),
        (LARGE, "ANSWER: 9,506"),
    ],
)
def test_honest_final_messages_score_1(task: ArithmeticTask, final_text: str) -> None:
    assert _reward(task, final_text) == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ANSWER: 444", 444),
        ("The result is 444.\nANSWER:  -12", -12),
        ("ANSWER: 1 then ANSWER: 2", None),
        ("ANSWER: 1\nANSWER: 1", None),
        ("answer: 444", None),
        ("ANSWER: 12,345", 12345),
        ("ANSWER: 12,34", None),
        (None, None),
    ],
)
def test_parse_answer_reads_the_one_answer_line(text: Optional[str], expected: Optional[int]) -> None:
    assert parse_answer(text) == expected


def test_a_hedged_answer_earns_no_format_credit() -> None:
    credit = RewardConfig(format_credit=0.1)
    assert _reward(TASK, "ANSWER: 443", credit) == pytest.approx(0.1)  # well formed but wrong
    assert _reward(TASK, "ANSWER: 443 or 444", credit) == 0.0
