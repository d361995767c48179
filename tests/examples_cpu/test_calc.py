"""The calc example: its splits, its strict reward, the MCP calculator, rollouts and a GRPO run on a tiny model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.split_overlap import describe, find_overlaps

import agentbolt as agl

from .rollouts import run_rollouts
from .scripted_chat import ScriptedChat, tool_call

pytest.importorskip("mcp")

from examples.calc.agent import CalcAgent
from examples.calc.task import DATA_DIR, load_split, make_splits, parse_answer, reward

TASK = load_split("test")[0]


def test_shipped_splits_are_the_generated_ones() -> None:
    splits = make_splits()
    for name in ("train", "test"):
        expected = "".join(json.dumps(task, sort_keys=True) + "\n" for task in splits[name])
        assert (DATA_DIR / f"{name}.jsonl").read_text(encoding="utf-8") == expected


def test_held_out_problems_share_no_frame_operands_or_wording_with_training() -> None:
    train, test = load_split("train"), load_split("test")
    assert {t["frame"] for t in train}.isdisjoint({t["frame"] for t in test})
    operands = {(t["operation"], *sorted(t["expression"].split(" ")[::2])) for t in train}
    assert not [t for t in test if (t["operation"], *sorted(t["expression"].split(" ")[::2])) in operands]
    overlaps = find_overlaps([t["question"] for t in train], [t["question"] for t in test])
    assert not overlaps, describe(overlaps)
    assert {t["operation"] for t in test} == {"multiply", "add", "subtract", "divide"}


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (f"ANSWER: {TASK['answer']}", 1.0),
        (f"The calculator says so.\nANSWER: {TASK['answer']:,}", 1.0),
        ("", 0.0),
        (TASK["question"], 0.0),  # the question copied back
        (f"ANSWER: {TASK['answer']}\nANSWER: 7", 0.0),  # several candidates
        (f"answer: 1 ANSWER: {TASK['answer']}", 0.0),  # a hedge in another case
        (f"ANSWER: 12 or {TASK['answer']} or 99", 0.0),  # the gold among distractors
        (f"ANSWER: {TASK['expression']}", 0.0),  # an expression, not a number
        ("word " * 5000 + f"ANSWER: {TASK['answer'] + 1}", 0.0),  # very long and wrong
        (f"ANSWER: {TASK['answer']}.5", 0.0),
    ],
)
def test_held_out_reward_is_strict(reply: str, expected: float) -> None:
    assert reward(reply, TASK) == expected


def test_format_credit_only_for_steps_done_right() -> None:
    assert reward("no answer", TASK, called_tool=True, format_credit=0.1) == pytest.approx(0.1)
    assert reward("ANSWER: 1", TASK, called_tool=True, format_credit=0.1) == pytest.approx(0.2)
    assert reward(f"ANSWER: {TASK['answer']}", TASK, called_tool=False, format_credit=0.1) == 1.0
    assert parse_answer("ANSWER: -12") == -12


@pytest.mark.parametrize("credit", [0.5, 0.6, 1.0, -0.1])
def test_a_format_credit_a_wrong_answer_could_earn_as_much_as_a_right_one_is_refused(credit: float) -> None:
    with pytest.raises(ValueError, match=r"below 0\.5"):
        reward("ANSWER: 1", TASK, called_tool=True, format_credit=credit)
    with pytest.raises(ValueError, match=r"below 0\.5"):
        CalcAgent(format_credit=credit)


def test_a_wrong_answer_earns_less_than_a_right_one_at_the_largest_credit() -> None:
    credit = 0.4999
    wrong = reward(f"ANSWER: {TASK['answer'] + 1}", TASK, called_tool=True, format_credit=credit)
    assert wrong < reward(f"ANSWER: {TASK['answer']}", TASK, called_tool=False, format_credit=credit) == 1.0


def test_the_agent_runs_the_calculator_through_mcp() -> None:
    from openai import AsyncOpenAI

    script = [tool_call("calculate", {"expression": TASK["expression"]}), f"ANSWER: {TASK['answer']}"]

    async def conversation() -> object:
        async with AsyncOpenAI(base_url=chat.base_url, api_key="unused") as client:
            return await CalcAgent().converse(client, "scripted", TASK["question"])

    with ScriptedChat(script) as chat:
        episode = asyncio.run(conversation())
    assert episode.tool_calls == [("calculate", json.dumps({"expression": TASK["expression"]}), str(TASK["answer"]))]
    assert episode.reply == f"ANSWER: {TASK['answer']}" and episode.turns == 2
    # The model saw the MCP server's tool as an OpenAI function tool, and the tool result came back to it.
    assert chat.requests[0]["tools"][0]["function"]["name"] == "calculate"
    assert chat.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": str(TASK["answer"]),
    }


def test_bad_tool_calls_come_back_to_the_model_as_errors() -> None:
    from openai import AsyncOpenAI

    not_json = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": "{not json"}}
    script = [
        tool_call("calculate", {"expression": "__import__('os')"}),
        tool_call("rm", {"path": "/"}),
        {"role": "assistant", "content": None, "tool_calls": [not_json]},
        tool_call("calculate", {"expression": "1 / 0"}),
        "ANSWER: 0",
    ]

    async def conversation() -> object:
        async with AsyncOpenAI(base_url=chat.base_url, api_key="unused") as client:
            return await CalcAgent(max_turns=5).converse(client, "scripted", TASK["question"])

    with ScriptedChat(script) as chat:
        episode = asyncio.run(conversation())
    results = [result for _, _, result in episode.tool_calls]
    assert results[1:3] == ["error: unknown tool 'rm'", "error: the arguments are not JSON"]
    assert all(result.startswith("error") for result in results) and len(results) == 4
    assert not episode.tool_succeeded and episode.reply == "ANSWER: 0"


def test_rollouts_through_the_trainer_are_stored_with_their_rewards(tmp_path: Path) -> None:
    train_task = load_split("train")[0]
    script = [tool_call("calculate", {"expression": "1 + 1"}), "ANSWER: 2"]
    with ScriptedChat(script) as chat:
        rollouts = run_rollouts(
            CalcAgent(), agl.LLM(endpoint=chat.base_url, model="scripted"), tmp_path / "store.sqlite",
            train=[train_task], val=[TASK],
        )  # fmt: skip
    assert {r.status for r in rollouts} == {"succeeded"}
    by_mode = {r.mode: r for r in rollouts}
    # A wrong answer after a working calculator call: format credit in training, 0 on the held-out task.
    assert by_mode["train"].rewards["primary"] == pytest.approx(0.2)
    assert by_mode["val"].rewards["primary"] == 0.0
