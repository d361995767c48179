"""RolloutConfig and Attempt refuse values that would be silently misread, when built, read from JSON or assigned.

Time limits the watchdog cannot apply (NaN, infinite, negative) are refused by the store when a rollout is enqueued
or updated (tests/store).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import Attempt, EnqueueRolloutRequest, Rollout, RolloutConfig


@pytest.mark.parametrize("field", ["timeout_seconds", "unresponsive_seconds", "max_attempts"])
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_a_number_of_seconds_or_attempts(field: str, value: bool) -> None:
    with pytest.raises(ValidationError, match=f"{field} must be a number, got bool"):
        RolloutConfig(**{field: value})
    with pytest.raises(ValidationError, match=field):
        RolloutConfig.model_validate_json(f'{{"{field}": {str(value).lower()}}}')


def test_numbers_are_accepted_as_before() -> None:
    config = RolloutConfig(timeout_seconds=5, unresponsive_seconds=0.5, max_attempts=2.0)
    assert (config.timeout_seconds, config.unresponsive_seconds, config.max_attempts) == (5.0, 0.5, 2)


def test_an_unknown_config_field_is_refused_not_ignored() -> None:
    with pytest.raises(ValidationError, match="timeout"):
        RolloutConfig(timeout=5)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="max_retries"):
        EnqueueRolloutRequest(input=1, config={"max_retries": 3})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="max_retries"):
        Rollout(rollout_id="ro-1", input=1, start_time=0.0, config={"max_retries": 3})  # type: ignore[arg-type]


def test_assigning_a_config_field_checks_the_value() -> None:
    config = RolloutConfig()
    with pytest.raises(ValidationError, match="max_attempts"):
        config.max_attempts = 0
    with pytest.raises(ValidationError, match="retry_condition"):
        config.retry_condition = ["sometimes"]  # type: ignore[list-item]
    assert config == RolloutConfig()


async def test_an_assigned_time_limit_the_watchdog_cannot_apply_is_refused_at_enqueue() -> None:
    config = RolloutConfig()
    config.timeout_seconds = math.nan
    with pytest.raises(ValueError, match="timeout_seconds"):
        await InMemoryLightningStore().enqueue_rollout("task", config=config)


def test_a_config_round_trips_through_json() -> None:
    config = RolloutConfig(timeout_seconds=1.5, unresponsive_seconds=0, max_attempts=3, retry_condition=["timeout"])
    assert RolloutConfig.model_validate_json(config.model_dump_json()) == config
    assert RolloutConfig.model_validate(config.model_dump()) == config


@pytest.mark.parametrize("sequence_id", [0, -1])
def test_an_attempt_sequence_id_is_one_based(sequence_id: Any) -> None:
    with pytest.raises(ValidationError, match="sequence_id"):
        Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=sequence_id, start_time=0.0)
