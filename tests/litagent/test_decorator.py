"""Rollout decorators: signature validation and resource injection by parameter name and type."""

from __future__ import annotations

import logging
import time
from typing import Any, List

import pytest

import agentbolt as agl
from agentbolt.litagent.decorator import FunctionalLitAgent
from agentbolt.types import LLM, Attempt, AttemptedRollout, NamedResources, PromptTemplate, ProxyLLM, Rollout


def _attempted(mode: str = "train") -> AttemptedRollout:
    now = time.time()
    return AttemptedRollout(
        rollout_id="ro-abc",
        input="task",
        start_time=now,
        mode=mode,  # type: ignore[arg-type]
        attempt=Attempt(rollout_id="ro-abc", attempt_id="at-xyz", sequence_id=1, start_time=now),
    )


PROMPT = PromptTemplate(template="Answer: {question}", engine="f-string")
LOCAL = LLM(endpoint="http://127.0.0.1:9/v1", model="local", sampling_parameters={"temperature": 0.5})
PROXY = ProxyLLM(endpoint="http://127.0.0.1:8/v1", model="proxied")


def test_llm_rollout_injects_the_first_llm_and_the_rollout() -> None:
    seen: List[Any] = []

    @agl.llm_rollout
    def agent(task: str, llm: LLM, rollout: Rollout) -> float:
        """Doc of the agent."""
        seen.append((task, llm, rollout))
        return 1.0

    assert isinstance(agent, FunctionalLitAgent)
    assert (agent.__name__, agent.__doc__) == ("agent", "Doc of the agent.")
    assert agent.__wrapped__ is not None  # type: ignore[attr-defined]
    assert not agent.is_async()
    resources: NamedResources = {"prompt": PROMPT, "main": LOCAL}
    rollout = _attempted()
    assert agent.training_rollout("t", resources, rollout) == 1.0
    assert seen == [("t", LOCAL, rollout)]
    assert agent("direct", LOCAL, rollout) == 1.0  # __call__ runs the raw function


def test_proxy_llm_is_bound_to_the_attempt_unless_strip_proxy_is_false() -> None:
    received: List[LLM] = []

    @agl.llm_rollout
    def stripped(task: str, llm: LLM) -> None:
        received.append(llm)

    @agl.llm_rollout(strip_proxy=False)
    def kept(task: str, llm: LLM) -> None:
        received.append(llm)

    stripped.rollout("t", {"llm": PROXY}, _attempted())
    kept.rollout("t", {"llm": PROXY}, _attempted())
    bound, raw = received
    assert type(bound) is LLM
    assert bound.endpoint == "http://127.0.0.1:8/rollout/ro-abc/attempt/at-xyz/v1"
    assert bound.model == "proxied"
    assert raw is PROXY

    plain_rollout = Rollout(rollout_id="ro-abc", input="t", start_time=time.time())
    with pytest.raises(ValueError, match="AttemptedRollout"):
        stripped.rollout("t", {"llm": PROXY}, plain_rollout)


def test_missing_and_multiple_llms(caplog: pytest.LogCaptureFixture) -> None:
    @agl.llm_rollout
    def agent(task: str, llm: LLM) -> str:
        return llm.model

    with pytest.raises(ValueError, match=r"No LLM resource found in the provided resources\."):
        agent.rollout("t", {"prompt": PROMPT}, _attempted())
    with caplog.at_level(logging.WARNING, logger="agentbolt.litagent.decorator"):
        assert agent.rollout("t", {"a": LOCAL, "b": PROXY}, _attempted()) == "local"
    assert "Multiple LLM resources" in caplog.text


def test_prompt_rollout_injects_the_prompt_template() -> None:
    @agl.prompt_rollout
    def agent(task: dict, prompt_template: PromptTemplate) -> str:
        return prompt_template.format(**task)

    @agl.prompt_rollout()
    def agent_called(task: dict, prompt_template: PromptTemplate, rollout: Rollout) -> str:
        return f"{rollout.mode}:{prompt_template.format(**task)}"

    resources: NamedResources = {"llm": LOCAL, "prompt": PROMPT}
    assert agent.validation_rollout({"question": "why"}, resources, _attempted("val")) == "Answer: why"
    assert agent_called.rollout({"question": "q"}, resources, _attempted("val")) == "val:Answer: q"
    with pytest.raises(ValueError, match="No prompt template"):
        agent.rollout({"question": "q"}, {"llm": LOCAL}, _attempted())


async def test_async_functions_use_the_async_api() -> None:
    @agl.rollout
    async def agent(task: str, llm: LLM, prompt_template: PromptTemplate) -> float:
        return 0.25 if prompt_template is PROMPT and llm is LOCAL else 0.0

    assert agent.is_async()
    resources: NamedResources = {"p": PROMPT, "l": LOCAL}
    assert await agent.training_rollout_async("t", resources, _attempted()) == 0.25
    with pytest.raises(RuntimeError, match="is async"):
        agent.rollout("t", resources, _attempted())

    @agl.rollout
    def sync_agent(task: str, prompt_template: PromptTemplate) -> None:
        return None

    with pytest.raises(RuntimeError, match="is synchronous"):
        await sync_agent.rollout_async("t", resources, _attempted())


def test_signature_validation() -> None:
    with pytest.raises(ValueError, match="at least two parameters"):
        agl.llm_rollout(lambda task: None)
    with pytest.raises(ValueError, match=r"first parameter .* must be named `task`"):

        @agl.llm_rollout
        def wrong_first(sample: str, llm: LLM) -> None: ...

    with pytest.raises(ValueError, match="`prompt_template`"):

        @agl.prompt_rollout
        def no_template(task: str, llm: LLM) -> None: ...

    with pytest.raises(NotImplementedError, match="expected a signature like"):

        @agl.rollout
        def neither(task: str, rollout: Rollout) -> None: ...

    @agl.rollout
    def prompt_pattern(task: str, prompt_template: PromptTemplate) -> None: ...

    assert prompt_pattern._accepts_prompt_template() and not prompt_pattern._accepts_llm()


def test_generator_functions_are_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match="is a generator function"):

        @agl.rollout
        def yields(task: str, llm: LLM) -> Any:
            yield 1.0

    with pytest.raises(TypeError, match="is a generator function"):

        @agl.llm_rollout
        async def yields_async(task: str, llm: LLM) -> Any:
            yield 1.0
