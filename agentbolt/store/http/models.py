"""Bodies and answers of the store's HTTP API (``/v1/agl``), as pydantic models.

The list requests and the rollout request are :mod:`agentbolt.store.requests` (what store implementations receive);
the models here are the other bodies: queue operations, updates, sequence ids, waits, and the batch extensions.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from pydantic import ConfigDict, Field, RootModel

from agentbolt.types import (
    AttemptStatus,
    EnqueueRolloutRequest,
    MetricsRecord,
    NamedResources,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    TaskInput,
)
from agentbolt.types.wire import WIRE_CONFIG, WireModel

__all__ = [
    "DequeueRolloutRequest",
    "StartAttemptRequest",
    "EnqueueManyRolloutsRequest",
    "DequeueManyRolloutsRequest",
    "WaitForQueuedRolloutsRequest",
    "WaitForRolloutsRequest",
    "NextSequenceIdRequest",
    "NextSequenceIdResponse",
    "ManySequenceIdsRequest",
    "ManySequenceIdsResponse",
    "SpansOfAttemptsRequest",
    "AddManySpansRequest",
    "AddManySpansResponse",
    "AddSequencedSpansResponse",
    "NamedResourcesBody",
    "UpdateRolloutRequest",
    "UpdateAttemptRequest",
    "UpdateWorkerRequest",
    "AddMetricsRequest",
    "QueryMetricsRequest",
]


class DequeueRolloutRequest(WireModel):
    """Body of a single dequeue."""

    worker_id: Optional[str] = None


class StartAttemptRequest(WireModel):
    """Body of ``POST /rollouts/{rollout_id}/attempts``."""

    worker_id: Optional[str] = None


class EnqueueManyRolloutsRequest(WireModel):
    """Body of ``POST /queues/rollouts/enqueue``."""

    rollouts: List[EnqueueRolloutRequest]


class DequeueManyRolloutsRequest(WireModel):
    """Body of ``POST /queues/rollouts/dequeue``."""

    limit: int = 1
    worker_id: Optional[str] = None


class WaitForRolloutsRequest(WireModel):
    """Body of ``POST /waits/rollouts``."""

    rollout_ids: List[str]
    timeout: Optional[float] = None


class WaitForQueuedRolloutsRequest(WireModel):
    """Body of ``POST /waits/queue``."""

    timeout: float


class NextSequenceIdRequest(WireModel):
    """Body of ``POST /spans/next``."""

    rollout_id: str
    attempt_id: str


class NextSequenceIdResponse(WireModel):
    """Answer of ``POST /spans/next``."""

    sequence_id: int


class ManySequenceIdsRequest(WireModel):
    """Body of ``POST /spans/next/batch`` (extension): one sequence id per pair, in order."""

    rollout_attempt_ids: List[Tuple[str, str]]


class ManySequenceIdsResponse(WireModel):
    """Answer of ``POST /spans/next/batch``."""

    sequence_ids: List[int]


class SpansOfAttemptsRequest(WireModel):
    """Body of ``POST /spans/search/batch`` (extension): the spans of each pair, optionally of one name only."""

    rollout_attempt_ids: List[Tuple[str, str]]
    name: Optional[str] = None


class AddManySpansRequest(WireModel):
    """Body of ``POST /spans/batch`` (extension)."""

    spans: List[Span]


class AddManySpansResponse(WireModel):
    """Answer of ``POST /spans/batch``: positions (in the request) of the spans actually inserted."""

    inserted: List[int]


class AddSequencedSpansResponse(WireModel):
    """Answer of ``POST /spans/batch/sequenced``: positions (in the request) of the spans actually inserted, and the
    sequence id issued to each of them."""

    inserted: List[int]
    sequence_ids: List[int]


class NamedResourcesBody(RootModel[NamedResources]):
    """Body of ``POST /resources`` and ``POST /resources/{resources_id}``: resources by name."""

    model_config = WIRE_CONFIG


class _UpdateBody(WireModel):
    """An update body: it refuses unknown fields, so a misspelt field (``"stauts"``) is a 422, not an update that
    changes nothing."""

    model_config = ConfigDict(**WIRE_CONFIG, extra="forbid")


class UpdateRolloutRequest(_UpdateBody):
    """Body of ``POST /rollouts/{rollout_id}``; only the fields present are written."""

    input: Optional[TaskInput] = None
    mode: Optional[RolloutMode] = None
    resources_id: Optional[str] = None
    status: Optional[RolloutStatus] = None
    config: Optional[RolloutConfig] = None
    metadata: Optional[Dict[str, Any]] = None


class UpdateAttemptRequest(_UpdateBody):
    """Body of ``POST /rollouts/{rollout_id}/attempts/{attempt_id}``; only the fields present are written."""

    status: Optional[AttemptStatus] = None
    worker_id: Optional[str] = None
    last_heartbeat_time: Optional[float] = None
    metadata: Optional[Dict[str, Any]] = None


class UpdateWorkerRequest(_UpdateBody):
    """Body of ``POST /workers/{worker_id}``."""

    heartbeat_stats: Optional[Dict[str, Any]] = None


class AddMetricsRequest(WireModel):
    """Body of ``POST /metrics`` (extension): training metrics, one record per run step."""

    records: List[MetricsRecord]


class QueryMetricsRequest(WireModel):
    """Query of ``GET /metrics`` (extension): one run's records, or every run's, in the order first written."""

    run_id: Optional[str] = None
    limit: int = Field(default=-1, le=2**53)
    offset: int = Field(default=0, le=2**53)
