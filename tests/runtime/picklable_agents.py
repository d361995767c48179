"""Decorated agents defined at module level, and a child-process entry point, for the pickling tests.

Child processes started with ``spawn`` import this module to unpickle what they are sent.
"""

from __future__ import annotations

import time
from typing import Any

import agentbolt as agl


@agl.rollout
def doubling_agent(task: int, prompt_template: agl.PromptTemplate) -> float:
    """The decorated function's name now refers to the agent: pickled by reference."""
    return float(task * 2)


@agl.llm_rollout(strip_proxy=False)
def unstripped_agent(task: int, llm: agl.LLM) -> float:
    """Decorated with settings, still by reference."""
    return float(task)


def tripling(task: int, prompt_template: agl.PromptTemplate) -> float:
    """A function that keeps its name; the agent made from it is pickled with its function and settings."""
    return float(task * 3)


tripling_agent = agl.prompt_rollout(tripling)


def identity(task: int, llm: agl.LLM) -> float:
    """A function that keeps its name, made into agents with different settings by the tests."""
    return float(task)


PROMPT = agl.PromptTemplate(template="{x}", engine="f-string")


def run_rollout(agent: agl.LitAgent[Any], task: Any, results: Any) -> None:
    """Child-process entry point: run the agent's rollout on ``task`` and send back what it returned."""
    rollout = agl.Rollout(rollout_id="ro-child", input=task, start_time=time.time())
    results.put(agent.rollout(task, {"prompt": PROMPT}, rollout))
