"""Selection rules: reward threshold, best-of-n per task, top-k / top share, de-duplication, and their counters."""

from __future__ import annotations

import random
from typing import Optional

import pytest

from agentbolt.algorithm.sft.data import TokenSample
from agentbolt.algorithm.sft.selection import select_samples


def _sample(
    reward: Optional[float], *, task: str = "t", rollout: str = "r", token: int = 0, final: Optional[float] = None
) -> TokenSample:
    return TokenSample(
        input_ids=[1, 2, 3 + token],
        loss_mask=[False, True, True],
        reward=reward,
        final_reward=reward if final is None else final,
        task=task,
        rollout_id=rollout,
    )


def _rewards(samples) -> list:
    return [s.reward for s in samples]


def test_threshold_keeps_rewards_at_or_above_it() -> None:
    samples = [_sample(r, rollout=f"r{i}", token=i) for i, r in enumerate([0.0, 0.5, 1.0, 0.99])]
    kept, stats = select_samples(samples, min_reward=0.99)
    assert _rewards(kept) == [1.0, 0.99]
    assert (stats.candidates, stats.below_min_reward, stats.selected) == (4, 2, 2)


def test_best_of_n_keeps_every_call_of_each_tasks_best_rollout() -> None:
    samples = [
        _sample(0.2, task="a", rollout="a1", token=0),
        _sample(1.0, task="a", rollout="a2", token=1),  # a2 has two calls: both kept
        _sample(1.0, task="a", rollout="a2", token=2),
        _sample(0.0, task="b", rollout="b1", token=3),
        _sample(0.7, task="b", rollout="b2", token=4),
    ]
    kept, stats = select_samples(samples, best_of_n=True)
    assert [(s.task, s.rollout_id) for s in kept] == [("a", "a2"), ("a", "a2"), ("b", "b2")]
    assert stats.not_best_of_task == 2


def test_best_of_n_compares_rollouts_by_final_reward_and_breaks_ties_with_the_generator() -> None:
    # The propagated call rewards differ from the rollouts' final rewards: the final reward decides.
    samples = [
        _sample(0.1, task="a", rollout="a1", final=1.0, token=0),
        _sample(0.9, task="a", rollout="a2", final=0.5),
    ]
    kept, _ = select_samples(samples, best_of_n=True)
    assert [s.rollout_id for s in kept] == ["a1"]
    tied = [_sample(1.0, task="a", rollout=f"a{i}", token=i) for i in range(6)]
    winners = {select_samples(tied, best_of_n=True, rng=random.Random(seed))[0][0].rollout_id for seed in range(20)}
    assert len(winners) > 1  # ties are not always won by the first rollout
    first = select_samples(tied, best_of_n=True, rng=random.Random(3))[0]
    assert first == select_samples(tied, best_of_n=True, rng=random.Random(3))[0]  # but deterministically per seed


def test_top_k_and_top_fraction_keep_the_highest_rewards() -> None:
    samples = [_sample(r, rollout=f"r{i}", token=i) for i, r in enumerate([0.3, 0.9, 0.1, 0.6, 0.8])]
    kept, stats = select_samples(samples, top_k=2)
    assert sorted(_rewards(kept)) == [0.8, 0.9] and stats.below_rank == 3
    kept, _ = select_samples(samples, top_fraction=0.5)  # ceil(2.5) = 3
    assert sorted(_rewards(kept)) == [0.6, 0.8, 0.9]
    kept, _ = select_samples(samples[:1], top_fraction=0.1)  # at least one
    assert len(kept) == 1


@pytest.mark.parametrize("fraction, expected", [(0.07, 7), (0.14, 14), (0.29, 29), (0.575, 58)])
def test_top_fraction_keeps_the_fraction_as_written(fraction: float, expected: int) -> None:
    # 0.07 * 100 is 7.000000000000001 in floating point, which must not round up to 8.
    samples = [_sample(i / 100, rollout=f"r{i}", token=i) for i in range(100)]
    kept, stats = select_samples(samples, top_fraction=fraction)
    assert len(kept) == expected and stats.below_rank == 100 - expected


def test_duplicates_are_dropped_before_ranking() -> None:
    same = [_sample(1.0, rollout=f"r{i}") for i in range(3)]  # identical tokens and targets
    other = _sample(0.5, rollout="r9", token=7)
    kept, stats = select_samples([*same, other], top_k=2)
    assert _rewards(kept) == [1.0, 0.5] and stats.duplicates == 2
    kept, stats = select_samples([*same, other], top_k=2, dedup=False)
    assert _rewards(kept) == [1.0, 1.0] and stats.duplicates == 0


def test_samples_without_reward_are_dropped_only_when_a_rule_needs_rewards() -> None:
    samples = [_sample(None, token=0), _sample(1.0, rollout="r2", token=1)]
    kept, stats = select_samples(samples, min_reward=0.0)
    assert _rewards(kept) == [1.0] and stats.no_reward == 1
    kept, stats = select_samples(samples)  # no rule: distillation data without rewards is all kept
    assert len(kept) == 2 and stats.no_reward == 0


def test_an_empty_selection_says_why() -> None:
    kept, stats = select_samples([_sample(0.0, token=i, rollout=f"r{i}") for i in range(3)], min_reward=1.0)
    assert kept == [] and stats.as_metrics("select/")["select/below_min_reward"] == 3.0 and stats.selected == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 2, "top_fraction": 0.5}, "not both"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"top_fraction": 1.5}, "top_fraction must lie in"),
    ],
)
def test_bad_selection_options_are_refused(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        select_samples([_sample(1.0)], **options)


@pytest.mark.parametrize("rule", [{"min_reward": 1.0}, {"best_of_n": True}])
def test_a_call_made_by_a_failed_and_a_successful_rollout_is_learned_from_the_successful_one(rule) -> None:
    failed = _sample(0.0, task="a", rollout="a1")
    succeeded = _sample(1.0, task="a", rollout="a2")  # the same call: same tokens and targets
    for order in ([failed, succeeded], [succeeded, failed]):
        kept, stats = select_samples(order, **rule)
        assert [s.rollout_id for s in kept] == ["a2"] and stats.selected == 1
        dropped = stats.duplicates + stats.below_min_reward + stats.not_best_of_task
        assert dropped == 1 and stats.candidates == dropped + stats.selected


def test_of_duplicates_the_copy_with_the_highest_reward_is_kept_and_ranked() -> None:
    low, high = _sample(0.2, rollout="r1"), _sample(0.9, rollout="r2")  # the same call, rewarded differently
    other = _sample(0.5, rollout="r3", token=7)
    kept, stats = select_samples([low, other, high], top_k=1)
    assert [s.rollout_id for s in kept] == ["r2"]
    assert (stats.duplicates, stats.below_rank, stats.selected) == (1, 1, 1)
    kept, stats = select_samples([_sample(None, rollout="r1"), _sample(None, rollout="r2")])  # no rewards: the first
    assert [s.rollout_id for s in kept] == ["r1"] and stats.duplicates == 1


def test_a_reward_that_is_not_a_finite_number_is_no_reward() -> None:
    rewards = [0.1, float("nan"), 0.9, 0.5, float("inf")]
    samples = [_sample(r, rollout=f"r{i}", token=i) for i, r in enumerate(rewards)]
    kept, stats = select_samples(samples, top_k=2)
    assert _rewards(kept) == [0.9, 0.5] and stats.no_reward == 2
    kept, stats = select_samples(samples, min_reward=0.0)
    assert _rewards(kept) == [0.1, 0.9, 0.5] and stats.no_reward == 2
    # best-of-n: a rollout whose final reward is NaN is ranked by its calls' rewards, never as a number
    runs = [_sample(0.2, task="a", rollout="a1", final=float("nan")), _sample(0.4, task="a", rollout="a2", token=1)]
    kept, _ = select_samples(runs, best_of_n=True)
    assert [s.rollout_id for s in kept] == ["a2"]


def test_top_k_replaces_the_default_top_fraction_in_the_config() -> None:
    from agentbolt.algorithm.sft.config import SFTConfig

    config = SFTConfig(top_k=5)
    assert (config.top_k, config.top_fraction) == (5, None)
    assert SFTConfig().top_fraction == 0.5
    with pytest.raises(ValueError, match="top_k and top_fraction both cut the ranked calls"):
        SFTConfig(top_k=5, top_fraction=0.3)
