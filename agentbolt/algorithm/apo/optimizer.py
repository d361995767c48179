"""Calls to the optimizer model: any ``AsyncOpenAI``-compatible client, with timeout, retries and a token budget."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Dict, List, Optional

from agentbolt.utils.checks import check_count, check_finite

__all__ = ["SearchBudgetExhausted", "OptimizerCalls", "OptimizerUsage", "check_positive"]

logger = logging.getLogger(__name__)


class SearchBudgetExhausted(RuntimeError):
    """The token or rollout budget is spent; the search stops with the best prompt found so far."""


@dataclass
class OptimizerUsage:
    """What the optimizer model has cost so far.

    Attributes:
        calls: Calls that returned an answer.
        failed_calls: Calls abandoned after every retry (each one skipped a candidate).
        prompt_tokens: Prompt tokens reported by the server (estimated at 4 characters a token when not reported).
        completion_tokens: Completion tokens, likewise.
    """

    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


def check_positive(value: Any, name: str) -> float:
    """``value`` if it is a finite number above 0 (a duration in seconds, say).

    Raises:
        TypeError: ``value`` is not a number (a bool is not one).
        ValueError: ``value`` is NaN, infinite, 0 or negative.
    """
    check_finite(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


def _estimated_tokens(text: str) -> int:
    return max(1, len(text) // 4)


@dataclass(eq=False)
class OptimizerCalls:
    """Ask the optimizer model for chat completions, surviving a flaky server.

    Each call has ``timeout`` seconds; a failure or timeout is retried up to ``retries`` times with exponential
    backoff (``backoff`` seconds, doubled each time, with jitter). A call that still fails returns None and is
    counted: the caller skips the candidate it was for and logs why. Once ``max_tokens`` tokens are spent, the next
    call raises :class:`SearchBudgetExhausted`.

    Args:
        client: An ``openai.AsyncOpenAI`` (or compatible) client: a hosted model, ``agentbolt serve``, the gateway.
        timeout: Seconds allowed for one attempt (a finite number above 0).
        retries: Further attempts after the first (an integer, at least 0).
        backoff: Seconds before the first retry (a finite number, at least 0).
        max_tokens: Token budget over all calls (an integer, at least 1; None: unlimited).
        completion_tokens: Completion budget of each call (an integer, at least 1; None: the server's default).

    Raises:
        TypeError: A count that is not an integer (a bool or a float included), or a duration that is not a number.
        ValueError: A value out of range, NaN or infinite.
    """

    client: Any
    _: KW_ONLY
    timeout: float = 120.0
    retries: int = 3
    backoff: float = 1.0
    max_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    usage: OptimizerUsage = field(default_factory=OptimizerUsage, init=False)
    """What the calls have cost so far."""

    def __post_init__(self) -> None:
        # named by the options of the searches that build these calls
        check_positive(self.timeout, "optimizer_timeout")
        check_count(self.retries, "optimizer_retries", minimum=0)
        check_finite(self.backoff, "optimizer_backoff", minimum=0)
        check_count(self.max_tokens, "max_optimizer_tokens", optional=True)
        check_count(self.completion_tokens, "optimizer_max_tokens", optional=True)

    def check_budget(self) -> None:
        """Raise :class:`SearchBudgetExhausted` when the token budget is spent."""
        if self.max_tokens is not None and self.usage.total_tokens >= self.max_tokens:
            raise SearchBudgetExhausted(
                f"optimizer token budget spent: {self.usage.total_tokens} of {self.max_tokens} tokens"
            )

    async def chat(
        self, *, model: str, messages: List[Dict[str, Any]], temperature: Optional[float], purpose: str
    ) -> Optional[str]:
        """One chat completion; its text, or None after the last failed attempt.

        Args:
            model: Model name sent to the server.
            messages: Chat messages.
            temperature: Sampling temperature (None: the server's default).
            purpose: What the call is for, in log messages (``"critique"``, ``"edit"``...).

        Raises:
            SearchBudgetExhausted: The budget was spent before this call.
        """
        self.check_budget()
        kwargs: Dict[str, Any] = {"model": model, "messages": messages}
        if temperature is not None:
            kwargs["temperature"] = temperature
        if self.completion_tokens is not None:
            kwargs["max_tokens"] = self.completion_tokens
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                response = await asyncio.wait_for(self.client.chat.completions.create(**kwargs), self.timeout)
                text = response.choices[0].message.content
            except Exception as exc:
                reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                if attempt == self.retries:
                    self.usage.failed_calls += 1
                    logger.warning(
                        "Optimizer %s call failed after %d attempts (%s); skipping it.", purpose, attempt + 1, reason
                    )
                    return None
                logger.info("Optimizer %s call failed (%s); retrying in %.1f s.", purpose, reason, delay)
                await asyncio.sleep(delay * (1.0 + 0.25 * random.random()))
                delay *= 2.0
                continue
            self._count(response, messages, text)
            return text
        return None  # unreachable: the loop returns on the last attempt

    def _count(self, response: Any, messages: List[Dict[str, Any]], text: Optional[str]) -> None:
        self.usage.calls += 1
        usage = getattr(response, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        completion = getattr(usage, "completion_tokens", None) if usage is not None else None
        if prompt is None:
            prompt = sum(_estimated_tokens(str(m.get("content") or "")) for m in messages)
        if completion is None:
            completion = _estimated_tokens(text or "")
        self.usage.prompt_tokens += int(prompt)
        self.usage.completion_tokens += int(completion)
