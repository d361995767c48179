"""The LightningStore over HTTP, under the reference's module path: a FastAPI server wrapping any store, and an
aiohttp client.

The implementation lives in :mod:`agentbolt.store.http` (route table, request models, server, client); this module
re-exports it. Routes live under ``/v1/agl`` (see ``docs/store.md``, section "HTTP API").
"""

from __future__ import annotations

import logging

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.store.http.client import LightningStoreClient
from agentbolt.store.http.errors import (
    LightningStoreHTTPError,
    LightningStoreLookupError,
    LightningStoreNotImplementedError,
    LightningStoreRuntimeError,
    LightningStoreTypeError,
    LightningStoreValueError,
)
from agentbolt.store.http.models import (
    AddManySpansRequest,
    AddManySpansResponse,
    AddSequencedSpansResponse,
    DequeueManyRolloutsRequest,
    DequeueRolloutRequest,
    EnqueueManyRolloutsRequest,
    ManySequenceIdsRequest,
    ManySequenceIdsResponse,
    NamedResourcesBody,
    NextSequenceIdRequest,
    NextSequenceIdResponse,
    StartAttemptRequest,
    UpdateAttemptRequest,
    UpdateRolloutRequest,
    UpdateWorkerRequest,
    WaitForRolloutsRequest,
)
from agentbolt.store.http.routes import API_AGL_PREFIX, API_V1_AGL_PREFIX, API_V1_PREFIX, STORE_ID_HEADER
from agentbolt.store.http.server import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_PORT, LightningStoreServer
from agentbolt.store.requests import (
    QueryAttemptsRequest,
    QueryResourcesRequest,
    QueryRolloutsRequest,
    QuerySpansRequest,
    QueryWorkersRequest,
    RolloutRequest,
)
from agentbolt.types import Span

__all__ = [
    "API_V1_PREFIX",
    "API_AGL_PREFIX",
    "API_V1_AGL_PREFIX",
    "API_KEY_ENV_VAR",
    "DEFAULT_PORT",
    "DEFAULT_MAX_REQUEST_BYTES",
    "STORE_ID_HEADER",
    "LightningStoreServer",
    "LightningStoreClient",
    "LightningStoreHTTPError",
    "LightningStoreValueError",
    "LightningStoreTypeError",
    "LightningStoreLookupError",
    "LightningStoreRuntimeError",
    "LightningStoreNotImplementedError",
    "RolloutRequest",
    "DequeueRolloutRequest",
    "StartAttemptRequest",
    "EnqueueManyRolloutsRequest",
    "DequeueManyRolloutsRequest",
    "QueryRolloutsRequest",
    "WaitForRolloutsRequest",
    "NextSequenceIdRequest",
    "NextSequenceIdResponse",
    "ManySequenceIdsRequest",
    "ManySequenceIdsResponse",
    "AddManySpansRequest",
    "AddManySpansResponse",
    "AddSequencedSpansResponse",
    "NamedResourcesBody",
    "UpdateRolloutRequest",
    "UpdateAttemptRequest",
    "UpdateWorkerRequest",
    "QueryAttemptsRequest",
    "QueryResourcesRequest",
    "QuerySpansRequest",
    "QueryWorkersRequest",
    "Span",
]

server_logger = logging.getLogger("agentbolt.store.server")
client_logger = logging.getLogger("agentbolt.store.client")
