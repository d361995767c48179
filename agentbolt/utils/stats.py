"""Statistics for reporting held-out results: the Wilson score interval of a success rate."""

from __future__ import annotations

import math
from typing import Tuple

__all__ = ["Z95", "wilson_interval"]

Z95 = 1.959964
"""Standard normal quantile of a two-sided 95 % interval."""


def wilson_interval(successes: int, total: int, z: float = Z95) -> Tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % with the default ``z``).

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or ``total`` successes, which is
    where small held-out sets often are.

    Args:
        successes: Successful trials.
        total: Trials.
        z: Standard normal quantile of the interval.

    Returns:
        ``(low, high)`` within [0, 1]; ``(0.0, 1.0)`` when ``total`` is 0 (nothing is known).

    Raises:
        ValueError: ``successes`` is negative or above ``total``.
    """
    if total < 0 or not 0 <= successes <= max(total, 0):
        raise ValueError(f"need 0 <= successes <= total, got {successes} of {total}")
    if total == 0:
        return 0.0, 1.0
    p = successes / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
