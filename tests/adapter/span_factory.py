"""Builders for realistic store spans: agent spans, traced LLM calls, tool spans, gateway calls and rewards."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from agentbolt.types import Span

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


class SpanFactory:
    """Creates spans of one rollout with increasing sequence ids and readable span ids."""

    def __init__(self, rollout_id: str = "ro-test", attempt_id: str = "at-test", trace_id: str = TRACE_ID) -> None:
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.trace_id = trace_id
        self.sequence = 0

    def span(
        self,
        name: str,
        start: float,
        end: float,
        *,
        parent: Optional[Span] = None,
        parent_id: Optional[str] = None,
        attributes: Optional[Dict[str, Any]] = None,
        span_id: Optional[str] = None,
        trace_id: Optional[str] = None,
        sequence_id: Optional[int] = None,
    ) -> Span:
        self.sequence += 1
        return Span.from_attributes(
            attributes=attributes or {},
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            sequence_id=sequence_id if sequence_id is not None else self.sequence,
            name=name,
            trace_id=trace_id or self.trace_id,
            span_id=span_id or f"{self.sequence:016x}",
            parent_id=parent.span_id if parent is not None else parent_id,
            start_time=1_700_000_000.0 + start,
            end_time=1_700_000_000.0 + end,
        )

    def agent(self, agent_name: str, start: float, end: float, **kwargs: Any) -> Span:
        """An agent span as recorded by an agent framework (``agent.name`` attribute)."""
        return self.span(f"invoke_agent {agent_name}", start, end, attributes={"agent.name": agent_name}, **kwargs)

    def llm_call(
        self,
        start: float,
        end: float,
        *,
        response_id: Optional[str],
        prompt: str = "question",
        answer: str = "answer",
        prompt_token_ids: Optional[List[int]] = None,
        response_token_ids: Optional[List[int]] = None,
        logprobs: Optional[List[float]] = None,
        name: str = "openai.chat.completion",
        extra: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> Span:
        """A traced OpenAI chat completion (``gen_ai.*`` keys, token ids, ``logprobs.content`` JSON)."""
        attributes: Dict[str, Any] = {
            "gen_ai.system": "openai",
            "gen_ai.request.model": "smollm2-135m",
            "gen_ai.request.temperature": 0.7,
            "gen_ai.response.model": "smollm2-135m",
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "You are helpful.",
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": prompt,
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": answer,
            "gen_ai.completion.0.finish_reason": "stop",
            "gen_ai.usage.input_tokens": len(prompt_token_ids or []),
            "gen_ai.usage.output_tokens": len(response_token_ids or []),
        }
        if response_id is not None:
            attributes["gen_ai.response.id"] = response_id
        if prompt_token_ids is not None:
            attributes["prompt_token_ids"] = prompt_token_ids
        if response_token_ids is not None:
            attributes["response_token_ids"] = response_token_ids
        if logprobs is not None:
            attributes["logprobs.content"] = json.dumps(
                [{"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in enumerate(logprobs)]
            )
        attributes.update(extra or {})
        return self.span(name, start, end, attributes=attributes, **kwargs)

    def gateway_call(
        self,
        start: float,
        end: float,
        *,
        response_id: str,
        prompt_token_ids: Optional[List[int]],
        response_token_ids: Optional[List[int]],
        logprobs: Optional[List[float]] = None,
        agent_name: Optional[str] = None,
        **kwargs: Any,
    ) -> Span:
        """An ``agentbolt.llm_call`` span as the LLM gateway records it (own trace, no parent)."""
        attributes: Dict[str, Any] = {
            "gen_ai.request.model": "smollm2-135m",
            "gen_ai.response.id": response_id,
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "hi",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "hello",
            "gen_ai.usage.input_tokens": len(prompt_token_ids or []),
            "gen_ai.usage.output_tokens": len(response_token_ids or []),
        }
        if prompt_token_ids is not None:
            attributes["prompt_token_ids"] = prompt_token_ids
        if response_token_ids is not None:
            attributes["response_token_ids"] = response_token_ids
        if logprobs is not None:
            attributes["response_logprobs"] = logprobs
        if agent_name is not None:
            attributes["agentbolt.llm.agent_name"] = agent_name
        kwargs.setdefault("trace_id", "1" * 32)
        return self.span("agentbolt.llm_call", start, end, attributes=attributes, **kwargs)

    def reward(self, value: float, at: float, **kwargs: Any) -> Span:
        """A reward span as ``emit_reward`` records it."""
        return self.span(
            "agentlightning.annotation",
            at,
            at,
            attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value},
            **kwargs,
        )

    def tool(self, name: str, arguments: Dict[str, Any], call_id: str, start: float, end: float, **kwargs: Any) -> Span:
        """A tool execution span (``tool.*`` keys)."""
        return self.span(
            f"tool {name}",
            start,
            end,
            attributes={
                "tool.name": name,
                "tool.parameters": json.dumps(arguments),
                "tool.call.id": call_id,
                "tool.call.type": "function",
            },
            **kwargs,
        )
