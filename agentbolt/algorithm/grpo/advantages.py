"""Group-relative advantages.

For the ``n`` members of one group (the rollouts of one task) with rewards ``r_1..r_n``:

* ``std`` mode: ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the population standard deviation;
* ``mean`` mode (Dr. GRPO): ``A_i = r_i - mean(r)``.

A group whose rewards are all equal carries no learning signal (every advantage is 0); it is skipped and counted
instead of being trained on, so it neither costs compute nor dilutes the token mean of the loss.

With the ``final`` credit rule a group's members are its rollouts (each counted once however many calls it made)
and every call inherits its rollout's advantage. With ``per_call`` credit the members are the calls themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, Sequence

from agentbolt.algorithm.grpo.samples import TokenSample

__all__ = ["AdvantageStats", "assign_advantages", "group_advantages"]

ZERO_VARIANCE_TOL = 1e-8
"""Groups whose reward standard deviation is at most this are treated as all-equal."""


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
    mode: Literal["std", "mean"] = "std",
    eps: float = 1e-6,
) -> tuple[List[Optional[float]], int, int]:
    """Normalise ``values`` within the groups given by ``group_ids``.

    Returns:
        ``(advantages, n_groups, n_zero_variance_groups)``; members of zero-variance groups get None.
    """
    if len(values) != len(group_ids):
        raise ValueError(f"got {len(values)} values but {len(group_ids)} group ids")
    members: Dict[str, List[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    advantages: List[Optional[float]] = [None] * len(values)
    zero_variance = 0
    for indices in members.values():
        group_values = [float(values[i]) for i in indices]
        mean = sum(group_values) / len(group_values)
        std = math.sqrt(sum((v - mean) ** 2 for v in group_values) / len(group_values))
        if std <= ZERO_VARIANCE_TOL:
            zero_variance += 1
            continue
        scale = std + eps if mode == "std" else 1.0
        for i, value in zip(indices, group_values, strict=True):
            advantages[i] = (value - mean) / scale
    return advantages, len(members), zero_variance


def assign_advantages(
    samples: Sequence[TokenSample],
    *,
    credit: Literal["final", "per_call"] = "final",
    mode: Literal["std", "mean"] = "std",
    eps: float = 1e-6,
) -> tuple[List[TokenSample], AdvantageStats]:
    """Set ``sample.advantage`` and return the samples to train on (zero-variance groups removed)."""
    if credit == "final":
        # One member per rollout: its reward is the one every call of the rollout carries.
        rollout_reward: Dict[str, float] = {}
        rollout_group: Dict[str, str] = {}
        for sample in samples:
            rollout_reward.setdefault(sample.rollout_id, sample.reward)
            rollout_group.setdefault(sample.rollout_id, sample.group_id)
        rollouts = list(rollout_reward)
        values, n_groups, n_zero = group_advantages(
            [rollout_reward[r] for r in rollouts], [rollout_group[r] for r in rollouts], mode=mode, eps=eps
        )
        by_rollout = dict(zip(rollouts, values, strict=True))
        per_sample = [by_rollout[s.rollout_id] for s in samples]
    else:
        per_sample, n_groups, n_zero = group_advantages(
            [s.reward for s in samples], [s.group_id for s in samples], mode=mode, eps=eps
        )
    kept: List[TokenSample] = []
    for sample, advantage in zip(samples, per_sample, strict=True):
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
