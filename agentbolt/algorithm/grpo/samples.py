"""Turn the triplets of finished rollouts into token-level training samples.

Every LLM call of a trained agent becomes one :class:`TokenSample` holding the exact token ids that were sent to and
returned by the engine, so a multi-turn rollout yields several samples, each scored in its own context. Credit
assignment decides which scalar reward each sample is trained on.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Sequence

from agentbolt.adapter.agent_match import select_calls
from agentbolt.adapter.triplet import parse_logprobs, triplet_token_ids
from agentbolt.types import Triplet
from agentbolt.utils.counters import Counters

__all__ = [
    "SampleStats",
    "TokenSample",
    "assign_credit",
    "distribution_changing",
    "parse_logprobs",
    "sampling_temperature",
    "triplets_to_samples",
]

logger = logging.getLogger(__name__)


@dataclass
class TokenSample:
    """One LLM call to train on.

    Attributes:
        prompt_ids: Token ids of the prompt exactly as the engine saw it (chat template applied).
        response_ids: Token ids the engine sampled.
        logprobs: The engine's log-probability of each response token, as engines report them (untempered
            ``log_softmax(logits)``), or None when the engine did not return them. The trainer computes the PPO
            ratio's log-probs itself; these only measure how closely the engine and the trainer agree
            (``logprob_engine_diff_*`` metrics).
        reward: Scalar reward this sample is trained on (after credit assignment).
        group_id: Samples with the same group id come from rollouts of the same task; advantages are relative to it.
        rollout_id: Rollout the call belongs to.
        agent_name: Agent that made the call, when the trace names it.
        advantage: Filled in by :func:`agentbolt.algorithm.grpo.advantages.assign_advantages`.
        metadata: Free-form extra information.
        temperature: Sampling temperature the response was drawn at (the request's ``temperature``; 1.0, the
            OpenAI default, when the request did not set one). The trainer scores the response under
            ``softmax(logits / temperature)``, the distribution it was sampled from; a greedy call (0) is scored
            at 1.0.
    """

    prompt_ids: List[int]
    response_ids: List[int]
    logprobs: Optional[List[float]]
    reward: float
    group_id: str
    rollout_id: str
    agent_name: Optional[str] = None
    advantage: float = 0.0
    metadata: Dict[str, Any] = field(default_factory=dict)
    temperature: float = 1.0

    @property
    def token_ids(self) -> List[int]:
        """The prompt then the response: the sequence the trainer runs."""
        return self.prompt_ids + self.response_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus response length."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def scoring_temperature(self) -> float:
        """The temperature the trainer divides the logits by: :attr:`temperature`, or 1.0 for a greedy call."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class SampleStats(Counters):
    """Counters of what :func:`triplets_to_samples` skipped."""

    calls: int = 0
    """LLM calls seen in the triplets."""
    other_agents: int = 0
    """Calls skipped because their agent does not match ``agent_match`` (calls without an agent name included)."""
    missing_tokens: int = 0
    """Calls skipped because the trace has no prompt or response token ids."""
    too_long: int = 0
    """Calls skipped because prompt + response exceed ``max_sequence_length``."""
    out_of_vocabulary: int = 0
    """Calls skipped because a token id is not in the trained model's vocabulary (recorded by another model)."""
    missing_logprobs: int = 0
    """Kept calls whose behaviour log-probs are missing or malformed (recomputed by the trainer)."""
    off_distribution: int = 0
    """Kept calls whose request changed the sampled distribution (guided decoding, ``top_p`` < 1...: see
    :func:`distribution_changing`): their tokens were not drawn from the policy the trainer scores them under."""


def distribution_changing(triplet: Triplet) -> List[str]:
    """The parameters the call's recorded request set to sample from another distribution than the policy's
    (``gen_ai.request.distribution_changing``, :mod:`agentbolt.openai_api.sampling`); empty for a plain call."""
    request = triplet.metadata.get("request")
    names = request.get("distribution_changing") if isinstance(request, dict) else None
    return [name for name in names if isinstance(name, str)] if isinstance(names, (list, tuple)) else []


def sampling_temperature(triplet: Triplet) -> float:
    """The temperature a call's response was sampled at, from the request the adapter recorded.

    A request without a usable ``temperature`` was sampled at the OpenAI default, 1.0.
    """
    request = triplet.metadata.get("request")
    value = request.get("temperature") if isinstance(request, dict) else None
    if isinstance(value, str):  # attributes flattened to strings by some tracers
        try:
            value = float(value)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return 1.0
    return float(value)


def assign_credit(
    triplets: Sequence[Triplet], final_reward: float, credit: Literal["final", "per_call"]
) -> List[float]:
    """Reward of each call of one rollout.

    Args:
        triplets: The rollout's calls in order.
        final_reward: The rollout's final reward.
        credit: ``"final"`` gives every call ``final_reward``; ``"per_call"`` gives a call the reward matched to it in
            the trace and falls back to ``final_reward`` for calls without one (or with a reward that is not a finite
            number).
    """
    if credit == "final":
        return [final_reward] * len(triplets)
    return [final_reward if t.reward is None or not math.isfinite(t.reward) else float(t.reward) for t in triplets]


def triplets_to_samples(
    triplets: Sequence[Triplet],
    *,
    rollout_id: str,
    group_id: str,
    final_reward: float,
    credit: Literal["final", "per_call"] = "final",
    agent_match: Optional[str] = None,
    max_sequence_length: Optional[int] = None,
    vocab_size: Optional[int] = None,
) -> tuple[List[TokenSample], SampleStats]:
    """Samples of one finished rollout.

    Args:
        triplets: The adapter's output for the rollout, in call order.
        rollout_id: Rollout id, recorded on each sample.
        group_id: Id shared by all rollouts of the same task.
        final_reward: The rollout's final reward.
        credit: Credit rule, see :func:`assign_credit`.
        agent_match: Regex searched in agent names (:mod:`agentbolt.adapter.agent_match`); calls of other agents
            are skipped. A call without an agent name is kept only when ``agent_match`` is None.
        max_sequence_length: Calls longer than this (prompt + response) are skipped.
        vocab_size: Rows of the trained model's embedding: a call holding a token id at or above it is skipped (its
            ids come from another tokenizer, and the model would fail to embed them). None: not checked.

    Returns:
        The samples and counters of skipped calls.

    Raises:
        ValueError: ``agent_match`` is not a valid regular expression.
    """
    stats = SampleStats(calls=len(triplets))
    selection = select_calls(triplets, agent_match, rollout_id)
    rewards = assign_credit(triplets, final_reward, credit)
    samples: List[TokenSample] = []
    for triplet, reward, (agent, selected) in zip(triplets, rewards, selection, strict=True):
        if not selected:
            stats.other_agents += 1
            continue
        prompt_ids, response_ids = triplet_token_ids(triplet.prompt), triplet_token_ids(triplet.response)
        if not prompt_ids or not response_ids:
            stats.missing_tokens += 1
            continue
        if max_sequence_length is not None and len(prompt_ids) + len(response_ids) > max_sequence_length:
            stats.too_long += 1
            continue
        if vocab_size is not None and max(*prompt_ids, *response_ids) >= vocab_size:
            stats.out_of_vocabulary += 1
            continue
        raw_logprobs = triplet.response.get("logprobs") if isinstance(triplet.response, dict) else None
        logprobs = parse_logprobs(raw_logprobs, len(response_ids))
        if logprobs is None:
            stats.missing_logprobs += 1
        if distribution_changing(triplet):
            stats.off_distribution += 1
        samples.append(
            TokenSample(
                prompt_ids=prompt_ids,
                response_ids=response_ids,
                logprobs=logprobs,
                reward=reward,
                group_id=group_id,
                rollout_id=rollout_id,
                agent_name=agent,
                temperature=sampling_temperature(triplet),
            )
        )
    if stats.missing_tokens:
        logger.warning(
            "Rollout %s: %d LLM call(s) without token ids were skipped; serve the model through an engine that "
            "returns prompt and response token ids.",
            rollout_id,
            stats.missing_tokens,
        )
    return samples, stats
