"""Engine-level request parameters and outputs (plain dataclasses, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional, Tuple, Union

from agentbolt.openai_api.schema import MAX_CHOICES, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS, SEED_MAX, SEED_MIN

__all__ = [
    "EngineError",
    "EngineOverloadedError",
    "ContextOverflowError",
    "AdapterNotLoadedError",
    "GenerationFailedError",
    "SamplingParams",
    "SequenceDelta",
    "SequenceOutput",
    "GenerationOutput",
]

FinishReason = Literal["stop", "length", "abort"]


class EngineError(ValueError):
    """A generation request is invalid (served as HTTP 400)."""


class ContextOverflowError(EngineError):
    """Prompt plus requested tokens do not fit in the model's context (served as HTTP 400)."""


class AdapterNotLoadedError(EngineError):
    """The request names a LoRA adapter that is not loaded, or was unloaded before it started (HTTP 404)."""


class EngineOverloadedError(EngineError):
    """The engine already holds as much queued work as it accepts; retry later (served as HTTP 429)."""


class GenerationFailedError(RuntimeError):
    """Generating this request failed inside the engine (served as HTTP 500); other requests were not affected."""


@dataclass
class SamplingParams:
    """How to sample one request.

    Attributes:
        max_tokens: Maximum generated tokens per choice; ``None`` means up to the end of the context.
        temperature: Softmax temperature; ``0`` means greedy decoding.
        top_p: Nucleus sampling mass (``1`` disables it).
        n: Number of choices sampled for the prompt.
        stop: Stop strings; the returned text is cut before the first match (the token ids keep the token that
            completed it).
        stop_token_ids: Extra token ids that end a choice (the model's EOS ids always do unless ``ignore_eos``).
        seed: Seed of the sampler; choice ``i`` uses ``seed + i``. Results are reproducible for the same batch
            composition (padding changes floating point rounding, most visibly in bf16).
        logprobs: Return the log-probability of every sampled token.
        top_logprobs: Also return this many most likely alternatives per position (0-20).
        ignore_eos: Keep generating after EOS (until ``max_tokens``).
        guided_regex: Keep every choice's text a prefix of a match of this regular expression, and end it only once
            it matches in full (vLLM's guided decoding; see :mod:`agentbolt.serving.guided`).
    """

    max_tokens: Optional[int] = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: List[str] = field(default_factory=list)
    stop_token_ids: List[int] = field(default_factory=list)
    seed: Optional[int] = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    guided_regex: Optional[str] = None

    def validate(self) -> None:
        """Check types and ranges, so that nothing about these parameters can fail inside a batch step.

        Raises:
            EngineError: With a message naming the offending parameter.
        """
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise EngineError(f"max_tokens must be an integer of at least 1, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            raise EngineError(f"temperature must be between 0 and 100, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.n) or not 1 <= self.n <= MAX_CHOICES:
            raise EngineError(f"n must be between 1 and {MAX_CHOICES}, got {self.n!r}")
        if not _is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise EngineError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.top_logprobs!r}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX - (self.n - 1)):
            raise EngineError(
                f"seed must be an integer with seed and seed + n - 1 (choice i samples with seed + i) between "
                f"{SEED_MIN} and {SEED_MAX}, got seed={self.seed!r} with n={self.n}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise EngineError("stop must be a non-empty string or a list of non-empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise EngineError(f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(self.stop)}")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise EngineError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        # The engine compiles guided_regex (agentbolt.serving.guided.RegexGuide refuses what is not a pattern).
        if self.guided_regex is not None and self.ignore_eos:
            raise EngineError("guided_regex cannot be combined with ignore_eos: a guided choice ends at its match")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SequenceDelta:
    """What one choice produced in one decoding step (the unit of streaming).

    Attributes:
        index: Choice index within the request.
        token_ids: New token ids (one per step).
        text: Newly released text (may be empty while a stop string or a multi-byte character is pending).
        logprobs: Log-probabilities of ``token_ids`` (when requested).
        top_logprobs: Per new token, the most likely ``(token_id, logprob)`` pairs (when requested).
        finish_reason: Set on the last delta of the choice.
        stop_reason: On the last delta, what stopped a ``stop`` choice other than an EOS token: the stop string
            matched, or the token of ``stop_token_ids`` (vLLM's ``stop_reason``); None otherwise.
    """

    index: int
    token_ids: List[int]
    text: str
    logprobs: Optional[List[float]] = None
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None
    finish_reason: Optional[FinishReason] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class SequenceOutput:
    """A finished choice.

    Attributes:
        index: Choice index.
        token_ids: All generated token ids, including a final EOS / stop token.
        text: Generated text without special tokens, cut before a matched stop string.
        logprobs: Log-probabilities of ``token_ids`` under the untempered model distribution (when requested).
        top_logprobs: Per position, the most likely ``(token_id, logprob)`` pairs (when requested).
        finish_reason: ``stop`` (EOS, stop token or stop string), ``length`` or ``abort``.
        stop_reason: The stop string or stop token that ended a ``stop`` choice, None for an EOS token (see
            :class:`SequenceDelta`).
    """

    index: int
    token_ids: List[int] = field(default_factory=list)
    text: str = ""
    logprobs: Optional[List[float]] = None
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None
    finish_reason: Optional[FinishReason] = None
    stop_reason: Union[int, str, None] = None

    def add(self, delta: SequenceDelta) -> None:
        """Append a streaming delta to this output."""
        self.token_ids.extend(delta.token_ids)
        self.text += delta.text
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        if delta.top_logprobs is not None:
            self.top_logprobs = (self.top_logprobs or []) + delta.top_logprobs
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason


@dataclass
class GenerationOutput:
    """The result of one request.

    Attributes:
        prompt_token_ids: Token ids the model was conditioned on.
        choices: One output per sampled choice, ordered by index.
        weight_version: Engine weight version when the request was submitted (see ``TransformersEngine``).
    """

    prompt_token_ids: List[int]
    choices: List[SequenceOutput]
    weight_version: int = 0
