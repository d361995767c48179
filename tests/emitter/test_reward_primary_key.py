"""emit_reward with a single number: primary_key does not apply, and saying so is a warning, not an error."""

from __future__ import annotations

import logging

import pytest

from agentbolt.emitter import emit_reward, get_reward_value


def test_primary_key_with_a_scalar_reward_logs_one_warning_and_keeps_the_reward(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentbolt.emitter.reward"):
        span = emit_reward(1.0, primary_key="x", propagate=False)
    warnings = [record for record in caplog.records if "primary_key" in record.getMessage()]
    assert len(warnings) == 1
    assert "primary_key 'x' is ignored: it applies only to a dict of rewards" in warnings[0].getMessage()
    assert span.attributes["agentlightning.reward.0.name"] == "primary"
    assert get_reward_value(span) == 1.0


def test_scalar_reward_without_primary_key_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentbolt.emitter.reward"):
        emit_reward(0.5, propagate=False)
    assert "primary_key" not in caplog.text
