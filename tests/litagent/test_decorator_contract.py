"""The rollout decorators against the contract (§8): which signatures are accepted, clear errors for the rest."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from typing import Any, Callable

import pytest

import agentbolt as agl
from agentbolt.litagent.decorator import FunctionalLitAgent
from agentbolt.types import LLM, Attempt, AttemptedRollout, PromptTemplate

EXPECTED = "expected a signature like"
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


def _only_task(task: Any) -> None: ...


def _wrong_first(sample: Any, llm: LLM) -> None: ...


def _no_resource(task: Any, rollout: Any) -> None: ...


def _with_extra(task: Any, llm: LLM, temperature: float) -> float:
    return temperature


class _CallableAgent:
    def __call__(self, task: Any, llm: LLM) -> float:
        return 1.0


class _CallableWithoutResource:
    def __call__(self, task: Any, rollout: Any) -> float:
        return 1.0


UNSUPPORTED: list[tuple[str, Callable[..., Any]]] = [
    ("only task", _only_task),
    ("first parameter not named task", _wrong_first),
    ("neither llm nor prompt_template", _no_resource),
    ("callable object without a resource parameter", _CallableWithoutResource()),
    ("partial without a resource parameter", functools.partial(_no_resource)),
    ("lambda", lambda task: None),
]


@pytest.mark.parametrize(("label", "func"), UNSUPPORTED, ids=[label for label, _ in UNSUPPORTED])
def test_rollout_rejects_unsupported_signatures_with_the_expected_ones_named(
    label: str, func: Callable[..., Any]
) -> None:
    with pytest.raises(NotImplementedError, match=EXPECTED):
        agl.rollout(func)


@pytest.mark.parametrize("decorator", [agl.llm_rollout, agl.prompt_rollout])
@pytest.mark.parametrize(("label", "func"), UNSUPPORTED, ids=[label for label, _ in UNSUPPORTED])
def test_specific_decorators_reject_them_with_a_value_error(
    decorator: Callable[..., Any], label: str, func: Callable[..., Any]
) -> None:
    with pytest.raises(ValueError):
        decorator(func)


def test_rollout_rejects_non_callables_with_a_type_error() -> None:
    with pytest.raises(TypeError, match="callable"):
        agl.rollout(42)  # type: ignore[arg-type]


def test_callable_objects_and_partials_with_supported_signatures_are_accepted() -> None:
    agent = agl.rollout(_CallableAgent())
    assert isinstance(agent, FunctionalLitAgent) and agent._accepts_llm()
    assert agent.rollout("t", {"llm": LOCAL}, _attempted()) == 1.0

    bound = agl.rollout(functools.partial(_with_extra, temperature=0.3))
    assert bound.rollout("t", {"llm": LOCAL}, _attempted()) == 0.3


def test_prompt_pattern_is_used_when_there_is_no_llm_parameter() -> None:
    @agl.rollout
    def agent(task: Any, prompt_template: PromptTemplate) -> str:
        return prompt_template.format(x=task)

    assert agent.rollout("v", {"p": PROMPT}, _attempted()) == "v"
    with pytest.raises(ValueError, match=re.escape("No LLM resource found in the provided resources.")):
        agl.rollout(_CallableAgent()).rollout("t", {"p": PROMPT}, _attempted())


class _AgentWithoutSuperInit(agl.LitAgent[Any]):
    def __init__(self, answer: float) -> None:  # does not call LitAgent.__init__, as user code often does
        self.answer = answer

    def rollout(self, task: Any, resources: Any, rollout: Any) -> float:
        return self.answer


def test_subclass_skipping_super_init_still_reports_missing_trainer_and_runner() -> None:
    agent = _AgentWithoutSuperInit(1.0)
    assert agent.trained_agents is None
    with pytest.raises(ValueError, match=re.escape("Trainer has not been set for this agent.")):
        agent.get_trainer()
    with pytest.raises(ValueError, match=re.escape("Runner has not been set for this agent.")):
        agent.get_runner()
    with pytest.raises(ValueError, match=re.escape("Trainer has not been set for this agent.")):
        agent.get_tracer()


# Rollout functions a rollout call cannot bind are refused when decorated, not on every rollout later.
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
