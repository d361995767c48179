"""The all-equal cut-off of group advantages is relative to the rewards' size, not an absolute threshold."""

from __future__ import annotations

import math
from typing import List

import pytest

from agentbolt.algorithm.grpo.advantages import group_advantages


def _one_group(rewards: List[float], mode: str = "std") -> tuple[list, int]:
    advantages, n_groups, n_zero = group_advantages(rewards, ["g"] * len(rewards), mode=mode)  # type: ignore[arg-type]
    assert n_groups == 1
    return advantages, n_zero


@pytest.mark.parametrize("mode", ["std", "mean"])
@pytest.mark.parametrize("rewards", [[1e-9, 3e-9], [2e-12, 0.0, 1.5e-12], [-5e-10, 5e-10]])
def test_rewards_on_a_tiny_scale_train(rewards: List[float], mode: str) -> None:
    advantages, n_zero = _one_group(rewards, mode)
    assert n_zero == 0
    assert all(a is not None and math.isfinite(a) for a in advantages)
    assert advantages[0] != 0.0 and advantages[-1] != 0.0
    # the ordering of the rewards is kept by their advantages
    assert (advantages[0] < advantages[-1]) == (rewards[0] < rewards[-1])


@pytest.mark.parametrize(
    "rewards",
    [
        [0.1 + 0.2, 0.3],
        [1e6, 1e6 * (1 + 1e-15)],
        [1e6, 1e6 + 1e-10],
        [1e-9, 1e-9 * (1 + 1e-15)],
        [0.0, 0.0, 0.0],
        [-7.25, -7.25],
    ],
)
def test_rewards_equal_up_to_float_rounding_are_zero_variance(rewards: List[float]) -> None:
    advantages, n_zero = _one_group(rewards)
    assert n_zero == 1 and advantages == [None] * len(rewards)


def test_large_rewards_that_really_differ_train() -> None:
    advantages, n_zero = _one_group([1e6, 1e6 + 1.0])
    assert n_zero == 0 and advantages[0] < 0 < advantages[1]
