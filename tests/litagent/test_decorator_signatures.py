"""Rollout functions a rollout call cannot bind are refused when decorated, not on every rollout later."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import pytest

import agentbolt as agl
from agentbolt.types import LLM, Attempt, AttemptedRollout, PromptTemplate

LOCAL = LLM(endpoint="http://127.0.0.1:9/v1", model="local")
PROMPT = PromptTemplate(template="{x}", engine="f-string")


def _attempted() -> AttemptedRollout:
    now = time.time()
    return AttemptedRollout(
        rollout_id="ro-1",
        input="t",
        start_time=now,
        attempt=Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=now),
    )


def _extra_required(task: Any, llm: LLM, temperature: float) -> float:
    return temperature


def _extra_required_keyword(task: Any, prompt_template: PromptTemplate, *, style: str) -> str:
    return style


def _llm_positional_only(task: Any, llm: LLM, /) -> None: ...


def _rollout_positional_only(task: Any, rollout: Any, /, llm: LLM) -> None: ...


def _task_keyword_only(*, task: Any, llm: LLM) -> None: ...


UNBINDABLE: list[tuple[str, Callable[..., Any], str]] = [
    ("extra required parameter", _extra_required, "required parameter `temperature`"),
    ("extra required keyword-only parameter", _extra_required_keyword, "required parameter `style`"),
    ("positional-only llm", _llm_positional_only, "`llm` of _llm_positional_only is positional-only"),
    ("positional-only rollout", _rollout_positional_only, "`rollout` of _rollout_positional_only is positional-only"),
    ("keyword-only task", _task_keyword_only, "`task` of _task_keyword_only must be positional"),
]


@pytest.mark.parametrize(("label", "func", "message"), UNBINDABLE, ids=[label for label, _, _ in UNBINDABLE])
def test_rollout_refuses_a_function_it_could_not_call(label: str, func: Callable[..., Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        agl.rollout(func)


@pytest.mark.parametrize(
    ("decorator", "func"),
    [(agl.llm_rollout, _extra_required), (agl.llm_rollout, _llm_positional_only)],
)
def test_llm_rollout_refuses_it_too(decorator: Callable[..., Any], func: Callable[..., Any]) -> None:
    with pytest.raises(TypeError, match=r"of _|has a required parameter"):
        decorator(func)


def test_prompt_rollout_refuses_it_too() -> None:
    with pytest.raises(TypeError, match="required parameter `style`"):
        agl.prompt_rollout(_extra_required_keyword)


def test_extra_parameters_with_defaults_and_star_args_are_accepted() -> None:
    def agent(task: Any, llm: LLM, *args: Any, temperature: float = 0.5, **kwargs: Any) -> float:
        return temperature

    assert agl.rollout(agent).rollout("t", {"llm": LOCAL}, _attempted()) == 0.5


def test_a_method_named_self_first_is_refused_with_a_hint_to_bind_it() -> None:
    class Agent:
        def run(self, task: Any, llm: LLM) -> float:
            return 1.0

    with pytest.raises(ValueError, match=r"got `self`; for a method, decorate the bound method"):
        agl.llm_rollout(Agent.run)
    assert agl.rollout(Agent().run).rollout("t", {"llm": LOCAL}, _attempted()) == 1.0


class _AsyncCallableAgent:
    async def __call__(self, task: Any, llm: LLM) -> float:
        return 2.0


def test_an_object_with_an_async_call_is_an_async_agent() -> None:
    agent = agl.rollout(_AsyncCallableAgent())
    assert agent.is_async()
    assert asyncio.run(agent.rollout_async("t", {"llm": LOCAL}, _attempted())) == 2.0
    with pytest.raises(RuntimeError, match="is async; call rollout_async"):
        agent.rollout("t", {"llm": LOCAL}, _attempted())
