"""The parameters of one store call, bundled: what an implementation receives and what the HTTP API carries.

:class:`~agentbolt.store.base.LightningStore` writes each public signature once and hands implementations one of
these bundles; the HTTP client sends it as the request body and the server parses the same model.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type, TypeVar

from pydantic import BaseModel

from agentbolt.types import EnqueueRolloutRequest, RolloutStatus, WorkerStatus
from agentbolt.types.wire import WireModel

__all__ = [
    "RolloutRequest",
    "QueryRolloutsRequest",
    "QueryAttemptsRequest",
    "QueryResourcesRequest",
    "QuerySpansRequest",
    "QueryWorkersRequest",
    "request_from_arguments",
]

RequestT = TypeVar("RequestT", bound=BaseModel)


class RolloutRequest(EnqueueRolloutRequest):
    """Body of ``POST /rollouts`` (start_rollout): the fields of an enqueued rollout, and the worker starting it."""

    worker_id: Optional[str] = None


class _PaginationFields(WireModel):
    """Paging and ordering shared by the list requests."""

    limit: int = -1
    offset: int = 0
    sort_by: Optional[str] = None
    sort_order: str = "asc"


class QueryRolloutsRequest(_PaginationFields):
    """Filters of ``GET /rollouts`` and ``POST /rollouts/search``."""

    status_in: Optional[List[RolloutStatus]] = None
    rollout_id_in: Optional[List[str]] = None
    rollout_id_contains: Optional[str] = None
    filter_logic: str = "and"


class QueryAttemptsRequest(_PaginationFields):
    """Options of ``GET /rollouts/{id}/attempts`` and ``POST /rollouts/{id}/attempts/search``."""

    sort_by: Optional[str] = "sequence_id"


class QueryResourcesRequest(_PaginationFields):
    """Filters of ``GET /resources``."""

    resources_id: Optional[str] = None
    resources_id_contains: Optional[str] = None


class QuerySpansRequest(_PaginationFields):
    """Filters of ``GET /spans`` and ``POST /spans/search``."""

    rollout_id: str
    attempt_id: Optional[str] = None
    trace_id: Optional[str] = None
    trace_id_contains: Optional[str] = None
    span_id: Optional[str] = None
    span_id_contains: Optional[str] = None
    parent_id: Optional[str] = None
    parent_id_contains: Optional[str] = None
    name: Optional[str] = None
    name_contains: Optional[str] = None
    filter_logic: str = "and"
    sort_by: Optional[str] = "sequence_id"


class QueryWorkersRequest(_PaginationFields):
    """Filters of ``GET /workers`` and ``POST /workers/search``."""

    status_in: Optional[List[WorkerStatus]] = None
    worker_id_contains: Optional[str] = None
    filter_logic: str = "and"


def request_from_arguments(model: Type[RequestT], arguments: Dict[str, Any]) -> RequestT:
    """A ``model`` holding the arguments of a store call (the method's ``locals()``) named like the model's fields.

    Built without validation: the method's signature already says what each argument is.
    """
    return model.model_construct(**{name: arguments[name] for name in model.model_fields})
