"""Rewards: math equivalence, multi-answer QA, and the LLM judge with its counted fallback."""

from __future__ import annotations

from typing import Any, Dict, List, Union

import pytest

from agentbolt.serving.server import find_free_port
from examples.flow_grpo.agents import RoleLLM
from examples.flow_grpo.reward import LLMJudge, RuleReward, gold_answers, math_equivalent, normalize_answer

from .scripted_llm import FAIL, ScriptedLLM


def _task(gold: Union[str, List[str]], source: str) -> Dict[str, Any]:
    return {"question": "q?", "source": source, "extra_info": {"ground_truth": gold}}


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("1/2", "0.5"),
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("$\\boxed{\\frac{3}{4}}$", "0.75"),
        ("The answer is 144.", "144"),
        ("12^2 = 144", "144"),
        ("1,000", "1000"),
        ("sqrt(2)/2", "1/sqrt(2)"),
        ("2x + 2", "2(x + 1)"),
        ("0.3333333333", "1/3"),
    ],
)
def test_math_answers_equivalent_to_the_gold_score_1(answer: str, gold: str) -> None:
    assert RuleReward()(_task([gold], "mathhard"), answer) == 1.0


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("145", "144"), ("0.51", "1/2"), ("x", "1"), ("", "1"), ("9**9**9", "1"), ("__import__('os')", "0")],
)
def test_math_answers_that_differ_score_0(answer: str, gold: str) -> None:
    assert RuleReward()(_task([gold], "arithmetic"), answer) == 0.0


def test_qa_accepts_any_gold_answer_after_normalization() -> None:
    task = _task(["Leonardo da Vinci", "Leonardo", "da Vinci"], "nq")
    reward = RuleReward()
    assert reward(task, "leonardo da vinci.") == 1.0
    assert reward(task, "Da Vinci") == 1.0
    assert reward(task, "The Leonardo!") == 1.0
    assert reward(task, "Michelangelo") == 0.0
    assert reward(task, "Leonardo da Vinci painted it") == 0.0  # exact match, not containment


def test_gold_answers_come_from_extra_info_or_result() -> None:
    assert gold_answers({"extra_info": {"ground_truth": ["a", " ", None, "b"]}}) == ["a", "b"]
    assert gold_answers({"result": "x"}) == ["x"]
    assert gold_answers({}) == []
    assert RuleReward()({"question": "q", "source": "nq"}, "anything") == 0.0
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffel tower"
    assert not math_equivalent("abc", ["not math either"])


def test_judge_verdict_is_used_when_it_parses() -> None:
    script = {"judge": ['{"analysis": "same person", "true_false": true}', "{'true_false': False}"]}
    with ScriptedLLM(script) as llm:
        judge = LLMJudge(RoleLLM.from_endpoint(llm.base_url, "judge-model"))
        # The rule would say 0 (not an exact match); the judge says 1.
        assert judge(_task(["Leonardo da Vinci"], "nq"), "the painter Leonardo da Vinci") == 1.0
        assert judge(_task(["144"], "arithmetic"), "144") == 0.0
        user_prompt = llm.requests[0][1]["messages"][1]["content"]
    assert "Leonardo da Vinci" in user_prompt and judge.stats() == {"calls": 2, "failures": 0}


def test_judge_failures_fall_back_to_the_rule_and_are_counted() -> None:
    with ScriptedLLM({"judge": ["I think it is right.", FAIL]}) as llm:
        judge = LLMJudge(RoleLLM.from_endpoint(llm.base_url, "judge-model"))
        assert judge(_task(["144"], "arithmetic"), "144.0") == 1.0  # unparsable verdict -> rule
        assert judge(_task(["144"], "arithmetic"), "143") == 0.0  # HTTP 500 -> rule
    assert judge.stats() == {"calls": 2, "failures": 2}
    unreachable = LLMJudge(RoleLLM.from_endpoint(f"http://127.0.0.1:{find_free_port()}/v1", "judge-model", timeout=5))
    assert unreachable(_task(["Ottawa"], "nq"), "ottawa") == 1.0
    assert unreachable.failures == 1
