"""The shared argument checks (``agentbolt.utils.checks``) that model and constructor checks build on."""

from __future__ import annotations

import pytest

from agentbolt.utils.checks import check_finite, check_positive


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "minus-huge"])
def test_an_integer_beyond_the_float_range_is_not_a_finite_number(value: int) -> None:
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        check_finite(value, "timeout")
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        check_positive(value, "timeout")


def test_a_large_integer_within_the_float_range_is_finite() -> None:
    assert check_finite(10**300, "timeout", minimum=0) == 10**300
