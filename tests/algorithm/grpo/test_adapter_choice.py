"""Which adapter GRPO reads its rollouts with when the Trainer was given one."""

from __future__ import annotations

from typing import Any, List, Sequence

import pytest

import agentbolt as agl
from agentbolt.adapter import LlmProxyTraceToTriplet
from agentbolt.algorithm.grpo.algorithm import GRPO


def _adapter_under(trainer_adapter: Any) -> Any:
    algorithm = GRPO()
    trainer = agl.Trainer(algorithm=algorithm, adapter=trainer_adapter)
    algorithm.set_adapter(trainer.adapter)  # as Trainer.fit does
    return algorithm._triplet_adapter()


def test_the_trainer_adapters_agent_match_is_kept() -> None:
    adapter = _adapter_under({"agent_match": "planner"})
    assert isinstance(adapter, LlmProxyTraceToTriplet)
    assert adapter.agent_match == "planner"


def test_the_trainers_default_adapter_becomes_the_gateway_adapter_without_a_filter() -> None:
    adapter = _adapter_under(None)
    assert isinstance(adapter, LlmProxyTraceToTriplet) and adapter.agent_match is None


class Custom(agl.TraceAdapter):
    def adapt(self, source: Sequence[Any], /) -> List[Any]:
        return []


def test_an_adapter_that_cannot_read_token_ids_is_replaced_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    algorithm = GRPO()
    custom = Custom()
    algorithm.set_adapter(custom)
    with caplog.at_level("WARNING"):
        first, second = algorithm._triplet_adapter(), algorithm._triplet_adapter()
    assert isinstance(first, LlmProxyTraceToTriplet) and isinstance(second, LlmProxyTraceToTriplet)
    warnings = [r.getMessage() for r in caplog.records if "ignores the Trainer's adapter" in r.getMessage()]
    assert len(warnings) == 1 and "Custom" in warnings[0] and "GRPO(adapter=...)" in warnings[0]
