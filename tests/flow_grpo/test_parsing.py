"""The tolerant JSON parser: round trips, repairs of common small-model mistakes, fallbacks, stop detection."""

from __future__ import annotations

import pytest

from examples.flow_grpo.agents import is_stop_action
from examples.flow_grpo.parsing import parse_output, repair_json
from examples.flow_grpo.schemas import FinalAnswer, NextStep, QueryAnalysis, ToolCommand, Verification

FALLBACK = NextStep(sub_goal="", tool_name="")


@pytest.mark.parametrize(
    "value",
    [
        NextStep(justification="Exact arithmetic.", context="12", sub_goal="Compute 12**2", tool_name="calculator"),
        NextStep(justification='He said "hi"\nthen left', context="{not json}", sub_goal="a, b: c", tool_name="search"),
        NextStep(sub_goal="stop here", tool_name="finish"),
    ],
)
def test_planner_output_round_trips(value: NextStep) -> None:
    result = parse_output(value.model_dump_json(), NextStep, FALLBACK)
    assert result.ok and not result.repaired
    assert result.value == value


@pytest.mark.parametrize(
    ("text", "sub_goal", "tool_name"),
    [
        # prose and a code fence around the object
        (
            'Here is my plan:\n```json\n{"sub_goal": "square 12", "tool_name": "python"}\n```\nDone.',
            "square 12",
            "python",
        ),
        # single quotes, key spelling variants, trailing comma
        ("{'Sub-Goal': 'square 12', 'Tool Name': 'python',}", "square 12", "python"),
        # unquoted keys and bare-word values
        ("{sub_goal: find the year, tool: search}", "find the year", "search"),
        # answer cut at max_tokens before the closing quote and brace
        (
            '{"justification": "need facts", "sub_goal": "Eiffel Tower year", "tool_name": "search',
            "Eiffel Tower year",
            "search",
        ),
        # a raw newline inside a string
        ('{"sub_goal": "line one\nline two", "tool_name": "generalist"}', "line one\nline two", "generalist"),
        # wrapped in the schema's name
        ('{"NextStep": {"sub_goal": "x", "tool_name": "calculator"}}', "x", "calculator"),
        # the numbered "Key: value" format models fall back to
        ("1. **Justification:** math\n2. **Sub-Goal:** 3 * 4\n3. **Tool Name:** calculator", "3 * 4", "calculator"),
    ],
)
def test_planner_output_repairs(text: str, sub_goal: str, tool_name: str) -> None:
    result = parse_output(text, NextStep, FALLBACK)
    assert result.ok
    assert (result.value.sub_goal, result.value.tool_name) == (sub_goal, tool_name)


@pytest.mark.parametrize(
    "text", ["", None, "I will use the calculator.", "{}", '{"sub_goal": "x"}', '{"tool_name": null, "sub_goal": "x"}']
)
def test_unusable_output_returns_the_fallback_with_a_reason(text: object) -> None:
    result = parse_output(text, NextStep, FALLBACK)  # type: ignore[arg-type]
    assert not result.ok
    assert result.value is FALLBACK
    assert result.error


def test_first_valid_object_wins_over_an_earlier_invalid_one() -> None:
    text = 'Not this: {"foo": 1}. This: {"sub_goal": "y", "tool_name": "search"}'
    assert parse_output(text, NextStep, FALLBACK).value.tool_name == "search"


def test_python_literals_and_bool_strings_are_accepted_for_structured_fields() -> None:
    assert parse_output("{'analysis': 'ok', 'stop': True}", Verification, Verification(stop=False)).value.stop is True
    assert parse_output('{"analysis": "", "stop": "false"}', Verification, Verification(stop=True)).value.stop is False
    assert parse_output('{"answer": 144}', FinalAnswer, FinalAnswer(answer="")).value.answer == "144"
    assert parse_output(
        '{"summary": "s", "tools": "python, search"}', QueryAnalysis, QueryAnalysis(summary="")
    ).value.tools == ["python", "search"]
    assert parse_output('{"command": "12*12"}', ToolCommand, ToolCommand(tool_input="")).value.tool_input == "12*12"


def test_repair_json_closes_what_was_left_open() -> None:
    assert repair_json("{'a': [1, 2,], b: None, c: \"x") == '{"a": [1, 2], "b": null, "c": "x"}'


def test_unquoted_expressions_become_strings_and_numbers_stay_numbers() -> None:
    assert repair_json('{"tool_input": 12*12, "n": -3.5e2}') == '{"tool_input": "12*12", "n": -3.5e2}'
    command = parse_output('{"tool_input": (17 + 25) * 3}', ToolCommand, ToolCommand(tool_input=""))
    assert command.ok and command.value.tool_input == "(17 + 25) * 3"


@pytest.mark.parametrize(
    ("tool_name", "stop"), [("finish", True), (" Finish ", True), ("FINISH", True), ("search", False), ("", False)]
)
def test_stop_action_is_read_from_the_tool_name_only(tool_name: str, stop: bool) -> None:
    assert is_stop_action(NextStep(sub_goal="x", tool_name=tool_name)) is stop


def test_stop_words_in_free_text_do_not_stop() -> None:
    # The reference's substring checks stopped on these; only the structured fields count here.
    plan = parse_output(
        '{"sub_goal": "compute the final answer with Python", "tool_name": "python"}', NextStep, FALLBACK
    )
    assert not is_stop_action(plan.value)
    verdict = parse_output(
        '{"analysis": "We cannot STOP yet; final answer missing.", "stop": false}',
        Verification,
        Verification(stop=True),
    )
    assert verdict.ok and verdict.value.stop is False
    # An unparsable verifier answer falls back to "continue", even if it shouts STOP.
    fallback = Verification(stop=False)
    assert parse_output("STOP. Conclusion: STOP", Verification, fallback).value.stop is False
