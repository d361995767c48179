"""The solver's roles: one OpenAI-SDK call each, tagged with the role's name, parsed into the role's schema.

Every call carries its role name twice, so that an adapter's ``agent_match="planner"`` selects the planner's
calls whichever way the trace was recorded (a regex search: no other role's name holds ``planner``):

* the ``x-agentbolt-agent-name`` request header, which the agentbolt LLM gateway copies into its span
  (``agentbolt.llm.agent_name``) — for :class:`~agentbolt.adapter.LlmProxyTraceToTriplet`;
* an enclosing operation span with ``agent.name`` = the role, when a tracer is active — for
  :class:`~agentbolt.adapter.TracerTraceToTriplet`, whose OpenAI instrumentation records the call inside it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Type, TypeVar

from pydantic import BaseModel

from agentbolt.semconv import LLM_AGENT_NAME_HEADER
from agentbolt.tracer.base import get_active_tracer
from examples.flow_grpo import prompts
from examples.flow_grpo.parsing import ParseResult, parse_output
from examples.flow_grpo.schemas import FinalAnswer, NextStep, QueryAnalysis, ToolCommand, Verification
from examples.flow_grpo.tools.base import ToolMetadata, normalize_tool_name

if TYPE_CHECKING:
    import openai

    from agentbolt.types import LLM, Rollout

__all__ = [
    "ANALYZER",
    "EXECUTOR",
    "GENERALIST",
    "PLANNER",
    "ROLES",
    "SOLUTION_GENERATOR",
    "VERIFIER",
    "RoleLLM",
    "RoleOutput",
    "analyze_query",
    "chat_messages",
    "generate_command",
    "generate_solution",
    "is_stop_action",
    "plan_next_step",
    "verify",
]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

ANALYZER = "query_analyzer"
PLANNER = "planner"
EXECUTOR = "executor"
VERIFIER = "verifier"
SOLUTION_GENERATOR = "solution_generator"
GENERALIST = "generalist"
ROLES = (ANALYZER, PLANNER, EXECUTOR, VERIFIER, SOLUTION_GENERATOR, GENERALIST)
"""Role (agent) names as they appear in traces; only ``planner`` is trained."""


class RoleLLM:
    """An OpenAI-compatible endpoint used by one or more roles.

    Args:
        client: OpenAI SDK client (owned: closed by :meth:`close`).
        model: Model name sent in requests.
        sampling_parameters: Extra request parameters (temperature, top_p, max_tokens...); they override the roles'
            defaults.
    """

    def __init__(self, client: openai.OpenAI, model: str, sampling_parameters: Optional[Dict[str, Any]] = None):
        self.client = client
        self.model = model
        self.sampling_parameters = dict(sampling_parameters or {})

    @classmethod
    def from_endpoint(
        cls,
        base_url: str,
        model: str,
        *,
        api_key: Optional[str] = None,
        sampling_parameters: Optional[Dict[str, Any]] = None,
        timeout: float = 300.0,
    ) -> RoleLLM:
        """A client for ``base_url`` (an OpenAI-compatible ``.../v1`` URL)."""
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout, max_retries=1)
        return cls(client, model, sampling_parameters)

    @classmethod
    def from_resource(cls, llm: LLM, rollout: Optional[Rollout] = None, *, timeout: float = 300.0) -> RoleLLM:
        """A client for an ``agl.LLM`` resource; a ``ProxyLLM`` is bound to the rollout's current attempt."""
        from agentbolt.types import AttemptedRollout, ProxyLLM

        if isinstance(llm, ProxyLLM):
            if not isinstance(rollout, AttemptedRollout):
                raise ValueError("a ProxyLLM resource needs the attempted rollout to build its URL")
            base_url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        else:
            base_url = llm.endpoint
        return cls.from_endpoint(
            base_url, llm.model, api_key=llm.api_key, sampling_parameters=llm.sampling_parameters, timeout=timeout
        )

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()

    def chat(
        self,
        role: str,
        system: str,
        user: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        examples: Sequence[Tuple[str, str]] = (),
        extra_body: Optional[Dict[str, Any]] = None,
    ) -> str:
        """One chat completion by ``role``; returns the answer text (empty when the model said nothing).

        Args:
            role: Agent name recorded with the call.
            system: System prompt.
            user: The user message.
            max_tokens: Answer budget (the resource's sampling parameters may override it).
            temperature: Default temperature (idem).
            examples: Worked examples, sent as (user, assistant) turns before ``user``.
            extra_body: Extra request fields the endpoint understands (e.g. vLLM's ``guided_regex``).

        Raises:
            openai.OpenAIError: The endpoint failed (the rollout fails; the runner decides about retries).
        """
        messages = chat_messages(system, user, examples)
        params: Dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, **self.sampling_parameters}
        with _agent_span(role):
            response = self.client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                extra_headers={LLM_AGENT_NAME_HEADER: role},
                extra_body=extra_body,
                **params,
            )
        content = response.choices[0].message.content if response.choices else None
        return content or ""


def chat_messages(system: str, user: str, examples: Sequence[Tuple[str, str]] = ()) -> List[Dict[str, str]]:
    """The chat messages of one role call: system prompt, worked examples as earlier turns, then ``user``."""
    messages: List[Dict[str, str]] = [{"role": "system", "content": system}]
    for example_user, example_answer in examples:
        messages += [{"role": "user", "content": example_user}, {"role": "assistant", "content": example_answer}]
    messages.append({"role": "user", "content": user})
    return messages


@contextlib.contextmanager
def _agent_span(role: str) -> Iterator[None]:
    """An operation span naming the agent while a tracer is active (nothing otherwise, e.g. in ``solve``)."""
    if get_active_tracer() is None:
        yield
        return
    from agentbolt.emitter import operation

    attributes: Dict[str, Any] = {"agent.name": role}  # the key trace adapters read agent names from
    with operation(name=role, **attributes):
        yield


@dataclass
class RoleOutput:
    """A role's parsed answer and the raw text it came from."""

    role: str
    raw: str
    parsed: ParseResult[Any]

    @property
    def value(self) -> Any:
        """The validated model (or the role's fallback)."""
        return self.parsed.value


def _ask(
    llm: RoleLLM,
    role: str,
    system: str,
    user: str,
    schema: Type[M],
    fallback: M,
    max_tokens: int,
    examples: Sequence[Tuple[str, str]] = (),
    extra_body: Optional[Dict[str, Any]] = None,
) -> RoleOutput:
    raw = llm.chat(role, system, user, max_tokens=max_tokens, examples=examples, extra_body=extra_body)
    parsed = parse_output(raw, schema, fallback)
    if not parsed.ok:
        logger.debug("%s answer did not parse (%s): %r", role, parsed.error, raw[:200])
    return RoleOutput(role, raw, parsed)


def analyze_query(llm: RoleLLM, question: str, tools: str, max_tokens: int = 96) -> RoleOutput:
    """Query analyzer. Fallback: the question itself as summary, no tool preference."""
    fallback = QueryAnalysis(summary=question, tools=[])
    return _ask(
        llm,
        ANALYZER,
        prompts.ANALYZER_SYSTEM,
        prompts.analyzer_user(question, tools),
        QueryAnalysis,
        fallback,
        max_tokens,
    )


def plan_next_step(
    llm: RoleLLM,
    question: str,
    tools: str,
    analysis: str,
    memory: str,
    turn: int,
    max_turns: int,
    max_tokens: int = 128,
    examples: bool = True,
    guided_tools: Optional[Sequence[str]] = None,
    guided_sub_goal: Optional[str] = None,
) -> RoleOutput:
    """Planner (trained), with its worked examples as earlier turns unless ``examples`` is False. Given
    ``guided_tools``, its decoding is guided to a step naming one of them or the stop action, with
    ``guided_sub_goal`` as its sub-goal when that is given (:func:`examples.flow_grpo.prompts.planner_step_pattern`).
    Fallback: an empty step, which the solver records as an invalid action."""
    fallback = NextStep(sub_goal="", tool_name="")
    user = prompts.planner_user(question, analysis, memory, turn, max_turns)
    worked = prompts.planner_examples(max_turns) if examples else []
    guide = None
    if guided_tools is not None:
        guide = {"guided_regex": prompts.planner_step_pattern(guided_tools, guided_sub_goal)}
    system = prompts.planner_system(tools)
    return _ask(llm, PLANNER, system, user, NextStep, fallback, max_tokens, worked, extra_body=guide)


def generate_command(
    llm: RoleLLM, tool: ToolMetadata, sub_goal: str, context: str, last_result: str = "none", max_tokens: int = 64
) -> RoleOutput:
    """Executor. Fallback: the sub-goal itself as the tool input."""
    fallback = ToolCommand(tool_input=sub_goal)
    user = prompts.executor_user(tool, sub_goal, context, last_result)
    examples = prompts.executor_examples(tool)
    return _ask(llm, EXECUTOR, prompts.EXECUTOR_SYSTEM, user, ToolCommand, fallback, max_tokens, examples)


def verify(llm: RoleLLM, question: str, memory: str, max_tokens: int = 16) -> RoleOutput:
    """Verifier. Fallback: continue (``stop`` false)."""
    fallback = Verification(analysis="", stop=False)
    return _ask(
        llm,
        VERIFIER,
        prompts.VERIFIER_SYSTEM,
        prompts.verifier_user(question, memory),
        Verification,
        fallback,
        max_tokens,
        prompts.verifier_examples(),
    )


def _loose_answer(raw: str) -> str:
    """Best guess at the answer in text that ignored the JSON format.

    The first line with letters or digits, without JSON punctuation and without a leading ``key:`` label
    (``The answer is: Canberra.`` -> ``Canberra.``, ``"result": 144,`` -> ``144``).
    """
    for line in raw.splitlines():
        text = line.strip().strip("{}[],\"'` ")
        label = re.match(r"^[\"']?[A-Za-z_][A-Za-z_ ]{0,29}[\"']?\s*:\s*(.+)$", text)
        if label:
            text = label.group(1).strip().strip(",\"'` ")
        if re.search(r"[A-Za-z0-9]", text):
            return text[:200]
    return ""


def generate_solution(llm: RoleLLM, question: str, last_result: str = "none", max_tokens: int = 32) -> RoleOutput:
    """Solution generator: the answer to ``question`` copied from the newest tool result.

    Fallback: the answer read loosely from the raw text (see :func:`_loose_answer`)."""
    raw = llm.chat(
        SOLUTION_GENERATOR,
        prompts.SOLUTION_SYSTEM,
        prompts.solution_user(question, last_result),
        max_tokens=max_tokens,
        examples=prompts.solution_examples(),
    )
    parsed = parse_output(raw, FinalAnswer, FinalAnswer(answer=_loose_answer(raw)))
    return RoleOutput(SOLUTION_GENERATOR, raw, parsed)


def is_stop_action(step: NextStep) -> bool:
    """Whether the planner chose the stop action; only the structured ``tool_name`` field decides."""
    return normalize_tool_name(step.tool_name) == normalize_tool_name(prompts.STOP_ACTION)
