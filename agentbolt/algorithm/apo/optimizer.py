"""Calls to the optimizer model: any ``AsyncOpenAI``-compatible client, with timeout, retries and a token budget."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Dict, List, Optional

from agentbolt.utils.checks import check_count, check_finite

__all__ = [
    "MAX_TEMPERATURE",
    "OptimizerError",
    "SearchBudgetExhausted",
    "OptimizerCalls",
    "OptimizerUsage",
    "check_positive",
    "check_temperature",
]

logger = logging.getLogger(__name__)

MAX_TEMPERATURE = 2.0
"""The highest sampling temperature the OpenAI chat API accepts; servers refuse a higher one with a 400."""

RETRIED_CLIENT_ERRORS = frozenset({408, 409, 429})
"""HTTP statuses below 500 worth another attempt (timeout, conflict, rate limit); other 4xx replies are final."""

CONFIGURATION_ERRORS = frozenset({401, 403, 404})
"""HTTP statuses that mean the optimizer is misconfigured (key, permission, model or URL): no call can succeed."""


class SearchBudgetExhausted(RuntimeError):
    """The token or rollout budget is spent; the search stops with the best prompt found so far."""


class OptimizerError(RuntimeError):
    """The optimizer model cannot serve the search.

    Raised at once when the server refuses a call as misconfigured (HTTP 401, 403 or 404: a wrong API key, a model
    the key may not use, a model or URL the server does not have), and at the end of a search in which every
    optimizer call failed. Either way the best prompt so far (the seed at worst) stays available from
    ``get_best_prompt()`` and is stored as ``{run_id}-best``.
    """


@dataclass
class OptimizerUsage:
    """What the optimizer model has cost so far.

    Attributes:
        calls: Calls that returned an answer with text (an empty text included).
        failed_calls: Calls that gave no text: failed after every retry, refused by the server (a 4xx status other
            than 408, 409 and 429, which are retried), or answered without content. Each one skipped a candidate.
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


def check_temperature(value: Any, name: str) -> float:
    """``value`` if it is a sampling temperature the OpenAI API accepts: a finite number from 0 to 2.

    Raises:
        TypeError: ``value`` is not a number (a bool is not one).
        ValueError: ``value`` is NaN, infinite, negative or above 2.
    """
    check_finite(value, name, minimum=0)
    if value > MAX_TEMPERATURE:
        raise ValueError(f"{name} must be at most {MAX_TEMPERATURE:g} (the OpenAI API's limit), got {value!r}")
    return float(value)


def _status_code(exc: BaseException) -> Optional[int]:
    """The HTTP status of a failed call (``openai.APIStatusError`` and compatible errors carry one), else None."""
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _estimated_tokens(text: str) -> int:
    return max(1, len(text) // 4)


@dataclass(eq=False)
class OptimizerCalls:
    """Ask the optimizer model for chat completions, surviving a flaky server.

    Each call has ``timeout`` seconds; a timeout, a connection error, a server error (5xx) or a 408, 409 or 429
    reply is retried up to ``retries`` times with exponential backoff (``backoff`` seconds, doubled each time, with
    jitter). A call that still fails, one the server refuses with another 4xx status (a bad request cannot succeed
    on a retry), and a reply without content return None and are counted as failed: the caller skips the candidate
    it was for and logs why. A 401, 403 or 404 reply raises :class:`OptimizerError` at once, naming the model and
    the client's base URL: a wrong key, model or URL fails every call. Once ``max_tokens`` tokens are spent, the
    next call raises :class:`SearchBudgetExhausted`.

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
        self,
        *,
        model: str,
        messages: List[Dict[str, Any]],
        temperature: Optional[float],
        purpose: str,
        option: Optional[str] = None,
    ) -> Optional[str]:
        """One chat completion; its text, or None when the call gave none (counted as failed, see above).

        Args:
            model: Model name sent to the server.
            messages: Chat messages.
            temperature: Sampling temperature (None: the server's default).
            purpose: What the call is for, in log messages (``"critique"``, ``"edit"``...).
            option: The optimizer's option that named ``model`` (``"gradient_model"``...), in error messages.

        Raises:
            SearchBudgetExhausted: The budget was spent before this call.
            OptimizerError: The server refused the call with status 401, 403 or 404.
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
                status = _status_code(exc)
                if status in CONFIGURATION_ERRORS:
                    self.usage.failed_calls += 1
                    named = f"model {model!r}" + (f" ({option})" if option else "")
                    raise OptimizerError(
                        f"The optimizer server at {self.base_url} refused the {purpose} call for {named} with "
                        f"HTTP {status} ({exc}): check the model name, the base URL and the API key."
                    ) from exc
                reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                final = status is not None and 400 <= status < 500 and status not in RETRIED_CLIENT_ERRORS
                if final or attempt == self.retries:
                    self.usage.failed_calls += 1
                    how = f"with HTTP {status}, which a retry cannot mend" if final else f"after {attempt + 1} attempts"
                    logger.warning("Optimizer %s call failed %s (%s); skipping it.", purpose, how, reason)
                    return None
                logger.info("Optimizer %s call failed (%s); retrying in %.1f s.", purpose, reason, delay)
                await asyncio.sleep(delay * (1.0 + 0.25 * random.random()))
                delay *= 2.0
                continue
            self._count_tokens(response, messages, text)
            if text is None:
                self.usage.failed_calls += 1
                finish = getattr(response.choices[0], "finish_reason", None)
                logger.warning(
                    "Optimizer %s call returned no content (finish_reason %s); skipping it.", purpose, finish
                )
                return None
            self.usage.calls += 1
            return text
        return None  # unreachable: the loop returns on the last attempt

    @property
    def base_url(self) -> str:
        """Where the client sends its calls (for error messages)."""
        return str(getattr(self.client, "base_url", None) or "(the client's default URL)")

    def _count_tokens(self, response: Any, messages: List[Dict[str, Any]], text: Optional[str]) -> None:
        usage = getattr(response, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        completion = getattr(usage, "completion_tokens", None) if usage is not None else None
        if prompt is None:
            prompt = sum(_estimated_tokens(str(m.get("content") or "")) for m in messages)
        if completion is None:
            completion = _estimated_tokens(text or "")
        self.usage.prompt_tokens += int(prompt)
        self.usage.completion_tokens += int(completion)
