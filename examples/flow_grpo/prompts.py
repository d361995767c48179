"""Prompts of the solver's roles.

One set of prompts serves training and inference, so the planner is trained on exactly the prompts it sees when
deployed. They are short (a 135M model plays every role on CPU), ask for one flat JSON object and show its exact
format; the planner's lists the tools with one line of metadata each (saying when each tool is the right one). The
planner, the executor and the solution generator get worked examples as earlier chat turns: a 135M model copies a
demonstrated answer far more reliably than it follows a described format. The examples use questions that are not
in the shipped dataset.
"""

from __future__ import annotations

import json
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
    "executor_examples",
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
    '{{"tool_name": "...", "sub_goal": "...", "context": "...", "justification": "..."}}'
)

EXECUTOR_SYSTEM = (
    "You write the input for one tool call so that it achieves the sub-goal. Copy numbers, expressions and names "
    "exactly from the question.\n"
    'Reply with JSON only: {"tool_input": "..."}'
)

VERIFIER_SYSTEM = (
    "You check whether the steps so far contain the answer to the question. Set stop to true only when the "
    "results of the steps already give the complete answer to every part of the question; otherwise false.\n"
    'Reply with JSON only: {"analysis": "...", "stop": true}'
)

SOLUTION_SYSTEM = (
    "You give the final answer to a question using the results of the steps taken: copy the value from the last "
    "result. Answer with the value only: a number, a name or a year, no sentence.\n"
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
    """Worked examples for the planner, as (user, assistant) chat turns in the exact format of real turns: a fact
    sent to search, the stop action after a step that answered, a calculation sent to the calculator. Small models
    follow demonstrated turns much better than described formats."""
    return [
        (
            planner_user("Who discovered penicillin?", "Asks for a person.", "none yet", 1, max_turns),
            '{"tool_name": "search", "sub_goal": "Find who discovered penicillin", "context": "", '
            '"justification": "The question asks for a fact."}',
        ),
        (
            planner_user(
                "How many legs do 7 spiders have?",
                "Needs a multiplication.",
                "Step 1: tool=calculator; sub-goal=Multiply 7 by 8; input=7 * 8; result=7 * 8 = 56",
                2,
                max_turns,
            ),
            f'{{"tool_name": "{STOP_ACTION}", "sub_goal": "", "context": "56", "justification": "Step 1 gives the answer."}}',
        ),
        (
            planner_user("What is 23 * 47 + 5?", "Needs a calculation.", "none yet", 1, max_turns),
            '{"tool_name": "calculator", "sub_goal": "Calculate 23 * 47 + 5", "context": "", '
            '"justification": "The question asks to compute with numbers."}',
        ),
    ]


def solution_examples() -> List[Tuple[str, str]]:
    """Worked examples for the solution generator (the value copied from the last result, as JSON)."""
    fact = (
        "Step 1: tool=search; sub-goal=Find who discovered penicillin; input=discovered penicillin; "
        "result=[Penicillin] Penicillin was discovered in 1928 by the Scottish physician Alexander Fleming."
    )
    year = (
        "Step 1: tool=search; sub-goal=Find the launch year; input=Hubble telescope launch year; "
        "result=[Hubble Space Telescope] The Hubble Space Telescope, 13 metres long, was launched in 1990."
    )
    calculation = "Step 1: tool=calculator; sub-goal=Multiply 7 by 8; input=7 * 8; result=7 * 8 = 56"
    return [
        (solution_user("Who discovered penicillin?", fact), '{"answer": "Alexander Fleming"}'),
        (solution_user("In what year was the Hubble telescope launched?", year), '{"answer": "1990"}'),
        (solution_user("How many legs do 7 spiders have?", calculation), '{"answer": "56"}'),
    ]


def executor_examples(tool: ToolMetadata) -> List[Tuple[str, str]]:
    """The chosen tool's worked examples for the executor, as (user, assistant) chat turns."""
    return [
        (executor_user(question, tool, sub_goal, ""), json.dumps({"tool_input": tool_input}))
        for question, sub_goal, tool_input in tool.examples
    ]


def executor_user(question: str, tool: ToolMetadata, sub_goal: str, context: str) -> str:
    """Executor input: the chosen tool's metadata, the sub-goal and the planner's context."""
    return (
        f"Tool: {tool.name}\nInput format: {tool.input_description}\nQuestion: {question}\n"
        f"Context: {context or 'none'}\nSub-goal: {sub_goal}\nJSON:"
    )


def verifier_user(question: str, memory: str) -> str:
    """Verifier input."""
    return f"Question: {question}\nSteps so far:\n{memory}\nJSON:"


def solution_user(question: str, memory: str) -> str:
    """Solution generator input."""
    return f"Question: {question}\nSteps taken:\n{memory}\nJSON:"
