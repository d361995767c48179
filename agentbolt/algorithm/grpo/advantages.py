"""Group-relative advantages.

For the members of one group (the rollouts of one task) with rewards ``r_i`` and weights ``w_i``:

* ``std`` mode: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the weighted population standard deviation;
* ``mean`` mode (Dr. GRPO): ``A_i = r_i - mean(r)``.

**Each rollout weighs one in its group's mean and std**, however many calls it made: the calls of a rollout share
its weight (``1 / calls`` each). With ``final`` credit every call carries its rollout's reward, so the statistics are
exactly those of one reward per rollout; with ``per_call`` credit a rollout contributes the mean of its calls'
rewards. Rollouts that produced no sample (they failed before any LLM call, or all their calls were filtered out)
still count, with weight one, when they are passed as ``rollouts``.

A group whose rewards are all equal carries no learning signal (every advantage is 0); it is skipped and counted
instead of being trained on, so it neither costs compute nor dilutes the token mean of the loss. "Equal" is relative
to the rewards' size, so that the rule holds at any reward scale: a group is all-equal when every reward is 0 or when
``std(r) <= ZERO_VARIANCE_RTOL * max|r|`` (rewards 1e-9 and 3e-9 differ; 0.1 + 0.2 and 0.3 are equal).
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, Sequence

from agentbolt.algorithm.grpo.samples import TokenSample

__all__ = ["AdvantageStats", "RolloutScore", "assign_advantages", "group_advantages"]

ZERO_VARIANCE_RTOL = 1e-9
"""Groups whose reward standard deviation is at most this times their largest absolute reward are all-equal."""


@dataclass(frozen=True)
class RolloutScore:
    """One rollout's place in the group statistics: its group and the final reward it is scored with."""

    rollout_id: str
    group_id: str
    reward: float


@dataclass
class AdvantageStats:
    """What :func:`assign_advantages` kept and skipped."""

    groups: int = 0
    zero_variance_groups: int = 0
    kept_samples: int = 0
    skipped_samples: int = 0


def group_advantages(
    values: Sequence[float],
    group_ids: Sequence[str],
    *,
    weights: Optional[Sequence[float]] = None,
    mode: Literal["std", "mean"] = "std",
    eps: float = 1e-6,
) -> tuple[List[Optional[float]], int, int]:
    """Normalise ``values`` within the groups given by ``group_ids``.

    Args:
        values: One reward per member.
        group_ids: The group of each member.
        weights: Weight of each member in its group's mean and std (None: all 1).
        mode: ``"std"`` or ``"mean"``, see the module docstring.
        eps: Added to the std in ``"std"`` mode.

    Returns:
        ``(advantages, n_groups, n_zero_variance_groups)``; members of zero-variance groups get None.

    Raises:
        ValueError: The sequences differ in length, a weight is not positive, or a value is not a finite number
            (callers count such rewards as no reward, see :func:`agentbolt.utils.reward_spans.training_reward`).
    """
    weights = [1.0] * len(values) if weights is None else [float(w) for w in weights]
    if not len(values) == len(group_ids) == len(weights):
        raise ValueError(f"got {len(values)} values, {len(group_ids)} group ids and {len(weights)} weights")
    if any(not w > 0 for w in weights):
        raise ValueError(f"weights must be positive, got {min(weights)}")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"values must be finite numbers, got {value!r} for member {index}")
    members: Dict[str, List[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    advantages: List[Optional[float]] = [None] * len(values)
    zero_variance = 0
    for indices in members.values():
        # Computed on the rewards divided by the largest of them, so that neither a deviation from the mean nor its
        # square can overflow (or underflow) whatever the rewards' size.
        magnitude = max(abs(float(values[i])) for i in indices)
        if magnitude == 0:
            zero_variance += 1
            continue
        total = sum(weights[i] for i in indices)
        scaled = {i: float(values[i]) / magnitude for i in indices}
        mean = sum(weights[i] / total * scaled[i] for i in indices)
        std = math.sqrt(sum(weights[i] / total * (scaled[i] - mean) ** 2 for i in indices))
        if std <= ZERO_VARIANCE_RTOL:  # the scaled std is std(r) / max|r|
            zero_variance += 1
            continue
        for i in indices:
            deviation = scaled[i] - mean
            advantages[i] = deviation / (std + eps / magnitude) if mode == "std" else deviation * magnitude
    return advantages, len(members), zero_variance


def assign_advantages(
    samples: Sequence[TokenSample],
    *,
    rollouts: Optional[Sequence[RolloutScore]] = None,
    mode: Literal["std", "mean"] = "std",
    eps: float = 1e-6,
) -> tuple[List[TokenSample], AdvantageStats]:
    """Set ``sample.advantage`` and return the samples to train on (zero-variance groups removed).

    Args:
        samples: The step's samples, each carrying the reward its credit rule gave it.
        rollouts: Every rollout of the step that counts in the group statistics, including those without a sample.
            A rollout with samples is represented by them (its ``reward`` here is not used). None: the rollouts of
            ``samples``.
        mode: ``"std"`` or ``"mean"``.
        eps: Added to the group std in ``"std"`` mode.

    Raises:
        ValueError: ``rollouts`` misses a sample's rollout or puts it in another group.
    """
    calls = Counter(s.rollout_id for s in samples)
    values = [s.reward for s in samples]
    groups = [s.group_id for s in samples]
    weights = [1.0 / calls[s.rollout_id] for s in samples]
    if rollouts is not None:
        listed = {r.rollout_id: r.group_id for r in rollouts}
        for sample in samples:
            if listed.get(sample.rollout_id) != sample.group_id:
                raise ValueError(
                    f"sample of rollout {sample.rollout_id} (group {sample.group_id}) has no matching entry in "
                    f"rollouts (group {listed.get(sample.rollout_id)})"
                )
        for rollout in rollouts:
            if rollout.rollout_id not in calls:
                values.append(rollout.reward)
                groups.append(rollout.group_id)
                weights.append(1.0)
    advantages, n_groups, n_zero = group_advantages(values, groups, weights=weights, mode=mode, eps=eps)
    kept: List[TokenSample] = []
    for sample, advantage in zip(samples, advantages[: len(samples)], strict=True):  # then: rollouts without samples
        if advantage is not None:
            sample.advantage = advantage
            kept.append(sample)
    stats = AdvantageStats(
        groups=n_groups,
        zero_variance_groups=n_zero,
        kept_samples=len(kept),
        skipped_samples=len(samples) - len(kept),
    )
    return kept, stats
