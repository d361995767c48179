"""The store's HTTP API, written once: each :class:`StoreRoute` binds one :class:`LightningStore` method to a route.

The server registers a handler per row (and the ``GET`` form of the list routes); the client implements every store
method it does not write out itself from its row. Adding a store method to the HTTP API is one row here, plus its
implementation in the stores.

How a row maps a call to a request:

* path parameters are the method parameters named in the path;
* the body is the method's remaining arguments as a JSON object (``None`` values kept, ``UNSET`` ones left out), or
  the one argument named by ``body_param`` (a span, named resources), or, for the private methods receiving a
  bundled request (``_start_rollout(request)``, ``_update_rollout(rollout_id, fields)``...), that bundle;
* the server validates the body with ``body`` and calls the public store method (the row's name without its
  leading ``_``) with the path parameters and the body's fields as keyword arguments (``only_given``: only the
  fields present in the body); ``serve`` replaces that call where the route needs more;
* the client decodes the JSON answer with ``decode``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Type, Union

from pydantic import BaseModel, RootModel, TypeAdapter
from typing_extensions import TypedDict

from agentbolt.store.http.models import (
    AddManySpansRequest,
    AddMetricsRequest,
    DequeueManyRolloutsRequest,
    EnqueueManyRolloutsRequest,
    ManySequenceIdsRequest,
    NamedResourcesBody,
    NextSequenceIdRequest,
    QueryMetricsRequest,
    SpansOfAttemptsRequest,
    StartAttemptRequest,
    UpdateAttemptRequest,
    UpdateRolloutRequest,
    UpdateWorkerRequest,
    WaitForQueuedRolloutsRequest,
    WaitForRolloutsRequest,
)
from agentbolt.store.requests import (
    QueryAttemptsRequest,
    QueryResourcesRequest,
    QueryRolloutsRequest,
    QuerySpansRequest,
    QueryWorkersRequest,
    RolloutRequest,
)
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    MetricsRecord,
    PaginatedResult,
    ResourcesUpdate,
    Rollout,
    Span,
    Worker,
)
from agentbolt.types.wire import decode_json

__all__ = [
    "API_V1_PREFIX",
    "API_AGL_PREFIX",
    "API_V1_AGL_PREFIX",
    "STORE_ID_HEADER",
    "StoreRoute",
    "StoreCall",
    "ROUTES",
    "ROUTES_BY_METHOD",
    "parse_rollout",
    "paginated_content",
    "RawJson",
]

API_V1_PREFIX = "/v1"
API_AGL_PREFIX = "/agl"
API_V1_AGL_PREFIX = API_V1_PREFIX + API_AGL_PREFIX
STORE_ID_HEADER = "x-agentbolt-store-id"
"""Request header naming the server a client expects (its ``server_id``); any other server answers 409."""

StoreCall = Callable[..., Awaitable[Any]]
"""``call(method_name, *args, **kwargs)``: how the server runs one store call."""

Decoder = Callable[[bytes], Any]
"""Turns the raw JSON of an answer into the store method's return value (client side)."""


def parse_rollout(item: Dict[str, Any]) -> Union[Rollout, AttemptedRollout]:
    """A rollout answer: an :class:`AttemptedRollout` when it carries its latest attempt."""
    if item.get("attempt") is not None:
        return AttemptedRollout.model_validate(item)
    return Rollout.model_validate(item)


# Answers made of models are validated straight from their JSON: one pass, no intermediate dicts and lists (a page
# of 200 spans decodes in about four fifths of the time). The others are parsed first.


def _parsed(decode: Callable[[Any], Any]) -> Decoder:
    return lambda raw: decode(decode_json(raw))


def _model(model: Type[BaseModel]) -> Decoder:
    return model.model_validate_json


def _optional(decode: Decoder) -> Decoder:
    return lambda raw: None if not raw or raw == b"null" else decode(raw)


def _list_of(model: Type[BaseModel]) -> Decoder:
    return TypeAdapter(List[model]).validate_json  # type: ignore[valid-type]


def _page(data: Dict[str, Any]) -> PaginatedResult[Any]:
    return PaginatedResult(items=data["items"], limit=data["limit"], offset=data["offset"], total=data["total"])


def _page_of(model: Type[BaseModel]) -> Decoder:
    fields = {"items": List[model], "limit": int, "offset": int, "total": int}  # type: ignore[valid-type]
    validate = TypeAdapter(TypedDict(f"{model.__name__}Page", fields)).validate_json  # type: ignore[operator]
    return lambda raw: _page(validate(raw))


def _rollout_page(data: Dict[str, Any]) -> PaginatedResult[Any]:
    return _page({**data, "items": [parse_rollout(item) for item in data["items"]]})


def paginated_content(result: Sequence[Any], limit: int, offset: int) -> Dict[str, Any]:
    """The JSON content of a page (a plain list from a store is one page holding everything)."""
    if isinstance(result, PaginatedResult):
        return {"items": list(result.items), "limit": result.limit, "offset": result.offset, "total": result.total}
    items = list(result)
    return {"items": items, "limit": limit, "offset": offset, "total": len(items)}


class RawJson(bytes):
    """An answer already encoded as JSON, sent as it is."""


@dataclass(frozen=True)
class StoreRoute:
    """One store method over HTTP.

    Attributes:
        method: The :class:`LightningStore` method the client implements with this route.
        verb: HTTP method.
        path: Path under ``/v1/agl``; ``{name}`` segments are method parameters.
        decode: Turns the raw JSON answer into the method's return value (client side).
        body: Model validating the request body (server side); for ``GET`` routes, the query parameters.
        body_param: Method parameter that is the whole body.
        body_optional: An empty body stands for ``body()``.
        status: Status of a successful answer.
        idempotent: Sending the request twice has the effect of sending it once, so the client may resend it after a
            failure whose outcome is unknown. Other requests are resent only when certainly not applied. A function
            of the call's arguments decides it per call.
        retried: Whether the client retries the request at all (dequeues are never retried).
        on_failure: What the client returns when the call finally fails (other than authentication errors):
            ``"raise"``, ``"none"`` or ``"empty"`` (an empty list).
        page_of: List route over this model: pagination options are validated against its fields.
        get_path: Path of the ``GET`` form of a list route (the body's fields as query parameters).
        only_given: Only the body fields present in the request are passed on (updates).
        not_null: Fields that may be absent but not ``null``.
        serve: Server side replacing the plain store call: ``serve(call, path_values, body) -> content``.
        refetch: Client side, for a call answered ``null`` after it was sent again following a failure that may have
            left the first send applied: ``refetch(store, arguments)`` reads what the first send made.
    """

    method: str
    verb: Literal["GET", "POST"]
    path: str
    decode: Decoder
    body: Optional[Type[BaseModel]] = None
    body_param: Optional[str] = None
    body_optional: bool = False
    status: int = 200
    idempotent: Union[bool, Callable[[Mapping[str, Any]], bool]] = True
    retried: bool = True
    on_failure: Literal["raise", "none", "empty"] = "raise"
    page_of: Optional[Type[BaseModel]] = None
    get_path: Optional[str] = None
    only_given: bool = False
    not_null: Tuple[str, ...] = ()
    serve: Optional[Callable[[StoreCall, Dict[str, str], Any], Awaitable[Any]]] = None
    refetch: Optional[Callable[[Any, Mapping[str, Any]], Awaitable[Any]]] = None

    def resendable(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the call with these arguments may be sent again after a failure whose outcome is unknown."""
        return self.idempotent(arguments) if callable(self.idempotent) else self.idempotent

    @property
    def store_method(self) -> str:
        """The public store method the server calls."""
        return self.method.lstrip("_")

    @property
    def path_params(self) -> Tuple[str, ...]:
        """Names of the path parameters."""
        return tuple(re.findall(r"{(\w+)}", self.path))

    @property
    def bundled(self) -> bool:
        """Whether the client method receives the request as one bundle (a private method)."""
        return self.method.startswith("_")

    def arguments(self, body: Optional[BaseModel]) -> Dict[str, Any]:
        """Keyword arguments of the store call carried by a validated ``body``."""
        if body is None:
            return {}
        if self.body_param is not None:
            return {self.body_param: body.root if isinstance(body, RootModel) else body}
        names = body.model_fields_set if self.only_given else type(body).model_fields
        return {name: getattr(body, name) for name in names}


# ---------------------------------------------------------------------------------------------------------------
# Updates that a second send could apply to something else


def _queues_nothing(arguments: Mapping[str, Any]) -> bool:
    """An update that puts the rollout back in the queue is not resent: a worker may have claimed it in between,
    and the second send would queue it again beside that worker's attempt."""
    return arguments["fields"].get("status") not in ("queuing", "requeuing")


def _names_its_attempt(arguments: Mapping[str, Any]) -> bool:
    """An update of the ``"latest"`` attempt is not resent: the latest attempt may be another one by then."""
    return arguments["attempt_id"] != "latest"


async def _stored_span(store: Any, arguments: Mapping[str, Any]) -> Optional[Span]:
    """The span an ``add_span`` sent twice stored with its first send (the second was a duplicate of it)."""
    span: Span = arguments["span"]
    found = await store.query_spans(span.rollout_id, span.attempt_id, span_id=span.span_id)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------------------------
# Server sides that do more than one plain store call


async def _serve_enqueue(call: StoreCall, path: Dict[str, str], body: EnqueueManyRolloutsRequest) -> Any:
    if not body.rollouts:
        return []
    if len(body.rollouts) == 1:
        one = body.rollouts[0]
        return [await call("enqueue_rollout", one.input, one.mode, one.resources_id, one.config, one.metadata)]
    return list(await call("enqueue_many_rollouts", body.rollouts))


async def _serve_dequeue(call: StoreCall, path: Dict[str, str], body: DequeueManyRolloutsRequest) -> Any:
    if body.limit <= 0:
        return []
    if body.limit == 1:
        claimed = await call("dequeue_rollout", worker_id=body.worker_id)
        return [claimed] if claimed is not None else []
    return list(await call("dequeue_many_rollouts", limit=body.limit, worker_id=body.worker_id))


def _positions(spans: Sequence[Span], inserted: Sequence[Span]) -> List[int]:
    positions = {(s.rollout_id, s.attempt_id, s.span_id): i for i, s in enumerate(spans)}
    return [positions[(s.rollout_id, s.attempt_id, s.span_id)] for s in inserted]


async def _serve_add_many_spans(call: StoreCall, path: Dict[str, str], body: AddManySpansRequest) -> Any:
    inserted = await call("add_many_spans", body.spans)
    return {"inserted": _positions(body.spans, inserted)}


async def _serve_sequenced_spans(call: StoreCall, path: Dict[str, str], body: AddManySpansRequest) -> Any:
    inserted = await call("add_spans_with_new_sequence_ids", body.spans)
    return {"inserted": _positions(body.spans, inserted), "sequence_ids": [s.sequence_id for s in inserted]}


async def _serve_next_sequence_id(call: StoreCall, path: Dict[str, str], body: NextSequenceIdRequest) -> Any:
    return {"sequence_id": await call("get_next_span_sequence_id", body.rollout_id, body.attempt_id)}


async def _serve_sequence_ids(call: StoreCall, path: Dict[str, str], body: ManySequenceIdsRequest) -> Any:
    return {"sequence_ids": list(await call("get_many_span_sequence_ids", body.rollout_attempt_ids))}


async def _serve_query_spans(call: StoreCall, path: Dict[str, str], body: QuerySpansRequest) -> RawJson:
    return RawJson(await call("_query_spans_json", body))


async def _serve_query_metrics(call: StoreCall, path: Dict[str, str], body: QueryMetricsRequest) -> Any:
    if body.limit == 0 or body.limit < -1:
        raise ValueError("Limit must be greater than 0 or -1 for no limit")
    if body.offset < 0:
        raise ValueError("Offset must be greater than or equal to 0")
    page = await call("query_metrics", run_id=body.run_id, limit=body.limit, offset=body.offset)
    return paginated_content(page, body.limit, body.offset)


def _decode_positions(data: Dict[str, Any]) -> List[int]:
    return [int(i) for i in data["inserted"]]


# ---------------------------------------------------------------------------------------------------------------
# The table. Span routes come first: the busiest routes are matched first.


ROUTES: Tuple[StoreRoute, ...] = (
    StoreRoute(
        "add_span",
        "POST",
        "/spans",
        _optional(_model(Span)),
        body=Span,
        body_param="span",
        status=201,
        refetch=_stored_span,
    ),
    StoreRoute(
        "add_many_spans",
        "POST",
        "/spans/batch",
        _parsed(_decode_positions),
        body=AddManySpansRequest,
        status=201,
        serve=_serve_add_many_spans,
    ),
    StoreRoute(
        "add_spans_with_new_sequence_ids",
        "POST",
        "/spans/batch/sequenced",
        decode_json,
        body=AddManySpansRequest,
        status=201,
        serve=_serve_sequenced_spans,
    ),
    StoreRoute(
        "_query_spans",
        "POST",
        "/spans/search",
        _page_of(Span),
        body=QuerySpansRequest,
        page_of=Span,
        get_path="/spans",
        serve=_serve_query_spans,
    ),
    StoreRoute(
        "query_spans_of_attempts",
        "POST",
        "/spans/search/batch",
        TypeAdapter(List[List[Span]]).validate_json,
        body=SpansOfAttemptsRequest,
    ),
    StoreRoute(
        "get_next_span_sequence_id",
        "POST",
        "/spans/next",
        _parsed(lambda data: int(data["sequence_id"])),
        body=NextSequenceIdRequest,
        serve=_serve_next_sequence_id,
    ),
    StoreRoute(
        "get_many_span_sequence_ids",
        "POST",
        "/spans/next/batch",
        _parsed(lambda data: [int(x) for x in data["sequence_ids"]]),
        body=ManySequenceIdsRequest,
        serve=_serve_sequence_ids,
    ),
    StoreRoute(
        "wait_for_rollouts",
        "POST",
        "/waits/rollouts",
        _parsed(lambda data: [parse_rollout(item) for item in data]),
        body=WaitForRolloutsRequest,
    ),
    StoreRoute(
        "wait_for_queued_rollouts",
        "POST",
        "/waits/queue",
        _parsed(bool),
        body=WaitForQueuedRolloutsRequest,
    ),
    StoreRoute(
        "enqueue_many_rollouts",
        "POST",
        "/queues/rollouts/enqueue",
        _list_of(Rollout),
        body=EnqueueManyRolloutsRequest,
        status=201,
        idempotent=False,
        serve=_serve_enqueue,
    ),
    StoreRoute(
        "dequeue_many_rollouts",
        "POST",
        "/queues/rollouts/dequeue",
        _list_of(AttemptedRollout),
        body=DequeueManyRolloutsRequest,
        body_optional=True,
        idempotent=False,
        retried=False,
        on_failure="empty",
        serve=_serve_dequeue,
    ),
    StoreRoute(
        "_start_rollout",
        "POST",
        "/rollouts",
        _model(AttemptedRollout),
        body=RolloutRequest,
        status=201,
        idempotent=False,
    ),
    StoreRoute(
        "_query_rollouts",
        "POST",
        "/rollouts/search",
        _parsed(_rollout_page),
        body=QueryRolloutsRequest,
        body_optional=True,
        page_of=Rollout,
        get_path="/rollouts",
    ),
    StoreRoute(
        "get_rollout_by_id", "GET", "/rollouts/{rollout_id}", _optional(_parsed(parse_rollout)), on_failure="none"
    ),
    StoreRoute(
        "_update_rollout",
        "POST",
        "/rollouts/{rollout_id}",
        _parsed(parse_rollout),
        body=UpdateRolloutRequest,
        only_given=True,
        not_null=("status", "config"),
        idempotent=_queues_nothing,
    ),
    StoreRoute(
        "start_attempt",
        "POST",
        "/rollouts/{rollout_id}/attempts",
        _model(AttemptedRollout),
        body=StartAttemptRequest,
        body_optional=True,
        status=201,
        idempotent=False,
    ),
    StoreRoute(
        "_query_attempts",
        "POST",
        "/rollouts/{rollout_id}/attempts/search",
        _page_of(Attempt),
        body=QueryAttemptsRequest,
        body_optional=True,
        page_of=Attempt,
        get_path="/rollouts/{rollout_id}/attempts",
    ),
    StoreRoute(
        "get_latest_attempt",
        "GET",
        "/rollouts/{rollout_id}/attempts/latest",
        _optional(_model(Attempt)),
        on_failure="none",
    ),
    StoreRoute(
        "_update_attempt",
        "POST",
        "/rollouts/{rollout_id}/attempts/{attempt_id}",
        _model(Attempt),
        body=UpdateAttemptRequest,
        only_given=True,
        not_null=("status", "worker_id", "last_heartbeat_time"),
        idempotent=_names_its_attempt,
    ),
    StoreRoute(
        "_query_workers",
        "POST",
        "/workers/search",
        _page_of(Worker),
        body=QueryWorkersRequest,
        body_optional=True,
        page_of=Worker,
        get_path="/workers",
    ),
    StoreRoute("get_worker_by_id", "GET", "/workers/{worker_id}", _optional(_model(Worker)), on_failure="none"),
    StoreRoute(
        "update_worker",
        "POST",
        "/workers/{worker_id}",
        _model(Worker),
        body=UpdateWorkerRequest,
        body_optional=True,
        only_given=True,
        not_null=("heartbeat_stats",),
    ),
    StoreRoute("statistics", "GET", "/statistics", _parsed(dict)),
    StoreRoute(
        "_query_resources",
        "GET",
        "/resources",
        _page_of(ResourcesUpdate),
        body=QueryResourcesRequest,
        page_of=ResourcesUpdate,
    ),
    StoreRoute(
        "add_resources",
        "POST",
        "/resources",
        _model(ResourcesUpdate),
        body=NamedResourcesBody,
        body_param="resources",
        status=201,
        idempotent=False,
    ),
    StoreRoute(
        "get_latest_resources", "GET", "/resources/latest", _optional(_model(ResourcesUpdate)), on_failure="none"
    ),
    StoreRoute(
        "update_resources",
        "POST",
        "/resources/{resources_id}",
        _model(ResourcesUpdate),
        body=NamedResourcesBody,
        body_param="resources",
        idempotent=False,
    ),
    StoreRoute(
        "get_resources_by_id",
        "GET",
        "/resources/{resources_id}",
        _optional(_model(ResourcesUpdate)),
        on_failure="none",
    ),
    StoreRoute("add_metrics", "POST", "/metrics", _list_of(MetricsRecord), body=AddMetricsRequest, status=201),
    StoreRoute(
        "query_metrics",
        "GET",
        "/metrics",
        _page_of(MetricsRecord),
        body=QueryMetricsRequest,
        serve=_serve_query_metrics,
    ),
)

ROUTES_BY_METHOD: Dict[str, StoreRoute] = {route.method: route for route in ROUTES}
"""Rows by the store method they implement."""
