"""The solve loop with scripted roles: stop by planner or verifier, invalid steps, unknown tools, memory limits."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import pytest

import agentbolt as agl
from examples.flow_grpo import FlowGRPOAgent, FlowSolver, RoleLLM, SolverConfig
from examples.flow_grpo.agents import generate_solution
from examples.flow_grpo.memory import Memory, truncate
from examples.flow_grpo.prompts import planner_step, solution_examples
from examples.flow_grpo.tools import CalculatorTool, Document, SearchTool

from .scripted_llm import ScriptedLLM

ANALYSIS = '{"summary": "square then look up", "tools": ["calculator", "search"]}'


# A corpus of its own, so the tests do not depend on the generated one.
CORPUS = [
    Document("d1", "The Silverleaf Regatta", "The Silverleaf Regatta was held in Garford in 1454."),
    Document("d2", "Garford", "Corrin is the river that flows through Garford."),
    Document("d3", "The Lantern Games", "The Lantern Games was held in Wendale in 1415."),
]


def _solve(
    script: Dict[str, List[str]], question: str, max_turns: int = 3
) -> Tuple[Any, ScriptedLLM, List[Tuple[str, Dict[str, Any]]]]:
    events: List[Tuple[str, Dict[str, Any]]] = []
    with ScriptedLLM({"query_analyzer": [ANALYSIS], **script}) as llm:
        planner = RoleLLM.from_endpoint(llm.base_url, "planner-model")
        fixed = RoleLLM.from_endpoint(llm.base_url, "fixed-model")
        result = FlowSolver(SolverConfig(max_turns=max_turns), search=SearchTool(CORPUS)).solve(
            question, planner, fixed, lambda e, d: events.append((e, d))
        )
    return result, llm, events


def test_multi_tool_solve_stopped_by_the_planner() -> None:
    script = {
        "planner": [
            '{"justification": "math first", "context": "", "sub_goal": "Calculate 1000 + 454", "tool_name": "calculator"}',
            '{"justification": "look up", "context": "", "sub_goal": "Find the event held in 1454", "tool_name": "search"}',
            '{"justification": "answered", "context": "", "sub_goal": "", "tool_name": "finish"}',
        ],
        "executor": ['{"tool_input": "1000 + 454"}', '{"tool_input": "Find the event held in 1454"}'],
        "verifier": ['{"analysis": "we cannot stop yet", "stop": false}'],
        "solution_generator": ['{"answer": "Silverleaf Regatta"}'],
    }
    result, llm, events = _solve(script, "Which event was held in the year 1000 + 454?")
    assert result.stop_reason == "planner" and result.planner_calls == 3
    assert result.answer == "Silverleaf Regatta"
    assert [t.tool_name for t in result.turns[:2]] == ["calculator", "search"]
    assert result.turns[0].observation == "1454"
    assert result.turns[1].observation == "The Silverleaf Regatta was held in Garford in 1454."
    assert llm.roles() == ["query_analyzer", *["planner", "executor", "verifier"] * 2, "planner", "solution_generator"]
    assert [e for e, _ in events] == ["analysis", *["plan", "command", "tool", "verification"] * 2, "plan", "answer"]
    # The planner uses its own endpoint/model; every other role the fixed one.
    models = {role: body["model"] for role, body in llm.requests}
    assert models["planner"] == "planner-model" and {models[r] for r in models if r != "planner"} == {"fixed-model"}
    # Memory of earlier steps reaches the later prompts.
    last_planner_prompt = [b for r, b in llm.requests if r == "planner"][-1]["messages"][-1]["content"]
    assert "Step 1 (calculator): 1000 + 454 -> 1454\nStep 2 (search): Find the event held in 1454 -> The" in (
        last_planner_prompt
    )


def test_verifier_stop_field_ends_the_loop() -> None:
    script = {
        "planner": ['{"sub_goal": "12*12", "tool_name": "python"}'],
        "executor": ['{"tool_input": "print(12*12)"}'],
        "verifier": ['{"analysis": "done", "stop": true}'],
        "solution_generator": ['{"answer": "144"}'],
    }
    result, _, _ = _solve(script, "What is 12 * 12?")
    assert (result.stop_reason, result.planner_calls, result.answer) == ("verifier", 1, "144")
    assert result.turns[0].observation == "144"


def test_invalid_steps_and_unknown_tools_become_observations_and_use_turns() -> None:
    script = {
        "planner": ["I think we should search.", '{"sub_goal": "look it up", "tool_name": "wikipedia"}'],
        "verifier": ["STOP STOP STOP"],  # unparsable: the fallback continues
        "solution_generator": ["Ottawa, I believe"],  # not JSON: the first line is the answer
    }
    result, llm, _ = _solve(script, "What is the capital of Canada?", max_turns=3)
    assert result.stop_reason == "max_turns" and result.planner_calls == 3
    assert "executor" not in llm.roles()
    assert not result.turns[0].plan_valid and "not a valid JSON step" in (result.turns[0].observation or "")
    assert result.turns[1].plan_valid and "unknown tool 'wikipedia'" in (result.turns[1].observation or "")
    assert result.answer == "Ottawa, I believe"


def test_executor_fallback_uses_the_sub_goal_and_tool_errors_are_observations() -> None:
    script = {
        "planner": ['{"sub_goal": "1/0", "tool_name": "calculator"}'],
        "executor": ["no json here"],
        "verifier": ['{"stop": true}'],
        "solution_generator": ['{"answer": "undefined"}'],
    }
    result, _, _ = _solve(script, "What is 1/0?")
    assert result.turns[0].tool_input == "1/0"
    assert result.turns[0].observation == "Error: division by zero"


def test_memory_truncates_results_and_shows_recent_steps() -> None:
    memory = Memory(max_result_chars=50, max_actions_in_prompt=2)
    for i in range(3):
        memory.add("python", f"goal {i}", "print(1)", "x" * 1000 + f"END{i}")
    assert all(len(a.result) <= 50 and a.result.endswith(f"END{a.step - 1}") for a in memory.actions)
    rendered = memory.render()
    assert rendered.startswith("(1 earlier step(s) omitted)") and "Step 1 " not in rendered
    assert "Step 3 (python): print(1) -> " in rendered and rendered.endswith("END2")
    assert memory.last_result().endswith("END2") and Memory().last_result() == "none"
    assert truncate("short", 10) == "short"
    with pytest.raises(ValueError):
        truncate("x", 2)
    with pytest.raises(ValueError, match="max_turns"):
        SolverConfig(max_turns=0)


def test_planner_prompt_lists_every_tool_with_metadata_and_shows_worked_turns() -> None:
    script = {"planner": ['{"tool_name": "finish"}'], "solution_generator": ['{"answer": "x"}']}
    result, llm, _ = _solve(script, "q?")
    assert result.stop_reason == "planner"  # a stop needs no sub-goal
    messages = next(b for r, b in llm.requests if r == "planner")["messages"]
    system = messages[0]["content"]
    for name in ("python", "calculator", "search", "generalist", "finish"):
        assert f"- {name}:" in system
    # Four worked examples as earlier turns in the real format (a word task for Python, the stop action, a
    # calculation on a found fact, a first look-up), then the task; the tool name comes first in every step, and
    # the sub-goal repeats the question.
    assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 4, "user"]
    for index, tool in ((2, "python"), (4, "finish"), (6, "calculator"), (8, "search")):
        assert messages[index]["content"].startswith(f'{{"tool_name": "{tool}"')
    question = messages[7]["content"].split("\n")[0].removeprefix("Question: ")
    assert json.loads(messages[8]["content"])["sub_goal"] == question
    assert messages[9]["content"].startswith("Question: q?") and messages[1]["content"].endswith("Step 1 of 3. JSON:")


def test_executor_sees_the_chosen_tools_worked_examples_and_solution_generator_its_own() -> None:
    script = {
        "planner": ['{"sub_goal": "Calculate 47 * 86", "tool_name": "calculator"}'],
        "executor": ['{"tool_input": "47 * 86"}'],
        "verifier": ['{"stop": true}'],
        "solution_generator": ['{"answer": "4042"}'],
    }
    result, llm, _ = _solve(script, "What is 47 * 86?")
    assert result.answer == "4042" and result.turns[0].observation == "4042"
    executor = next(b for r, b in llm.requests if r == "executor")["messages"]
    examples = CalculatorTool.metadata.examples
    assert [m["role"] for m in executor] == ["system", *["user", "assistant"] * len(examples), "user"]
    assert json.loads(executor[2]["content"]) == {"tool_input": examples[0][2]}
    assert executor[-1]["content"].startswith("Tool: calculator\n") and executor[-1]["content"].endswith(
        "Last result: none\nSub-goal: Calculate 47 * 86\nJSON:"
    )
    assert "What is 47 * 86?" not in executor[-1]["content"]  # the executor works from the sub-goal alone
    solution = next(b for r, b in llm.requests if r == "solution_generator")["messages"]
    assert len(solution) == 2 + 2 * len(solution_examples())
    assert solution[-1]["content"] == "Question: What is 47 * 86?\nLast result: 4042\nJSON:"  # the newest result only


@pytest.mark.parametrize(
    ("raw", "answer"),
    [
        ("The answer is: Canberra.", "Canberra."),
        ('{\n  "result": 144,\n}', "144"),
        ("Ottawa, I believe", "Ottawa, I believe"),
        ("{", ""),
    ],
)
def test_solution_generator_fallback_reads_the_answer_loosely(raw: str, answer: str) -> None:
    with ScriptedLLM({"solution_generator": [raw]}) as llm:
        out = generate_solution(RoleLLM.from_endpoint(llm.base_url, "m"), "q?")
    assert not out.parsed.ok and out.value.answer == answer


def test_agent_outside_a_runner_returns_the_reward_and_checks_its_inputs() -> None:
    script = {
        "planner": ['{"sub_goal": "12*12", "tool_name": "calculator"}'],
        "executor": ['{"tool_input": "12*12"}'],
        "verifier": ['{"stop": true}'],
        "solution_generator": ['{"answer": "144"}'],
    }
    task = {"question": "What is 12 * 12?", "source": "arithmetic", "extra_info": {"ground_truth": ["144"]}}
    rollout = agl.Rollout(rollout_id="ro-1", input=task, start_time=0.0)
    with ScriptedLLM({"query_analyzer": [ANALYSIS], **script}) as llm:
        resources = {
            "main_llm": agl.LLM(endpoint=llm.base_url, model="p"),
            "fixed_llm": agl.LLM(endpoint=llm.base_url, model="f"),
        }
        agent = FlowGRPOAgent(solver=FlowSolver(SolverConfig(max_turns=2)))
        assert agent.rollout(task, resources, rollout) == 1.0  # planner_llm absent: main_llm is used
        with pytest.raises(ValueError, match="fixed_llm"):
            agent.rollout(task, {"planner_llm": resources["main_llm"]}, rollout)
        with pytest.raises(ValueError, match="question"):
            agent.rollout({"prompt": "x"}, resources, rollout)
        with pytest.raises(ValueError, match="attempted rollout"):
            agent.rollout(task, {**resources, "planner_llm": agl.ProxyLLM(endpoint=llm.base_url, model="p")}, rollout)


@pytest.mark.parametrize(
    ("planner", "mode", "reward"),
    [
        # A well-formed wrong trajectory gets the format credit in training only.
        (['{"sub_goal": "find", "tool_name": "search"}', '{"tool_name": "finish"}'], "train", 0.1),
        (['{"sub_goal": "find", "tool_name": "search"}', '{"tool_name": "finish"}'], "val", 0.0),
        (['{"sub_goal": "find", "tool_name": "search"}', '{"tool_name": "finish"}'], None, 0.0),
        # An invented tool name, an invalid step, or stopping before any tool ran: no credit.
        (['{"sub_goal": "find", "tool_name": "wikipedia"}', '{"tool_name": "finish"}'], "train", 0.0),
        (['{"sub_goal": "find", "tool_name": "search"}', "no json"], "train", 0.0),
        (['{"tool_name": "finish"}'], "train", 0.0),
    ],
)
def test_format_bonus_is_training_only_and_needs_a_well_formed_trajectory(
    planner: List[str], mode: Any, reward: float
) -> None:
    script = {
        "planner": planner,
        "executor": ['{"tool_input": "capital Canada"}'],
        "verifier": ['{"stop": false}'],
        "solution_generator": ['{"answer": "Toronto"}'],
    }
    task = {"question": "What is the capital of Canada?", "source": "fact", "extra_info": {"ground_truth": ["Ottawa"]}}
    rollout = agl.Rollout(rollout_id="ro-1", input=task, start_time=0.0, mode=mode)
    with ScriptedLLM({"query_analyzer": [ANALYSIS], **script}) as llm:
        resources = {
            "planner_llm": agl.LLM(endpoint=llm.base_url, model="p"),
            "fixed_llm": agl.LLM(endpoint=llm.base_url, model="f"),
        }
        agent = FlowGRPOAgent(solver=FlowSolver(SolverConfig(max_turns=2)), train_format_bonus=0.1)
        assert agent.rollout(task, resources, rollout) == pytest.approx(reward)
    with pytest.raises(ValueError, match="train_format_bonus"):
        FlowGRPOAgent(train_format_bonus=1.0)


@pytest.mark.parametrize("guide", ["none", "tools", "question"])
def test_planner_guide_reaches_only_the_planner_and_matches_its_format(guide: str) -> None:
    import regex

    question = 'Which event was held in "Garford"?'
    script = {
        "planner": [planner_step("search", question), planner_step("finish", question)],
        "executor": ['{"tool_input": "Garford"}'],
        "verifier": ['{"stop": false}'],
        "solution_generator": ['{"answer": "Silverleaf Regatta"}'],
    }
    events: List[Tuple[str, Dict[str, Any]]] = []
    with ScriptedLLM({"query_analyzer": [ANALYSIS], **script}) as llm:
        planner = RoleLLM.from_endpoint(llm.base_url, "planner-model")
        fixed = RoleLLM.from_endpoint(llm.base_url, "fixed-model")
        config = SolverConfig(max_turns=3, planner_guide=guide)  # type: ignore[arg-type]
        FlowSolver(config, search=SearchTool(CORPUS)).solve(
            question, planner, fixed, lambda e, d: events.append((e, d))
        )
    patterns = {role: body.get("guided_regex") for role, body in llm.requests}
    assert {role for role, pattern in patterns.items() if pattern} == (set() if guide == "none" else {"planner"})
    if guide == "none":
        return
    pattern = patterns["planner"]
    assert regex.fullmatch(pattern, planner_step("calculator", question))
    assert not regex.fullmatch(pattern, planner_step("math", question))  # only real tools and the stop action
    other_goal = planner_step("search", "Garford")
    assert bool(regex.fullmatch(pattern, other_goal)) == (guide == "tools")
    assert regex.fullmatch(pattern, planner_step("finish", ""))  # the stop action as the worked examples write it


def test_planner_guide_is_checked() -> None:
    with pytest.raises(ValueError, match="planner_guide"):
        SolverConfig(planner_guide="always")  # type: ignore[arg-type]
