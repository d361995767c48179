"""Which samples a training step learns from.

:func:`select_samples` applies, in this order:

1. samples without a reward are dropped (``no_reward``) unless selection does not need rewards (no threshold, no
   best-of-n, no ranking); a reward that is not a finite number (NaN, an infinity) is no reward;
2. samples whose reward is below ``min_reward`` are dropped;
3. with ``best_of_n``, each task keeps only the samples of its best rollout (highest final reward; ties go to a
   rollout drawn with the step's random generator);
4. duplicates (same tokens, same targets) are dropped, keeping the copy with the highest reward (the first of
   equals): the rollouts of one task often make the same call, and the rules above judge each copy by its own
   rollout, so a call is dropped only when one of its copies is kept;
5. the rest are ranked by reward, ties in a random order, and the first ``top_k`` or ``ceil(top_fraction * n)``
   (at least one) are kept.

Every drop is counted once, under the rule that made it, in :class:`SelectionStats`, so an empty selection says
why it is empty.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, List, Optional, Sequence, Tuple

from agentbolt.algorithm.sft.data import Counters, TokenSample, finite_reward

__all__ = ["SelectionStats", "select_samples"]


@dataclass
class SelectionStats(Counters):
    """Counters of one selection."""

    candidates: int = 0
    """Samples offered."""
    no_reward: int = 0
    """Dropped: no reward to select by."""
    duplicates: int = 0
    """Dropped: same tokens and targets as a kept sample whose reward is at least as high."""
    below_min_reward: int = 0
    """Dropped: reward below ``min_reward``."""
    not_best_of_task: int = 0
    """Dropped: another rollout of the same task scored higher (``best_of_n``)."""
    below_rank: int = 0
    """Dropped: outside ``top_k`` / ``top_fraction``."""
    selected: int = 0
    """Kept."""


def _rank(sample: TokenSample) -> float:
    """The sample's reward as a number to compare; ``-inf`` when it has none (or a non-finite one)."""
    reward = finite_reward(sample.reward)
    return -math.inf if reward is None else reward


def _without_duplicates(samples: Sequence[TokenSample]) -> List[TokenSample]:
    """One sample of each set of duplicates, the one with the highest reward (the first of equals), in order."""
    kept: Dict[str, int] = {}
    for index, sample in enumerate(samples):
        key = sample.dedup_key()
        if key not in kept or _rank(sample) > _rank(samples[kept[key]]):
            kept[key] = index
    return [samples[i] for i in sorted(kept.values())]


def _best_rollouts(samples: Sequence[TokenSample], rng: random.Random) -> set[Tuple[str, Optional[str]]]:
    """``(task, rollout_id)`` of the best rollout of each task."""
    scores: Dict[Tuple[str, Optional[str]], float] = {}
    for sample in samples:
        final = finite_reward(sample.final_reward)
        key = (sample.task, sample.rollout_id)
        scores[key] = max(scores.get(key, -math.inf), _rank(sample) if final is None else final)
    keys = sorted(scores, key=lambda k: (k[0], k[1] or ""))
    rng.shuffle(keys)
    best: Dict[str, Tuple[str, Optional[str]]] = {}
    for key in keys:
        current = best.get(key[0])
        if current is None or scores[key] > scores[current]:
            best[key[0]] = key
    return set(best.values())


def select_samples(
    samples: Sequence[TokenSample],
    *,
    min_reward: Optional[float] = None,
    best_of_n: bool = False,
    top_k: Optional[int] = None,
    top_fraction: Optional[float] = None,
    dedup: bool = True,
    rng: Optional[random.Random] = None,
) -> Tuple[List[TokenSample], SelectionStats]:
    """The samples to train on, and what was dropped at each rule (see the module docstring for the order).

    Args:
        samples: Candidates (each with its reward, final reward, task and rollout).
        min_reward: Reward threshold (inclusive); None: none.
        best_of_n: Keep only each task's best rollout.
        top_k: Keep the ``top_k`` highest rewards.
        top_fraction: Keep the best ``ceil(top_fraction * n)`` (at least one).
        dedup: Drop repeated samples (keeping the best-rewarded copy).
        rng: Generator breaking ties (default: a fixed seed).

    Raises:
        ValueError: Both ``top_k`` and ``top_fraction`` given, or an out-of-range value.
    """
    if top_k is not None and top_fraction is not None:
        raise ValueError("give top_k or top_fraction, not both")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_fraction is not None and not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must lie in (0, 1], got {top_fraction}")
    rng = rng or random.Random(0)
    stats = SelectionStats(candidates=len(samples))
    needs_reward = min_reward is not None or best_of_n or top_k is not None or top_fraction is not None
    kept = list(samples)
    if needs_reward:
        kept = [s for s in kept if finite_reward(s.reward) is not None]
        stats.no_reward = len(samples) - len(kept)
    if min_reward is not None:
        above = [s for s in kept if _rank(s) >= min_reward]
        stats.below_min_reward = len(kept) - len(above)
        kept = above
    if best_of_n:
        best = _best_rollouts(kept, rng)
        chosen = [s for s in kept if (s.task, s.rollout_id) in best]
        stats.not_best_of_task = len(kept) - len(chosen)
        kept = chosen
    if dedup:
        unique = _without_duplicates(kept)
        stats.duplicates = len(kept) - len(unique)
        kept = unique
    if kept and (top_k is not None or top_fraction is not None):
        order = list(range(len(kept)))
        rng.shuffle(order)
        order.sort(key=lambda i: -_rank(kept[i]))  # stable: ties stay in the shuffled order
        # The fraction as written (0.07, not the float just above it), so that 7% of 100 samples is 7, not 8.
        fraction = Fraction(str(float(top_fraction))) if top_fraction is not None else None
        limit = top_k if top_k is not None else max(1, math.ceil(fraction * len(kept)))  # type: ignore[operator]
        chosen_indices = sorted(order[:limit])
        stats.below_rank = len(kept) - len(chosen_indices)
        kept = [kept[i] for i in chosen_indices]
    stats.selected = len(kept)
    return kept, stats
