"""Solve records of the flow_grpo example written to a store, as its solver records them."""

from __future__ import annotations

from typing import Any, Dict

from agentbolt.emitter.object import encode_object
from agentbolt.store.base import LightningStore
from agentbolt.types import Span
from examples.flow_grpo.evaluation import SOLVE_RECORD_KIND


async def add_solve_record(store: LightningStore, rollout_id: str, attempt_id: str, record: Dict[str, Any]) -> None:
    """Store ``record`` as the solve record of an attempt (the span the solver emits at the end of a solve)."""
    attributes = {"flow_grpo.kind": SOLVE_RECORD_KIND, **encode_object(record)}
    sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
    await store.add_span(
        Span.from_attributes(
            rollout_id=rollout_id, attempt_id=attempt_id, sequence_id=sequence_id, attributes=attributes
        )
    )
