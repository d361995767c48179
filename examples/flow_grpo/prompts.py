"""Prompts of the solver's roles.

One set of prompts serves training and inference, so the planner is trained on exactly the prompts it sees when
deployed. They are short (a 135M model plays every role on CPU, and every prompt token is paid for at each call and
at each training update), ask for one flat JSON object and show its exact format. Every role but the query analyzer
gets worked examples as earlier chat turns: a 135M model copies a demonstrated answer far more reliably than it
follows a described format. The examples are about places, people and events that are not in the shipped dataset,
and their questions follow other patterns than the dataset's.

The memory of earlier steps is rendered one line per step (``Step 1 (search): <input> -> <result>``) for the planner
and the verifier. The solution generator gets the question and the newest result only: the planner decides which
step comes last, and shown every step, a 135M generator copied a name or a year of the first look-up of a two-step
question (the city, not its founding year) far more often than the answer in the last one.
"""

from __future__ import annotations

import json
import re
from typing import List, Optional, Sequence, Tuple

from examples.flow_grpo.tools.base import ToolMetadata

__all__ = [
    "ANALYZER_SYSTEM",
    "EXECUTOR_SYSTEM",
    "GENERALIST_SYSTEM",
    "PLANNER_SYSTEM",
    "SOLUTION_SYSTEM",
    "STOP_ACTION",
    "VERIFIER_SYSTEM",
    "analyzer_user",
    "executor_examples",
    "executor_user",
    "planner_examples",
    "planner_step_pattern",
    "planner_step",
    "planner_system",
    "planner_user",
    "solution_examples",
    "solution_user",
    "verifier_examples",
    "verifier_user",
]

STOP_ACTION = "finish"
"""The planner's explicit stop action: ``"tool_name": "finish"`` ends the loop before the next tool call."""

ANALYZER_SYSTEM = (
    "You analyze a question before it is solved. Say in one sentence what is asked and list the useful tools.\n"
    'Reply with JSON only: {"summary": "...", "tools": ["..."]}'
)

PLANNER_SYSTEM = (
    "You plan the next step towards answering a question. Tools:\n{tools}\n"
    f"- {STOP_ACTION}: stop, the steps already answer the question.\n"
    "Use one tool per step. Write in the sub-goal the exact names and numbers the tool needs, copied from the "
    "question and the earlier steps.\n"
    'Reply with JSON only: {{"tool_name": "...", "sub_goal": "..."}}'
)

EXECUTOR_SYSTEM = (
    "You write the input of one tool call that achieves the sub-goal. Copy names, numbers and words exactly.\n"
    'Reply with JSON only: {"tool_input": "..."}'
)

VERIFIER_SYSTEM = (
    "You check whether the steps so far answer the question. Set stop to true only when the last result gives "
    "the value the question asks for; if it gives something else, or a calculation is still needed, set false.\n"
    'Reply with JSON only: {"stop": true} or {"stop": false}'
)

SOLUTION_SYSTEM = (
    "You give the final answer to a question: copy the value the question asks for from the last result. Answer with the value only: a number, a name or a word, no sentence.\n"
    'Reply with JSON only: {"answer": "..."}'
)

GENERALIST_SYSTEM = "Answer the question briefly and directly, in one or two sentences."

# The worked examples' small world (not in the shipped corpus).
_LAKE = "Which lake lies next to the town where the Iron Treaty was signed?"
_YEARS = "How many years was the Iron Treaty in force?"
_LETTER = "Which letter appears most often in the word 'cheese'?"
_SIGNED = f"Step 1 (search): {_LAKE} -> The Iron Treaty was signed in Brookvale in 1620."
_LAKE_FOUND = f"Step 2 (search): {_LAKE} -> Lake Oren lies next to Brookvale."
_IN_FORCE = f"Step 1 (search): {_YEARS} -> The Iron Treaty was in force from 1620 to 1688."
_COMPUTED = "Step 2 (calculator): 1688 - 1620 -> 68"


def planner_system(tools: str) -> str:
    """The planner's system prompt with the tool list (one ``- name: description`` line per tool)."""
    return PLANNER_SYSTEM.format(tools=tools)


def analyzer_user(question: str, tools: str) -> str:
    """Query analyzer input."""
    return f"Tools:\n{tools}\nQuestion: {question}\nJSON:"


def planner_user(question: str, analysis: str, memory: str, turn: int, max_turns: int) -> str:
    """Planner input for one turn."""
    return f"Question: {question}\nAnalysis: {analysis}\nSteps so far:\n{memory}\nStep {turn} of {max_turns}. JSON:"


def planner_step(tool: str, sub_goal: str) -> str:
    """A planner answer in the format its worked examples show: ``{"tool_name": ..., "sub_goal": ...}``."""
    return json.dumps({"tool_name": tool, "sub_goal": sub_goal})


_JSON_STRING_BODY = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*'
"""The characters of a JSON string between its quotes."""


def planner_step_pattern(tools: Sequence[str], sub_goal: Optional[str] = None) -> str:
    """The regular expression of one planner answer naming one of ``tools`` or the stop action, written as
    :func:`planner_step` writes it: ``{"tool_name": "<tool>", "sub_goal": "<any JSON string>"}``. Given
    ``sub_goal``, a tool step has exactly that sub-goal and the stop action an empty one, as the worked examples
    show."""
    if sub_goal is None:
        names = "|".join(re.escape(name) for name in [*tools, STOP_ACTION])
        return r'\{"tool_name": "(?:' + names + r')", "sub_goal": "' + _JSON_STRING_BODY + r'"\}'
    names = "|".join(re.escape(name) for name in tools)
    goal = re.escape(json.dumps(sub_goal)[1:-1])
    return (
        r'\{"tool_name": "(?:(?:'
        + names
        + r')", "sub_goal": "'
        + goal
        + r'"|'
        + re.escape(STOP_ACTION)
        + r'", "sub_goal": "")\}'
    )


def planner_examples(max_turns: int) -> List[Tuple[str, str]]:
    """Worked examples for the planner, as (user, assistant) chat turns in the exact format of real turns: a word
    task for Python, the stop action once a step answered, a calculation on a found fact, and a first look-up. The
    sub-goal repeats the question: the executor and the follow-up search take it from there. A 135M planner leans
    towards the tool of the last example, so the order is part of the design (the look-up, the most common first
    step, comes last)."""
    return [
        (planner_user(_LETTER, "Asks about letters.", "none yet", 1, max_turns), planner_step("python", _LETTER)),
        (planner_user(_YEARS, "Asks for a duration.", f"{_IN_FORCE}\n{_COMPUTED}", 3, max_turns), planner_step(STOP_ACTION, "")),
        (planner_user(_YEARS, "Asks for a duration.", _IN_FORCE, 2, max_turns), planner_step("calculator", _YEARS)),
        (planner_user(_LAKE, "Asks for a lake.", "none yet", 1, max_turns), planner_step("search", _LAKE)),
    ]  # fmt: skip


def verifier_examples() -> List[Tuple[str, str]]:
    """Worked examples for the verifier: a look-up that found the asked value (stop), a computed value (stop), a
    first look-up that found only an intermediate fact (continue), found numbers still to compute with (continue).
    The last example says "continue": a 135M verifier leans towards the last example's answer, and stopping too
    early ends a solve that needed more steps."""
    return [
        (verifier_user(_LAKE, f"{_SIGNED}\n{_LAKE_FOUND}"), '{"stop": true}'),
        (verifier_user(_YEARS, f"{_IN_FORCE}\n{_COMPUTED}"), '{"stop": true}'),
        (verifier_user(_LAKE, _SIGNED), '{"stop": false}'),
        (verifier_user(_YEARS, _IN_FORCE), '{"stop": false}'),
    ]


def solution_examples() -> List[Tuple[str, str]]:
    """Worked examples for the solution generator, each copying the asked value from a result sentence that holds
    other names or numbers: a place, a person, a name found from a computed year, a computed number, and a year whose
    sentence starts with a name. A 135M generator leans towards the kind of value of the last example; the year comes
    last because the two-step year questions are where it otherwise copies the name."""
    return [
        (solution_user(_LAKE, "Lake Oren lies next to Brookvale."), '{"answer": "Lake Oren"}'),
        (solution_user("Who signed the Iron Treaty?", "Mara Vell signed the Iron Treaty in 1620."), '{"answer": "Mara Vell"}'),
        (solution_user("Which bridge opened in the year 1700 + 52?", "The Salt Bridge opened in 1752."), '{"answer": "Salt Bridge"}'),
        (solution_user(_YEARS, "68"), '{"answer": "68"}'),
        (
            solution_user("In what year was the town where the Iron Treaty was signed founded?", "Brookvale was founded in 1388."),
            '{"answer": "1388"}',
        ),
    ]  # fmt: skip


def executor_examples(tool: ToolMetadata) -> List[Tuple[str, str]]:
    """The chosen tool's worked examples for the executor, as (user, assistant) chat turns. A tool example's
    "question" slot holds the last result the executor sees ("none" before the first step)."""
    return [
        (executor_user(tool, sub_goal, "", last_result), json.dumps({"tool_input": tool_input}))
        for last_result, sub_goal, tool_input in tool.examples
    ]


def executor_user(tool: ToolMetadata, sub_goal: str, context: str, last_result: str = "none") -> str:
    """Executor input: the chosen tool, its input format, the newest result and the planner's sub-goal (and
    context, when given).

    The question is left out on purpose: shown it, a 135M executor copies the question instead of the sub-goal,
    so the planner's decision of what to look up or compute would not reach the tool.
    """
    context_line = f"Context: {context}\n" if context else ""
    return (
        f"Tool: {tool.name}\nInput format: {tool.input_description}\nLast result: {last_result}\n{context_line}"
        f"Sub-goal: {sub_goal}\nJSON:"
    )


def verifier_user(question: str, memory: str) -> str:
    """Verifier input."""
    return f"Question: {question}\nSteps so far:\n{memory}\nJSON:"


def solution_user(question: str, last_result: str) -> str:
    """Solution generator input: the question and the newest result."""
    return f"Question: {question}\nLast result: {last_result}\nJSON:"
