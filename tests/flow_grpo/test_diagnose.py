"""``python -m examples.flow_grpo.diagnose``: the oracle planner, failure categories and the report, against scripted
fixed roles (a model that could play them does not fit in a fast test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from examples.flow_grpo.data import load_offline_dataset
from examples.flow_grpo.diagnose import OraclePlanner, classify, main, oracle_steps
from examples.flow_grpo.solver import FlowSolver, SolverConfig

from .scripted_llm import ScriptedLLM

ANALYSIS = '{"summary": "s", "tools": []}'
TASKS = [
    {"id": 1, "question": "What is 47 * 86?", "source": "arithmetic", "extra_info": {"ground_truth": ["4042"]}},
    {"id": 2, "question": "Who wrote Hamlet?", "source": "fact", "extra_info": {"ground_truth": ["Shakespeare"]}},
]


def _write_tasks(path: Path, tasks: List[Dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps({**t, "result": t["extra_info"]["ground_truth"][0]}) + "\n" for t in tasks))
    return path


def test_oracle_planner_uses_the_sources_tool_then_stops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = {
        "query_analyzer": [ANALYSIS],
        # The executor copies the sub-goal (the question, for a task without a plan); the calculator reads the
        # expression inside it.
        "executor": ['{"tool_input": "What is 47 * 86?"}'],
        "verifier": ['{"stop": false}'],
        "solution_generator": ['{"answer": "4042"}'],
    }
    out = tmp_path / "records.jsonl"
    tasks = _write_tasks(tmp_path / "tasks.jsonl", TASKS[:1])
    with ScriptedLLM(script) as llm:
        argv = ["--planner", "oracle", "--split", str(tasks), "--planner-url", llm.base_url, "--planner-model", "m"]
        assert main([*argv, "--json", str(out)]) == 0
        assert "planner" not in llm.roles()  # the oracle answers without a model
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["category"] == "success" and record["first_action"] == "calculator"
    assert record["steps"][0]["result"] == "4042"
    assert (record["planner_turns"], record["tool_calls"], record["stop_reason"]) == (2, 1, "planner")
    report = capsys.readouterr().out
    assert (
        "planner=oracle: 1/1 solved" in report
        and "arithmetic: 1/1 solved; first planner action: calculator 1" in report
        and "per question: 2.00 planner turns, 1.00 tool calls; stop reasons: planner 1" in report
    )


def test_oracle_with_question_sub_goals_keeps_the_plans_tools_only() -> None:
    task = next(t for t in load_offline_dataset("val") if t["source"] == "calc_lookup")
    plan = oracle_steps(task, {})
    guided = oracle_steps(task, {}, question_sub_goals=True)
    assert plan is not None and guided is not None
    assert [tool for tool, _ in guided] == [tool for tool, _ in plan]
    assert {sub_goal for _, sub_goal in guided} == {task["question"]} != {sub_goal for _, sub_goal in plan}


def test_oracle_follows_a_tasks_reference_plan_step_by_step(tmp_path: Path) -> None:
    task = next(t for t in load_offline_dataset("val") if t["source"] == "calc_lookup")
    steps = oracle_steps(task, {})
    assert steps is not None and [tool for tool, _ in steps] == ["calculator", "search"]
    assert oracle_steps(TASKS[1], {}) is None and oracle_steps(TASKS[1], {"fact": "search"}) == [
        ("search", "Who wrote Hamlet?")
    ]
    # The executor copies each sub-goal; the solution generator the gold answer.
    script = {
        "query_analyzer": [ANALYSIS],
        "executor": [json.dumps({"tool_input": sub_goal}) for _, sub_goal in steps],
        "verifier": ['{"stop": false}'],
        "solution_generator": [json.dumps({"answer": task["result"]})],
    }
    out = tmp_path / "records.jsonl"
    tasks = _write_tasks(tmp_path / "tasks.jsonl", [task])
    with ScriptedLLM(script) as llm:
        argv = ["--planner", "oracle", "--split", str(tasks), "--planner-url", llm.base_url, "--planner-model", "m"]
        assert main([*argv, "--json", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["reward"] == 1.0 and [s["tool_name"] for s in record["steps"]] == ["calculator", "search"]
    assert task["result"] in record["steps"][1]["result"]


@pytest.mark.parametrize(
    ("planner", "executor", "answer", "category"),
    [
        (["no json"], "x", "1", "planner_invalid"),
        (['{"tool_name": "finish"}'], "x", "1", "planner_stopped_at_once"),
        (['{"sub_goal": "s", "tool_name": "wikipedia"}', '{"tool_name": "finish"}'], "x", "1", "planner_unknown_tool"),
        (
            ['{"sub_goal": "s", "tool_name": "calculator"}', '{"tool_name": "finish"}'],
            "47 * 86",
            "4000",
            "answer_not_copied",
        ),
        (['{"sub_goal": "s", "tool_name": "calculator"}', '{"tool_name": "finish"}'], "zz", "4000", "tool_error"),
        (['{"sub_goal": "s", "tool_name": "calculator"}', '{"tool_name": "finish"}'], "4 * 4", "16", "wrong_result"),
        (['{"sub_goal": "s", "tool_name": "calculator"}', '{"tool_name": "finish"}'], "47 * 86", "4042", "success"),
    ],
)
def test_failures_are_classified_by_where_they_happened(
    planner: List[str], executor: str, answer: str, category: str
) -> None:
    script = {
        "query_analyzer": [ANALYSIS],
        "planner": planner,
        "executor": [json.dumps({"tool_input": executor})],
        "verifier": ['{"stop": false}'],
        "solution_generator": [json.dumps({"answer": answer})],
    }
    task = TASKS[0]
    with ScriptedLLM(script) as llm:
        from examples.flow_grpo.agents import RoleLLM

        result = FlowSolver(SolverConfig(max_turns=2)).solve(
            task["question"], RoleLLM.from_endpoint(llm.base_url, "p"), RoleLLM.from_endpoint(llm.base_url, "f")
        )
    assert classify(task, result, 1.0 if answer == "4042" else 0.0) == category


def test_oracle_needs_a_tool_for_every_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = _write_tasks(tmp_path / "tasks.jsonl", [{**TASKS[1], "source": "nq"}])
    argv = ["--planner", "oracle", "--split", str(tasks), "--planner-url", "http://127.0.0.1:9/v1"]
    assert main([*argv, "--planner-model", "m"]) == 2
    assert "no --oracle-tool for source(s) nq" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--oracle-tool", "nq"])
    planner = OraclePlanner([("search", "q?")])
    assert json.loads(planner.chat("planner", "sys", "u1", examples=[("eu", "ea")])) == {
        "tool_name": "search",
        "sub_goal": "q?",
    }
    assert json.loads(planner.chat("planner", "sys", "u2"))["tool_name"] == "finish"
    # Each call is kept as a training conversation: its prompt, then the scripted step.
    assert planner.turns[0] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "eu"},
        {"role": "assistant", "content": "ea"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": '{"tool_name": "search", "sub_goal": "q?"}'},
    ]
    assert planner.turns[1][-1]["content"] == '{"tool_name": "finish", "sub_goal": ""}'


def test_a_split_that_is_no_task_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--split", str(tmp_path / "missing.jsonl")])
    assert exit_info.value.code == 2
    assert "missing.jsonl: not 'train', 'val' or a task file" in capsys.readouterr().err
