"""Prompts of the solver's roles.

One set of prompts serves training and inference, so the planner is trained on exactly the prompts it sees when
deployed. They are short (a 135M model plays every role on CPU), ask for one flat JSON object and show its exact
format; the planner's lists the tools with one line of metadata each, and the planner and solution generator get
worked examples as earlier chat turns.
"""

from __future__ import annotations

from typing import List, Tuple

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
    "executor_user",
    "planner_examples",
    "planner_system",
    "planner_user",
    "solution_examples",
    "solution_user",
    "verifier_user",
]

STOP_ACTION = "finish"
"""The planner's explicit stop action: ``"tool_name": "finish"`` ends the loop before the next tool call."""

ANALYZER_SYSTEM = (
    "You analyze a question before it is solved. Say in one sentence what is asked and list the useful tools.\n"
    'Reply with JSON only: {"summary": "...", "tools": ["..."]}'
)

PLANNER_SYSTEM = (
    "You are the planner of a problem-solving agent. Pick the single best tool for the next step and a concrete "
    "sub-goal for it. Only when the previous steps already contain the answer, use the tool name "
    f'"{STOP_ACTION}".\n'
    "Tools:\n{tools}\n"
    f"- {STOP_ACTION}: stop; the previous steps already answer the question.\n"
    "Reply with one JSON object only, in this format:\n"
    '{{"justification": "...", "context": "...", "sub_goal": "...", "tool_name": "..."}}'
)

EXECUTOR_SYSTEM = (
    "You write the input for one tool call so that it achieves the sub-goal.\n"
    'Reply with JSON only: {"tool_input": "..."}'
)

VERIFIER_SYSTEM = (
    "You check whether the steps so far contain the answer to the question. Set stop to true only when the "
    "results of the steps already give the complete answer to every part of the question; otherwise false.\n"
    'Reply with JSON only: {"analysis": "...", "stop": true}'
)

SOLUTION_SYSTEM = (
    "You give the final answer to a question using the results of the steps taken. Answer with the value only: a "
    "number, a name or a date, no sentence.\n"
    'Reply with JSON only: {"answer": "..."}'
)

GENERALIST_SYSTEM = "Answer the question briefly and directly, in one or two sentences."


def planner_system(tools: str) -> str:
    """The planner's system prompt with the tool list (one ``- name: description`` line per tool)."""
    return PLANNER_SYSTEM.format(tools=tools)


def analyzer_user(question: str, tools: str) -> str:
    """Query analyzer input."""
    return f"Tools:\n{tools}\nQuestion: {question}\nJSON:"


def planner_user(question: str, analysis: str, memory: str, turn: int, max_turns: int) -> str:
    """Planner input for one turn."""
    return (
        f"Question: {question}\nAnalysis: {analysis}\nPrevious steps:\n{memory}\n"
        f"Step {turn} of {max_turns}. Next step JSON:"
    )


def planner_examples(max_turns: int) -> List[Tuple[str, str]]:
    """Worked examples for the planner, as (user, assistant) chat turns in the exact format of real turns: the stop
    action after a step that answered, then a first-turn tool call (last, since small models lean on the most recent
    example). Small models follow demonstrated turns much better than described formats."""
    return [
        (
            planner_user(
                "How many legs do 7 spiders have?",
                "Needs a multiplication.",
                "Step 1: tool=calculator; sub-goal=Multiply 7 by 8; input=7 * 8; result=7 * 8 = 56",
                2,
                max_turns,
            ),
            f'{{"justification": "Step 1 gives the answer.", "context": "56", "sub_goal": "", "tool_name": "{STOP_ACTION}"}}',
        ),
        (
            planner_user("Who discovered penicillin?", "Asks for a person.", "none yet", 1, max_turns),
            '{"justification": "No step yet; a fact is needed.", "context": "", '
            '"sub_goal": "Find who discovered penicillin", "tool_name": "search"}',
        ),
    ]


def solution_examples() -> List[Tuple[str, str]]:
    """One worked example for the solution generator (value only, as JSON)."""
    memory = "Step 1: tool=calculator; sub-goal=Multiply 7 by 8; input=7 * 8; result=7 * 8 = 56"
    return [(solution_user("How many legs do 7 spiders have?", memory), '{"answer": "56"}')]


def executor_user(question: str, tool: ToolMetadata, sub_goal: str, context: str) -> str:
    """Executor input: the chosen tool's metadata, the sub-goal and the planner's context."""
    return (
        f"Tool: {tool.name}: {tool.description}\nInput format: {tool.input_description}\n"
        f"Example input: {tool.example_input}\nQuestion: {question}\nContext: {context or 'none'}\n"
        f"Sub-goal: {sub_goal}\nJSON:"
    )


def verifier_user(question: str, memory: str) -> str:
    """Verifier input."""
    return f"Question: {question}\nSteps so far:\n{memory}\nJSON:"


def solution_user(question: str, memory: str) -> str:
    """Solution generator input."""
    return f"Question: {question}\nSteps taken:\n{memory}\nJSON:"
