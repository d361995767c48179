"""The LightningStore over HTTP: a FastAPI server wrapping any store, and an aiohttp client.

Routes live under ``/v1/agl`` (see ``docs/store.md``, section "HTTP API"). The server answers bad input with
4xx JSON bodies ``{"detail": ..., "error_type": ...}`` and never lets it touch stored data; the client turns them
into :class:`LightningStoreHTTPError` exceptions (subclasses of :class:`aiohttp.ClientResponseError`, and of
:class:`ValueError` / :class:`TypeError` / ... mirroring the exception the store raised).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
import uuid
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Coroutine,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

import aiohttp
import orjson
import pydantic_core
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from opentelemetry.sdk.trace import ReadableSpan
from pydantic import BaseModel, RootModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from typing_extensions import Annotated

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.store.base import (
    UNSET,
    LightningStore,
    LightningStoreCapabilities,
    LightningStoreStatistics,
    Unset,
    forward_store_api,
)
from agentbolt.store.collection.base import DuplicatedPrimaryKeyError
from agentbolt.store.dashboard import install_dashboard, is_public_page
from agentbolt.store.requests import (
    QueryAttemptsRequest,
    QueryResourcesRequest,
    QueryRolloutsRequest,
    QuerySpansRequest,
    QueryWorkersRequest,
    RolloutRequest,
    _PaginationFields,
)
from agentbolt.store.utils import LATENCY_BUCKETS
from agentbolt.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    EnqueueRolloutRequest,
    MetricsRecord,
    NamedResources,
    PaginatedResult,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    TaskInput,
    Worker,
)
from agentbolt.utils.server_launcher import LaunchMode, PythonServerLauncher, PythonServerLauncherArgs

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "API_V1_PREFIX",
    "API_AGL_PREFIX",
    "API_V1_AGL_PREFIX",
    "API_KEY_ENV_VAR",
    "DEFAULT_MAX_REQUEST_BYTES",
    "STORE_ID_HEADER",
    "LightningStoreServer",
    "LightningStoreClient",
    "LightningStoreHTTPError",
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
    "NamedResourcesBody",
    "UpdateRolloutRequest",
    "UpdateAttemptRequest",
    "UpdateWorkerRequest",
    "QueryAttemptsRequest",
    "QueryResourcesRequest",
    "QuerySpansRequest",
    "QueryWorkersRequest",
]

server_logger = logging.getLogger("agentbolt.store.server")
client_logger = logging.getLogger("agentbolt.store.client")

API_V1_PREFIX = "/v1"
API_AGL_PREFIX = "/agl"
API_V1_AGL_PREFIX = API_V1_PREFIX + API_AGL_PREFIX
DEFAULT_PORT = 4747
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
STORE_ID_HEADER = "x-agentbolt-store-id"
"""Request header naming the server a client expects (its ``server_id``); any other server answers 409."""

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------------------------
# Request / response models


class DequeueRolloutRequest(BaseModel):
    """Body of a single dequeue."""

    worker_id: Optional[str] = None


class StartAttemptRequest(BaseModel):
    """Body of ``POST /rollouts/{rollout_id}/attempts``."""

    worker_id: Optional[str] = None


class EnqueueManyRolloutsRequest(BaseModel):
    """Body of ``POST /queues/rollouts/enqueue``."""

    rollouts: List[EnqueueRolloutRequest]


class DequeueManyRolloutsRequest(BaseModel):
    """Body of ``POST /queues/rollouts/dequeue``."""

    limit: int = 1
    worker_id: Optional[str] = None


class WaitForRolloutsRequest(BaseModel):
    """Body of ``POST /waits/rollouts``."""

    rollout_ids: List[str]
    timeout: Optional[float] = None


class NextSequenceIdRequest(BaseModel):
    """Body of ``POST /spans/next``."""

    rollout_id: str
    attempt_id: str


class NextSequenceIdResponse(BaseModel):
    """Answer of ``POST /spans/next``."""

    sequence_id: int


class ManySequenceIdsRequest(BaseModel):
    """Body of ``POST /spans/next/batch`` (extension): one sequence id per pair, in order."""

    rollout_attempt_ids: List[Tuple[str, str]]


class ManySequenceIdsResponse(BaseModel):
    """Answer of ``POST /spans/next/batch``."""

    sequence_ids: List[int]


class AddManySpansRequest(BaseModel):
    """Body of ``POST /spans/batch`` (extension)."""

    spans: List[Span]


class AddManySpansResponse(BaseModel):
    """Answer of ``POST /spans/batch``: positions (in the request) of the spans actually inserted."""

    inserted: List[int]


class AddSequencedSpansResponse(BaseModel):
    """Answer of ``POST /spans/batch/sequenced``: positions (in the request) of the spans actually inserted, and the
    sequence id issued to each of them."""

    inserted: List[int]
    sequence_ids: List[int]


class NamedResourcesBody(RootModel[NamedResources]):
    """Body of ``POST /resources`` and ``POST /resources/{resources_id}``: resources by name."""


class UpdateRolloutRequest(BaseModel):
    """Body of ``POST /rollouts/{rollout_id}``; only the fields present are written."""

    input: Optional[TaskInput] = None
    mode: Optional[RolloutMode] = None
    resources_id: Optional[str] = None
    status: Optional[RolloutStatus] = None
    config: Optional[RolloutConfig] = None
    metadata: Optional[Dict[str, Any]] = None


class UpdateAttemptRequest(BaseModel):
    """Body of ``POST /rollouts/{rollout_id}/attempts/{attempt_id}``; only the fields present are written."""

    status: Optional[AttemptStatus] = None
    worker_id: Optional[str] = None
    last_heartbeat_time: Optional[float] = None
    metadata: Optional[Dict[str, Any]] = None


class UpdateWorkerRequest(BaseModel):
    """Body of ``POST /workers/{worker_id}``."""

    heartbeat_stats: Optional[Dict[str, Any]] = None


# ---------------------------------------------------------------------------------------------------------------
# Error mapping (one rule, shared by every route)

_NOT_FOUND_MARKERS = ("not found", "does not exist", "no attempts found", "unknown")
_BUILTIN_KINDS = ("ValueError", "TypeError", "KeyError", "LookupError", "RuntimeError", "NotImplementedError")


def _error_kind(exc: BaseException) -> str:
    """Name of the first builtin exception class in ``exc``'s ancestry (e.g. ``ValueError``)."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins":
            return cls.__name__
    return "Exception"


def _status_for_exception(exc: BaseException) -> int:
    """HTTP status of an exception raised by the store while serving a request."""
    if isinstance(exc, ValidationError):
        return 422
    if isinstance(exc, DuplicatedPrimaryKeyError):
        return 409
    if isinstance(exc, (ValueError, LookupError)):
        message = str(exc).lower()
        return 404 if isinstance(exc, LookupError) or any(m in message for m in _NOT_FOUND_MARKERS) else 400
    if isinstance(exc, (TypeError, OverflowError)):
        # Raised on values the request chose: sorting by a field whose values cannot be compared, a number too
        # large for the database...
        return 400
    if isinstance(exc, NotImplementedError):
        return 501
    if isinstance(exc, RuntimeError):
        return 409
    return 500


def _json_response(content: Any, status_code: int = 200) -> Response:
    return Response(content=pydantic_core.to_json(content), status_code=status_code, media_type="application/json")


def _error_body(detail: Any, error_type: str, error_kind: str) -> bytes:
    """The JSON body of every error: the message, the exception class, and its builtin base class."""
    return orjson.dumps({"detail": detail, "error_type": error_type, "error_kind": error_kind})


def _error_response(status_code: int, detail: Any, error_type: str, error_kind: str) -> Response:
    return Response(
        content=_error_body(detail, error_type, error_kind), status_code=status_code, media_type="application/json"
    )


def _exception_response(exc: Exception) -> Response:
    status_code = _status_for_exception(exc)
    if status_code >= 500:
        server_logger.exception("Store call failed")
    else:
        server_logger.debug("Store call rejected with %d: %s", status_code, exc)
    if isinstance(exc, ValidationError):
        detail: Any = orjson.loads(exc.json(include_url=False, include_context=False))
    else:
        detail = str(exc) or type(exc).__name__
    return _error_response(status_code, detail, type(exc).__name__, _error_kind(exc))


async def _http_exception_response(request: Request, exc: HTTPException) -> Response:
    """Errors raised by the routes themselves (bad options, unknown paths) in the common error format."""
    response = _error_response(exc.status_code, exc.detail, "HTTPException", "ValueError")
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _validation_error_response(request: Request, exc: RequestValidationError) -> Response:
    """422 for malformed or mistyped input, in the common error format (``detail`` lists the problems)."""
    errors = [{key: error[key] for key in ("type", "loc", "msg") if key in error} for error in exc.errors()]
    return _error_response(422, errors, "RequestValidationError", "ValueError")


class _StoreRoute(APIRoute):
    """Route that turns exceptions raised by the store into JSON error responses."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (HTTPException, RequestValidationError):
                raise
            except Exception as exc:
                return _exception_response(exc)

        return guarded


def _bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def _validate_pagination(request: _PaginationFields, model: Type[BaseModel]) -> None:
    """Reject bad sort/pagination options with 400."""
    if request.sort_by is not None and request.sort_by not in model.model_fields:
        allowed = ", ".join(model.model_fields)
        raise _bad_request(f"Invalid sort_by: {request.sort_by}, allowed fields are: {allowed}")
    if request.sort_order not in ("asc", "desc"):
        raise _bad_request(f"Invalid sort_order: {request.sort_order}, must be 'asc' or 'desc'")
    if request.limit == 0 or request.limit < -1:
        raise _bad_request("Limit must be greater than 0 or -1 for no limit")
    if request.offset < 0:
        raise _bad_request("Offset must be greater than or equal to 0")
    filter_logic = getattr(request, "filter_logic", "and")
    if filter_logic not in ("and", "or"):
        raise _bad_request(f"Invalid filter_logic: {filter_logic}, must be 'and' or 'or'")


def _reject_nulls(request: BaseModel, fields: Sequence[str]) -> None:
    for field in fields:
        if field in request.model_fields_set and getattr(request, field) is None:
            raise _bad_request(f"{field} is invalid; it cannot be a null value.")


def _paginated(result: Sequence[Any], limit: int, offset: int) -> Dict[str, Any]:
    if isinstance(result, PaginatedResult):
        return {"items": list(result.items), "limit": result.limit, "offset": result.offset, "total": result.total}
    items = list(result)
    return {"items": items, "limit": limit, "offset": offset, "total": len(items)}


# ---------------------------------------------------------------------------------------------------------------
# ASGI middlewares


_PUBLIC_PATHS = frozenset({"/health", API_V1_AGL_PREFIX + "/health"})
_STORE_ID_HEADER_BYTES = STORE_ID_HEADER.encode()


class _GuardMiddleware:
    """Bearer-token check, store identity check and request-size limit, as a lean ASGI middleware."""

    def __init__(self, app: Any, api_key: Optional[str], max_request_bytes: int, server_id: str) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_request_bytes = max_request_bytes
        self.server_id = server_id.encode()

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_length: Optional[bytes] = None
        authorization: Optional[bytes] = None
        expected_id: Optional[bytes] = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                content_length = value
            elif key == b"authorization":
                authorization = value
            elif key == _STORE_ID_HEADER_BYTES:
                expected_id = value
        if expected_id is not None and expected_id != self.server_id and scope["path"] not in _PUBLIC_PATHS:
            detail = (
                f"This store server ({self.server_id.decode()}) is not the one the client was started with "
                f"({expected_id.decode(errors='replace')}): another store holds this address."
            )
            await _send_error(send, 409, detail, "StoreIdentityMismatch", "")
            return
        if (
            self.api_key is not None
            and scope["method"] != "OPTIONS"
            and scope["path"] not in _PUBLIC_PATHS
            and not is_public_page(scope["path"])
        ):
            token = authorization[7:].strip() if authorization and authorization[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, self.api_key):
                await _send_error(
                    send, 401, "Missing or invalid API key.", "Unauthorized", "", [(b"www-authenticate", b"Bearer")]
                )
                return
        if content_length is not None:
            try:
                length = int(content_length)
            except ValueError:
                await _send_error(send, 400, "Invalid Content-Length header.", "BadRequest", "ValueError")
                return
            if length > self.max_request_bytes:
                await _send_error(send, 413, *_too_large(self.max_request_bytes))
                return
            await self.app(scope, receive, send)
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        # Body without a declared length (chunked): read it up to the limit before handing it on.
        chunks: List[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                await _send_error(send, 413, *_too_large(self.max_request_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _too_large(limit: int) -> Tuple[str, str, str]:
    return f"Request body too large: the limit is {limit} bytes.", "RequestTooLarge", "ValueError"


async def _send_error(
    send: Any,
    status: int,
    detail: str,
    error_type: str,
    error_kind: str,
    extra_headers: Optional[List[Tuple[bytes, bytes]]] = None,
) -> None:
    """Send an error response from ASGI middleware, in the common error format."""
    body = _error_body(detail, error_type, error_kind)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


def _templated_path(path: str) -> str:
    """Path label for metrics: ids replaced by their parameter names."""
    parts = path.split("/")
    names = {
        "rollouts": "{rollout_id}",
        "attempts": "{attempt_id}",
        "resources": "{resources_id}",
        "workers": "{worker_id}",
    }
    literal = {"search", "latest", "enqueue", "dequeue", "batch", "next"}
    for i in range(1, len(parts)):
        if parts[i - 1] in names and parts[i] and parts[i] not in literal:
            if parts[i - 1] == "rollouts" and i >= 2 and parts[i - 2] == "queues":
                continue
            parts[i] = names[parts[i - 1]]
    return "/".join(parts)


class _MetricsMiddleware:
    """Records ``agl.http.total`` and ``agl.http.latency`` per templated path, method and status."""

    def __init__(self, app: Any, tracker: MetricsBackend) -> None:
        self.app = app
        self.tracker = tracker

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = "499"
        start = time.perf_counter()

        async def send_wrapper(message: Dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except asyncio.CancelledError:
            status = "499"
            raise
        except Exception as exc:
            status = type(exc).__name__
            raise
        finally:
            labels = {"path": _templated_path(scope["path"]), "method": scope["method"], "status": status}
            elapsed = time.perf_counter() - start
            try:
                await self.tracker.inc_counter("agl.http.total", labels=labels)
                await self.tracker.observe_histogram("agl.http.latency", elapsed, labels=labels)
            except Exception:
                server_logger.debug("Failed to record HTTP metrics", exc_info=True)


# ---------------------------------------------------------------------------------------------------------------
# Server


def _new_app(**kwargs: Any) -> FastAPI:
    """A FastAPI app without FastAPI's own OpenTelemetry instrumentation (where the installed version has it).

    The store must not trace its own requests: in a process whose tracer exports spans to this very store, that
    would feed the store with spans about storing spans.
    """
    try:
        return FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False}, **kwargs)
    except TypeError:  # FastAPI versions without built-in telemetry
        return FastAPI(**kwargs)


class _PrefixedRoutes:
    """Route decorators of an app with a path prefix (like an included router, without its extra matching pass).

    ``body=Model`` documents a JSON body that the endpoint parses itself with :func:`_parse_body`; such models
    are added to the OpenAPI components (see :func:`_install_body_docs`).
    """

    def __init__(self, app: FastAPI, prefix: str, body_models: Dict[str, Type[BaseModel]]) -> None:
        self.app = app
        self.prefix = prefix
        self.body_models = body_models

    def get(self, path: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        return self.app.get(self.prefix + path, **kwargs)

    def post(
        self, path: str, *, body: Optional[Type[BaseModel]] = None, body_required: bool = True, **kwargs: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if body is not None:
            self.body_models[body.__name__] = body
            schema = {"$ref": f"#/components/schemas/{body.__name__}"}
            kwargs["openapi_extra"] = {
                "requestBody": {"required": body_required, "content": {"application/json": {"schema": schema}}}
            }
        return self.app.post(self.prefix + path, **kwargs)


def _install_body_docs(app: FastAPI) -> Dict[str, Type[BaseModel]]:
    """Make the app's OpenAPI document include the returned (initially empty) name -> body model mapping."""
    models: Dict[str, Type[BaseModel]] = {}
    generate = app.openapi

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            schemas = generate().setdefault("components", {}).setdefault("schemas", {})
            for name, body in models.items():
                body_schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
                for def_name, definition in body_schema.pop("$defs", {}).items():
                    schemas.setdefault(def_name, definition)
                schemas[name] = body_schema
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
    return models


BodyT = TypeVar("BodyT", bound=BaseModel)


async def _parse_body(request: Request, model: Type[BodyT], *, optional: bool = False) -> BodyT:
    """Decode (orjson) and validate the JSON body; invalid bodies become 422 errors.

    Decoding with orjson and validating Python objects is several times faster than pydantic's own JSON mode
    for spans, whose attribute values are a union of many types.

    Args:
        request: The request.
        model: Model of the body.
        optional: An empty body stands for ``model()``.
    """
    body = await request.body()
    if optional and not body.strip():
        return model()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        invalid = {"type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {exc}", "input": None}
        raise RequestValidationError([invalid], body=body) from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [
            {**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False, include_context=False)
        ]
        raise RequestValidationError(errors, body=data) from exc


def _normalize_origins(origins: Union[Sequence[str], str, None]) -> List[str]:
    if origins is None:
        return []
    values = [origins] if isinstance(origins, str) else list(origins)
    cleaned = [o.strip() for o in values if o and o.strip()]
    return ["*"] if "*" in cleaned else cleaned


class LightningStoreServer(LightningStore):
    """Serve a :class:`LightningStore` over HTTP, and act as that store in the creating process.

    In the process that created it, calling a store method on the server calls the wrapped store directly; in
    other processes (after pickling) calls go over HTTP through a :class:`LightningStoreClient`.

    Args:
        store: The store to serve; must be async-safe.
        host: Interface to bind (default ``127.0.0.1``).
        port: Port (default 4747).
        cors_allow_origins: Origins allowed by CORS (``"*"`` for any); ``None`` disables CORS.
        launch_mode: ``"thread"`` (default), ``"asyncio"`` or ``"mp"`` (the store must be zero-copy).
        launcher_args: Full launcher options; exclusive with ``host``, ``port`` and ``launch_mode``.
        n_workers: Server processes (``mp`` mode).
        tracker: Metrics backend recording HTTP metrics (and exposing Prometheus when it supports it).
        api_key: Bearer token required on every route except health checks; defaults to ``$AGENTBOLT_API_KEY``.
        max_request_bytes: Largest accepted request body; larger ones get 413.
        server_id: Identity of this server (default: a random one), reported by the health routes. Requests
            carrying another id in the :data:`STORE_ID_HEADER` header are refused with 409, so a client started for
            one store never works for another store that took over its address.

    Raises:
        ValueError: Conflicting launcher options, or a store lacking the needed capabilities.
    """

    def __init__(
        self,
        store: LightningStore,
        host: Optional[str] = None,
        port: Optional[int] = None,
        cors_allow_origins: Union[Sequence[str], str, None] = None,
        launch_mode: LaunchMode = "thread",
        launcher_args: Optional[PythonServerLauncherArgs] = None,
        n_workers: int = 1,
        tracker: Optional[MetricsBackend] = None,
        *,
        api_key: Optional[str] = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        server_id: Optional[str] = None,
    ) -> None:
        if launcher_args is not None:
            if host is not None or port is not None or launch_mode != "thread":
                raise ValueError("launcher_args cannot be combined with host, port or launch_mode.")
        else:
            if port is None:
                server_logger.warning("No port given for the store server; using %d.", DEFAULT_PORT)
                port = DEFAULT_PORT
            launcher_args = PythonServerLauncherArgs(
                host=host,
                port=port,
                launch_mode=launch_mode,
                healthcheck_url=API_V1_AGL_PREFIX + "/health",
                n_workers=n_workers,
            )
        if max_request_bytes <= 0:
            raise ValueError("max_request_bytes must be positive")
        capabilities = store.capabilities
        if not capabilities.get("async_safe", False):
            raise ValueError("The store is not async-safe; wrap it (e.g. LightningStoreThreaded) before serving it.")
        if launcher_args.launch_mode == "mp" and not capabilities.get("zero_copy", False):
            raise ValueError(
                "The store does not support zero-copy. Serving it from other processes (launch_mode='mp') "
                "would give each process its own copy; use launch_mode='thread' or 'asyncio'."
            )
        # A store that is not thread-safe, served from the server thread, is only ever used from that thread's
        # event loop: calls made in the creating thread are handed over to it.
        self._single_loop = launcher_args.launch_mode == "thread" and not capabilities.get("thread_safe", False)
        self.store: Optional[LightningStore] = store
        self.launcher_args = launcher_args
        self.tracker = tracker
        self._api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV_VAR) or None)
        self._max_request_bytes = max_request_bytes
        self._cors_origins = _normalize_origins(cors_allow_origins)
        self._owner_pid = os.getpid()
        self.server_id = server_id or uuid.uuid4().hex
        self._zero_copy = bool(capabilities.get("zero_copy", False))
        self._client: Optional[LightningStoreClient] = None
        self.app: Optional[FastAPI] = self._build_app()
        self.server_launcher: Optional[PythonServerLauncher] = PythonServerLauncher(self.app, launcher_args)
        self._endpoint = self.server_launcher.access_endpoint

    # -- pickling / lifecycle -----------------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        return {
            "launcher_args": self.launcher_args,
            "_owner_pid": self._owner_pid,
            "_endpoint": self._endpoint,
            "_api_key": self._api_key,
            "_zero_copy": self._zero_copy,
            "server_id": self.server_id,
        }

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.store = None
        self.app = None
        self.server_launcher = None
        self.tracker = None
        self._single_loop = False
        self._client = None
        self._cors_origins = []
        self._max_request_bytes = DEFAULT_MAX_REQUEST_BYTES

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """All capabilities: the server serializes access and accepts OTLP traces."""
        return LightningStoreCapabilities(thread_safe=True, async_safe=True, zero_copy=True, otlp_traces=True)

    @property
    def endpoint(self) -> str:
        """Base URL of the server, e.g. ``http://127.0.0.1:4747``."""
        return self._endpoint

    def otlp_traces_endpoint(self) -> str:
        """OTLP/HTTP traces URL of this server."""
        return f"{self._endpoint}/v1/traces"

    def _require_launcher(self) -> PythonServerLauncher:
        if self.server_launcher is None:
            raise RuntimeError("This server object was unpickled; only the creating process can start or stop it.")
        return self.server_launcher

    async def start(self) -> None:
        """Start serving (returns once healthy).

        Raises:
            RuntimeError: The server could not start (e.g. port in use).
        """
        await self._require_launcher().start()

    async def run_forever(self) -> None:
        """Serve until cancelled or stopped."""
        await self._require_launcher().run_forever()

    async def stop(self) -> None:
        """Stop serving; in-flight requests finish first. On an unpickled copy, only its HTTP client is closed."""
        if self.server_launcher is not None:
            await self.server_launcher.stop()
        if self._client is not None:
            await self._client.close()

    def is_running(self) -> bool:
        """Whether the server is serving."""
        return self.server_launcher is not None and self.server_launcher.is_running()

    # -- store access -------------------------------------------------------------------------------------------

    async def _call_store(self, method_name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped store from the serving event loop."""
        assert self.store is not None
        return await getattr(self.store, method_name)(*args, **kwargs)

    async def _delegate(self, method_name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Public store API: the wrapped store when available in this process, otherwise HTTP."""
        if self.store is not None and (self._zero_copy or os.getpid() == self._owner_pid):
            loop = self.server_launcher.serving_loop if self._single_loop and self.server_launcher else None
            if loop is not None and loop is not asyncio.get_running_loop() and loop.is_running():
                future = asyncio.run_coroutine_threadsafe(self._call_store(method_name, *args, **kwargs), loop)
                return await asyncio.wrap_future(future)
            return await self._call_store(method_name, *args, **kwargs)
        if self._client is None:
            self._client = LightningStoreClient(
                self._endpoint, api_key=self._api_key, expected_server_id=self.server_id
            )
        return await getattr(self._client, method_name)(*args, **kwargs)

    # -- app ----------------------------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = _new_app(title="LightningStore Server", version="0.3.1")
        # Routes are added to the app's own router (not an included one): requests are then matched in a
        # single pass over the routes, which matters at thousands of requests per second.
        app.router.route_class = _StoreRoute
        app.add_exception_handler(HTTPException, _http_exception_response)  # type: ignore[arg-type]
        app.add_exception_handler(RequestValidationError, _validation_error_response)  # type: ignore[arg-type]
        self._add_routes(_PrefixedRoutes(app, API_V1_AGL_PREFIX, _install_body_docs(app)))
        self._add_otlp_routes(app)

        @app.get("/health", include_in_schema=False)
        async def root_health() -> Response:
            return _json_response({"status": "ok", "server_id": self.server_id})

        if self.tracker is not None:
            self._setup_metrics(app, self.tracker)
        # Metrics and dashboard routes, then the dashboard app answering every other path outside /v1/ (last).
        install_dashboard(app, self._call_store)
        app.add_middleware(
            _GuardMiddleware,
            api_key=self._api_key,
            max_request_bytes=self._max_request_bytes,
            server_id=self.server_id,
        )
        if self._cors_origins:
            from starlette.middleware.cors import CORSMiddleware

            app.add_middleware(
                CORSMiddleware,
                allow_origins=self._cors_origins,
                allow_methods=["*"],
                allow_headers=["*"],
                allow_credentials=True,
                expose_headers=["*"],
            )
        return app

    def _setup_metrics(self, app: FastAPI, tracker: MetricsBackend) -> None:
        tracker.register_counter("agl.http.total", ["path", "method", "status"], group_level=2)
        tracker.register_histogram(
            "agl.http.latency", ["path", "method", "status"], buckets=LATENCY_BUCKETS, group_level=2
        )
        app.add_middleware(_MetricsMiddleware, tracker=tracker)
        if tracker.has_prometheus():
            from prometheus_client import make_asgi_app

            try:
                from agentbolt.utils.metrics import get_prometheus_registry

                registry = get_prometheus_registry()
            except ImportError:
                from prometheus_client import REGISTRY as registry
            app.mount(API_V1_PREFIX + "/prometheus", make_asgi_app(registry=registry))

    def _add_otlp_routes(self, app: FastAPI) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        from agentbolt.utils.otlp import handle_otlp_export, spans_from_proto

        async def ingest(message: Any) -> None:
            async def issue(pairs: Sequence[Tuple[str, str]]) -> Sequence[int]:
                return await self._call_store("get_many_span_sequence_ids", pairs)

            spans = await spans_from_proto(message, issue)
            if spans:
                await self._call_store("add_many_spans", spans)

        @app.post(API_V1_PREFIX + "/traces", tags=["otlp"])
        async def otlp_traces(request: Request) -> Response:
            """OTLP/HTTP protobuf trace export."""
            return await handle_otlp_export(
                request, ExportTraceServiceRequest, ExportTraceServiceResponse, ingest, "traces"
            )

        async def not_implemented(request: Request) -> Response:
            return _error_response(501, f"{request.url.path} is not supported by this server.", "NotImplemented", "")

        for path in ("/metrics", "/logs", "/development/profiles"):
            app.add_api_route(API_V1_PREFIX + path, not_implemented, methods=["POST"], include_in_schema=False)

    def _add_routes(self, r: _PrefixedRoutes) -> None:
        call = self._call_store

        async def query_page(
            method_name: str, query: _PaginationFields, model: Type[BaseModel], *args: Any
        ) -> Response:
            """Validate a list request, run the query method with the request's fields, answer one page."""
            _validate_pagination(query, model)
            fields = {name: getattr(query, name) for name in type(query).model_fields}
            return _json_response(_paginated(await call(method_name, *args, **fields), query.limit, query.offset))

        @r.get("/health")
        async def health() -> Response:
            return _json_response({"status": "ok", "server_id": self.server_id})

        # -- spans (first: the busiest routes are matched first)
        @r.post("/spans", body=Span, status_code=201)
        async def add_span(request: Request) -> Response:
            span = await _parse_body(request, Span)
            return _json_response(await call("add_span", span), 201)

        @r.post("/spans/batch", body=AddManySpansRequest, status_code=201, response_model=AddManySpansResponse)
        async def add_many_spans(request: Request) -> Response:
            batch = await _parse_body(request, AddManySpansRequest)
            inserted = await call("add_many_spans", batch.spans)
            positions = {(s.rollout_id, s.attempt_id, s.span_id): i for i, s in enumerate(batch.spans)}
            indices = [positions[(s.rollout_id, s.attempt_id, s.span_id)] for s in inserted]
            return _json_response({"inserted": indices}, 201)

        @r.post(
            "/spans/batch/sequenced",
            body=AddManySpansRequest,
            status_code=201,
            response_model=AddSequencedSpansResponse,
        )
        async def add_spans_with_new_sequence_ids(request: Request) -> Response:
            """Extension: issue sequence ids for the spans (replacing theirs) and store them, in one round trip."""
            batch = await _parse_body(request, AddManySpansRequest)
            inserted = await call("add_spans_with_new_sequence_ids", batch.spans)
            positions = {(s.rollout_id, s.attempt_id, s.span_id): i for i, s in enumerate(batch.spans)}
            indices = [positions[(s.rollout_id, s.attempt_id, s.span_id)] for s in inserted]
            return _json_response({"inserted": indices, "sequence_ids": [s.sequence_id for s in inserted]}, 201)

        async def query_spans(query: QuerySpansRequest) -> Response:
            return await query_page("query_spans", query, Span)

        @r.get("/spans")
        async def get_spans(query: Annotated[QuerySpansRequest, Query()]) -> Response:
            return await query_spans(query)

        @r.post("/spans/search", body=QuerySpansRequest)
        async def search_spans(request: Request) -> Response:
            return await query_spans(await _parse_body(request, QuerySpansRequest))

        @r.post("/spans/next", body=NextSequenceIdRequest, response_model=NextSequenceIdResponse)
        async def next_sequence_id(request: Request) -> Response:
            pair = await _parse_body(request, NextSequenceIdRequest)
            sequence_id = await call("get_next_span_sequence_id", pair.rollout_id, pair.attempt_id)
            return _json_response({"sequence_id": sequence_id})

        @r.post("/spans/next/batch", body=ManySequenceIdsRequest, response_model=ManySequenceIdsResponse)
        async def next_sequence_ids(request: Request) -> Response:
            pairs = await _parse_body(request, ManySequenceIdsRequest)
            ids = await call("get_many_span_sequence_ids", pairs.rollout_attempt_ids)
            return _json_response({"sequence_ids": list(ids)})

        @r.post("/waits/rollouts", body=WaitForRolloutsRequest)
        async def wait_for_rollouts(request: Request) -> Response:
            wait = await _parse_body(request, WaitForRolloutsRequest)
            result = await call("wait_for_rollouts", rollout_ids=wait.rollout_ids, timeout=wait.timeout)
            return _json_response(list(result))

        # -- queue
        @r.post("/queues/rollouts/enqueue", body=EnqueueManyRolloutsRequest, status_code=201)
        async def enqueue(request: Request) -> Response:
            rollouts = (await _parse_body(request, EnqueueManyRolloutsRequest)).rollouts
            if not rollouts:
                return _json_response([], 201)
            if len(rollouts) == 1:
                one = rollouts[0]
                rollout = await call("enqueue_rollout", one.input, one.mode, one.resources_id, one.config, one.metadata)
                return _json_response([rollout], 201)
            return _json_response(list(await call("enqueue_many_rollouts", rollouts)), 201)

        @r.post("/queues/rollouts/dequeue", body=DequeueManyRolloutsRequest, body_required=False)
        async def dequeue(request: Request) -> Response:
            options = await _parse_body(request, DequeueManyRolloutsRequest, optional=True)
            if options.limit <= 0:
                return _json_response([])
            if options.limit == 1:
                claimed = await call("dequeue_rollout", worker_id=options.worker_id)
                return _json_response([claimed] if claimed is not None else [])
            return _json_response(
                list(await call("dequeue_many_rollouts", limit=options.limit, worker_id=options.worker_id))
            )

        # -- rollouts
        @r.post("/rollouts", body=RolloutRequest, status_code=201)
        async def start_rollout(request: Request) -> Response:
            new = await _parse_body(request, RolloutRequest)
            result = await call(
                "start_rollout", new.input, new.mode, new.resources_id, new.config, new.metadata, new.worker_id
            )
            return _json_response(result, 201)

        async def query_rollouts(query: QueryRolloutsRequest) -> Response:
            return await query_page("query_rollouts", query, Rollout)

        @r.get("/rollouts")
        async def get_rollouts(query: Annotated[QueryRolloutsRequest, Query()]) -> Response:
            return await query_rollouts(query)

        @r.post("/rollouts/search", body=QueryRolloutsRequest, body_required=False)
        async def search_rollouts(request: Request) -> Response:
            return await query_rollouts(await _parse_body(request, QueryRolloutsRequest, optional=True))

        @r.get("/rollouts/{rollout_id}")
        async def get_rollout(rollout_id: str) -> Response:
            return _json_response(await call("get_rollout_by_id", rollout_id))

        @r.post("/rollouts/{rollout_id}", body=UpdateRolloutRequest)
        async def update_rollout(rollout_id: str, request: Request) -> Response:
            update = await _parse_body(request, UpdateRolloutRequest)
            _reject_nulls(update, ("status", "config"))
            fields = {name: getattr(update, name) for name in update.model_fields_set}
            return _json_response(await call("update_rollout", rollout_id, **fields))

        # -- attempts
        @r.post("/rollouts/{rollout_id}/attempts", body=StartAttemptRequest, body_required=False, status_code=201)
        async def start_attempt(rollout_id: str, request: Request) -> Response:
            options = await _parse_body(request, StartAttemptRequest, optional=True)
            return _json_response(await call("start_attempt", rollout_id, options.worker_id), 201)

        async def query_attempts(rollout_id: str, query: QueryAttemptsRequest) -> Response:
            return await query_page("query_attempts", query, Attempt, rollout_id)

        @r.get("/rollouts/{rollout_id}/attempts")
        async def get_attempts(rollout_id: str, query: Annotated[QueryAttemptsRequest, Query()]) -> Response:
            return await query_attempts(rollout_id, query)

        @r.post("/rollouts/{rollout_id}/attempts/search", body=QueryAttemptsRequest, body_required=False)
        async def search_attempts(rollout_id: str, request: Request) -> Response:
            return await query_attempts(rollout_id, await _parse_body(request, QueryAttemptsRequest, optional=True))

        @r.get("/rollouts/{rollout_id}/attempts/latest")
        async def latest_attempt(rollout_id: str) -> Response:
            return _json_response(await call("get_latest_attempt", rollout_id))

        @r.post("/rollouts/{rollout_id}/attempts/{attempt_id}", body=UpdateAttemptRequest)
        async def update_attempt(rollout_id: str, attempt_id: str, request: Request) -> Response:
            update = await _parse_body(request, UpdateAttemptRequest)
            _reject_nulls(update, ("status", "worker_id", "last_heartbeat_time"))
            fields = {name: getattr(update, name) for name in update.model_fields_set}
            return _json_response(await call("update_attempt", rollout_id, attempt_id, **fields))

        # -- workers
        async def query_workers(query: QueryWorkersRequest) -> Response:
            return await query_page("query_workers", query, Worker)

        @r.get("/workers")
        async def get_workers(query: Annotated[QueryWorkersRequest, Query()]) -> Response:
            return await query_workers(query)

        @r.post("/workers/search", body=QueryWorkersRequest, body_required=False)
        async def search_workers(request: Request) -> Response:
            return await query_workers(await _parse_body(request, QueryWorkersRequest, optional=True))

        @r.get("/workers/{worker_id}")
        async def get_worker(worker_id: str) -> Response:
            return _json_response(await call("get_worker_by_id", worker_id))

        @r.post("/workers/{worker_id}", body=UpdateWorkerRequest, body_required=False)
        async def update_worker(worker_id: str, request: Request) -> Response:
            update = await _parse_body(request, UpdateWorkerRequest, optional=True)
            if "heartbeat_stats" not in update.model_fields_set:
                return _json_response(await call("update_worker", worker_id))
            _reject_nulls(update, ("heartbeat_stats",))
            return _json_response(await call("update_worker", worker_id, update.heartbeat_stats))

        @r.get("/statistics")
        async def statistics() -> Response:
            return _json_response(dict(await call("statistics")))

        # -- resources
        @r.get("/resources")
        async def get_resources(query: Annotated[QueryResourcesRequest, Query()]) -> Response:
            return await query_page("query_resources", query, ResourcesUpdate)

        @r.post("/resources", body=NamedResourcesBody, status_code=201)
        async def add_resources(request: Request) -> Response:
            resources = (await _parse_body(request, NamedResourcesBody)).root
            return _json_response(await call("add_resources", resources), 201)

        @r.get("/resources/latest")
        async def latest_resources() -> Response:
            return _json_response(await call("get_latest_resources"))

        @r.post("/resources/{resources_id}", body=NamedResourcesBody)
        async def update_resources(resources_id: str, request: Request) -> Response:
            resources = (await _parse_body(request, NamedResourcesBody)).root
            return _json_response(await call("update_resources", resources_id, resources))

        @r.get("/resources/{resources_id}")
        async def get_resources_by_id(resources_id: str) -> Response:
            return _json_response(await call("get_resources_by_id", resources_id))


# Every other LightningStore method is the wrapped store's, reached as described in _delegate.
forward_store_api(LightningStoreServer, LightningStoreServer._delegate)


# ---------------------------------------------------------------------------------------------------------------
# Client


class LightningStoreHTTPError(aiohttp.ClientResponseError):
    """An error answered by a LightningStore server.

    Attributes:
        status: HTTP status code.
        message: The server's error message (``detail``).
        error_type: Name of the exception class raised on the server, when known.
    """

    def __init__(self, *args: Any, error_type: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_type = error_type


class LightningStoreValueError(LightningStoreHTTPError, ValueError):
    """The server rejected the request with a :class:`ValueError` (unknown id, invalid operation, bad input)."""


class LightningStoreTypeError(LightningStoreHTTPError, TypeError):
    """The server rejected the request with a :class:`TypeError`."""


class LightningStoreLookupError(LightningStoreHTTPError, LookupError):
    """The server could not find something the request refers to."""


class LightningStoreRuntimeError(LightningStoreHTTPError, RuntimeError):
    """The store could not perform the operation in its current state."""


class LightningStoreNotImplementedError(LightningStoreHTTPError, NotImplementedError):
    """The server does not implement the operation."""


_ERROR_CLASSES: Dict[str, Type[LightningStoreHTTPError]] = {
    "ValueError": LightningStoreValueError,
    "TypeError": LightningStoreTypeError,
    "KeyError": LightningStoreLookupError,
    "LookupError": LightningStoreLookupError,
    "RuntimeError": LightningStoreRuntimeError,
    "NotImplementedError": LightningStoreNotImplementedError,
}
_RETRYABLE_STATUSES = frozenset({408, 500, 502, 503, 504})
_AUTH_STATUSES = frozenset({401, 403})


def _error_class(status: int, error_kind: Optional[str]) -> Type[LightningStoreHTTPError]:
    if error_kind in _ERROR_CLASSES:
        return _ERROR_CLASSES[error_kind]
    if status in (400, 404, 409, 413, 422):
        return LightningStoreValueError
    if status == 501:
        return LightningStoreNotImplementedError
    return LightningStoreHTTPError


def _detail_message(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", ()))
                parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def _is_auth_error(exc: BaseException) -> bool:
    return isinstance(exc, aiohttp.ClientResponseError) and exc.status in _AUTH_STATUSES


class LightningStoreClient(LightningStore):
    """A :class:`LightningStore` living in a :class:`LightningStoreServer`, reached over HTTP.

    One aiohttp session (keep-alive connection pool) per event loop. Calls that fail on connection errors or
    server errors (5xx, 408) are retried after the delays in ``retry_delays`` as long as the server's health
    endpoint answers; calls that are not idempotent are retried only when the connection could not be opened.
    Errors answered by the server raise :class:`LightningStoreHTTPError` (an :class:`aiohttp.ClientResponseError`)
    carrying the server's message.

    Args:
        server_address: Base URL of the server, e.g. ``http://127.0.0.1:4747``.
        retry_delays: Seconds to wait before each retry.
        health_retry_delays: Delays between health probes after a failure (empty: do not probe).
        request_timeout: Total seconds allowed per request.
        connection_timeout: Seconds allowed to open a connection.
        api_key: Bearer token; defaults to ``$AGENTBOLT_API_KEY``.
        expected_server_id: The ``server_id`` of the server this client works for. When given, every request
            carries it and any other server refuses the request (409, ``StoreIdentityMismatch``) instead of serving
            it.
    """

    wait_slice_seconds: float = 10.0
    """Longest server-side wait of one ``wait_for_rollouts`` request."""

    def __init__(
        self,
        server_address: str,
        *,
        retry_delays: Sequence[float] = (1.0, 2.0, 5.0),
        health_retry_delays: Sequence[float] = (0.1, 0.2, 0.5),
        request_timeout: float = 30.0,
        connection_timeout: float = 5.0,
        api_key: Optional[str] = None,
        expected_server_id: Optional[str] = None,
    ) -> None:
        self.server_address_root = server_address.rstrip("/")
        self.server_address = self.server_address_root + API_V1_AGL_PREFIX
        self._retry_delays = tuple(retry_delays)
        self._health_retry_delays = tuple(health_retry_delays)
        self._request_timeout = request_timeout
        self._connection_timeout = connection_timeout
        self._api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV_VAR) or None)
        self.expected_server_id = expected_server_id
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )
        self._dequeue_succeeded = False
        self._dequeue_failure_logged = False

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_sessions"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sessions = weakref.WeakKeyDictionary()

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """All capabilities (the server provides them)."""
        return LightningStoreCapabilities(thread_safe=True, async_safe=True, zero_copy=True, otlp_traces=True)

    def otlp_traces_endpoint(self) -> str:
        """OTLP/HTTP traces URL of the server."""
        return f"{self.server_address_root}/v1/traces"

    # -- transport ----------------------------------------------------------------------------------------------

    def _headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if self.expected_server_id:
            headers[STORE_ID_HEADER] = self.expected_server_id
        return headers

    async def get_server_id(self) -> Optional[str]:
        """The ``server_id`` the server at this address reports (one health request, no retries).

        Returns:
            The id, or None when the server reports none (another kind of server).

        Raises:
            aiohttp.ClientError: Nothing answers at this address.
            LightningStoreHTTPError: The health route answered with an error.
        """
        data = await self._request_json("get", "/health", retry=False)
        server_id = data.get("server_id") if isinstance(data, dict) else None
        return server_id if isinstance(server_id, str) else None

    async def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            for stale in [other for other in self._sessions if other.is_closed()]:
                del self._sessions[stale]  # sessions of finished event loops cannot be used any more
            timeout = aiohttp.ClientTimeout(total=self._request_timeout, connect=self._connection_timeout)
            connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=15.0)
            session = aiohttp.ClientSession(timeout=timeout, connector=connector, headers=self._headers())
            self._sessions[loop] = session
        return session

    async def close(self) -> None:
        """Close the HTTP sessions this client opened, on every event loop that used it.

        A session belongs to the loop that created it: it is closed there when that loop still runs (e.g. the span
        writer's thread), and released without I/O when that loop is gone.
        """
        try:
            loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        sessions = list(self._sessions.items())
        self._sessions = weakref.WeakKeyDictionary()
        for session_loop, session in sessions:
            if session.closed:
                continue
            if session_loop is loop:
                await session.close()
            elif session_loop.is_running() and not session_loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(session.close(), session_loop)
                try:
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=5.0)
                except Exception as exc:  # the other loop is stopping or too busy; the process may be exiting
                    client_logger.debug("Could not close the session of another event loop: %r", exc)
            else:
                connector = session.connector
                session.detach()
                if connector is not None:
                    with contextlib.suppress(Exception):
                        connector.close()

    async def _send(
        self, method: str, path: str, body: Optional[bytes], params: Optional[Any], timeout: Optional[float]
    ) -> Any:
        session = await self._get_session()
        kwargs: Dict[str, Any] = {}
        if body is not None:
            kwargs["data"] = body
            kwargs["headers"] = {"Content-Type": "application/json"}
        if params is not None:
            kwargs["params"] = params
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout, connect=self._connection_timeout)
        async with session.request(method, self.server_address + path, **kwargs) as response:
            payload = await response.read()
            if response.status >= 400:
                raise self._error_from_response(response, payload)
            return orjson.loads(payload) if payload else None

    def _error_from_response(self, response: aiohttp.ClientResponse, payload: bytes) -> LightningStoreHTTPError:
        detail: Any = None
        error_type: Optional[str] = None
        error_kind: Optional[str] = None
        try:
            parsed = orjson.loads(payload)
            if isinstance(parsed, dict):
                detail = parsed.get("detail")
                error_type = parsed.get("error_type")
                error_kind = parsed.get("error_kind")
        except orjson.JSONDecodeError:
            detail = payload.decode("utf-8", "replace")[:500]
        message = _detail_message(detail) if detail is not None else (response.reason or f"HTTP {response.status}")
        cls = _error_class(response.status, error_kind)
        return cls(
            response.request_info,
            response.history,
            status=response.status,
            message=message,
            headers=response.headers,
            error_type=error_type,
        )

    async def _probe_health(self) -> bool:
        """Whether the server's health endpoint answers, probing once per health delay plus a final time."""
        if not self._health_retry_delays:
            return True
        session = await self._get_session()
        timeout = aiohttp.ClientTimeout(total=self._connection_timeout)
        for delay in (*self._health_retry_delays, None):
            try:
                async with session.get(self.server_address + "/health", timeout=timeout) as response:
                    if response.status == 200:
                        return True
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if delay is not None:
                await asyncio.sleep(delay)
        return False

    async def _request_json(
        self,
        method: Literal["get", "post"],
        path: str,
        *,
        json: Any = None,
        params: Optional[Any] = None,
        idempotent: bool = True,
        timeout: Optional[float] = None,
        retry: bool = True,
    ) -> Any:
        """Send a request and return the decoded JSON answer, retrying per the client's policy.

        Args:
            method: HTTP method.
            path: Path under ``/v1/agl``.
            json: Body; serialized with pydantic-core (models allowed). ``None`` sends no body.
            params: Query parameters.
            idempotent: Whether resending after an ambiguous failure is harmless.
            timeout: Total timeout override for this request.
            retry: Whether to retry at all.

        Raises:
            LightningStoreHTTPError: The server answered with an error.
            aiohttp.ClientError: The server could not be reached.
        """
        body = pydantic_core.to_json(json) if json is not None else None
        delays = self._retry_delays if retry else ()
        attempt = 0
        while True:
            try:
                return await self._send(method.upper(), path, body, params, timeout)
            except LightningStoreHTTPError as exc:
                if exc.status not in _RETRYABLE_STATUSES or attempt >= len(delays):
                    raise
                client_logger.warning("%s %s failed with %d: %s", method.upper(), path, exc.status, exc.message)
                failure: BaseException = exc
            except aiohttp.ClientConnectorError as exc:
                # The connection was never opened: resending cannot duplicate anything.
                if attempt >= len(delays):
                    raise
                client_logger.info("Cannot connect to %s (%s)", self.server_address_root, exc)
                failure = exc
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, asyncio.TimeoutError) as exc:
                if not idempotent or attempt >= len(delays):
                    raise
                client_logger.warning("%s %s failed: %r", method.upper(), path, exc)
                failure = exc
            if not await self._probe_health():
                client_logger.warning(
                    "Server %s is not healthy; giving up %s %s", self.server_address_root, method, path
                )
                raise failure
            await asyncio.sleep(delays[attempt])
            attempt += 1
            client_logger.info("Retrying %s %s (retry %d of %d)", method.upper(), path, attempt, len(delays))

    # -- LightningStore API -------------------------------------------------------------------------------------

    async def statistics(self) -> LightningStoreStatistics:
        """Statistics of the server's store."""
        return LightningStoreStatistics(**await self._request_json("get", "/statistics"))  # type: ignore[typeddict-item]

    async def _start_rollout(self, request: RolloutRequest) -> AttemptedRollout:
        data = await self._request_json("post", "/rollouts", json=request, idempotent=False)
        return AttemptedRollout.model_validate(data)

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        if not rollouts:
            return []
        data = await self._request_json(
            "post", "/queues/rollouts/enqueue", json={"rollouts": list(rollouts)}, idempotent=False
        )
        return [Rollout.model_validate(item) for item in data]

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        """See :meth:`LightningStore.dequeue_rollout`; failures (other than auth) yield ``None``."""
        claimed = await self.dequeue_many_rollouts(limit=1, worker_id=worker_id)
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: Optional[str] = None
    ) -> Sequence[AttemptedRollout]:
        """See :meth:`LightningStore.dequeue_many_rollouts`; never retried, failures (other than auth) yield ``[]``."""
        if limit <= 0:
            return []
        body: Dict[str, Any] = {"limit": limit}
        if worker_id is not None:
            body["worker_id"] = worker_id
        try:
            data = await self._request_json("post", "/queues/rollouts/dequeue", json=body, retry=False)
        except Exception as exc:
            if _is_auth_error(exc):
                raise
            if self._dequeue_succeeded and not self._dequeue_failure_logged:
                client_logger.warning("Dequeue from %s failed: %r", self.server_address_root, exc)
                self._dequeue_failure_logged = True
            else:
                client_logger.debug("Dequeue from %s failed: %r", self.server_address_root, exc)
            return []
        self._dequeue_succeeded = True
        return [AttemptedRollout.model_validate(item) for item in data]

    async def start_attempt(self, rollout_id: str, worker_id: Optional[str] = None) -> AttemptedRollout:
        body = {"worker_id": worker_id} if worker_id is not None else None
        data = await self._request_json("post", f"/rollouts/{rollout_id}/attempts", json=body, idempotent=False)
        return AttemptedRollout.model_validate(data)

    async def add_span(self, span: Span) -> Optional[Span]:
        data = await self._request_json("post", "/spans", json=span)
        return Span.model_validate(data) if data is not None else None

    async def add_many_spans(self, spans: Sequence[Span]) -> Sequence[Span]:
        """See :meth:`LightningStore.add_many_spans`; one request for the whole batch."""
        spans = list(spans)
        if not spans:
            return []
        data = await self._request_json("post", "/spans/batch", json={"spans": spans})
        return [spans[i] for i in data["inserted"]]

    async def add_spans_with_new_sequence_ids(self, spans: Sequence[Span]) -> Sequence[Span]:
        """See :meth:`LightningStore.add_spans_with_new_sequence_ids`; one request for the whole batch.

        Safe to resend: the store skips spans it already holds (same attempt and span id).
        """
        spans = list(spans)
        if not spans:
            return []
        data = await self._request_json("post", "/spans/batch/sequenced", json={"spans": spans})
        return [
            spans[i].model_copy(update={"sequence_id": sequence_id})
            for i, sequence_id in zip(data["inserted"], data["sequence_ids"], strict=True)
        ]

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: int | None = None
    ) -> Optional[Span]:
        if sequence_id is None:
            sequence_id = await self.get_next_span_sequence_id(rollout_id, attempt_id)
        span = Span.from_opentelemetry(readable_span, rollout_id, attempt_id, sequence_id)
        return await self.add_span(span)

    @staticmethod
    def _parse_rollout(item: Dict[str, Any]) -> Union[Rollout, AttemptedRollout]:
        if item.get("attempt") is not None:
            return AttemptedRollout.model_validate(item)
        return Rollout.model_validate(item)

    @staticmethod
    def _page(data: Dict[str, Any], parse: Callable[[Any], T]) -> PaginatedResult[T]:
        return PaginatedResult(
            items=[parse(item) for item in data["items"]],
            limit=data["limit"],
            offset=data["offset"],
            total=data["total"],
        )

    async def _query_rollouts(self, query: QueryRolloutsRequest) -> Sequence[Union[Rollout, AttemptedRollout]]:
        data = await self._request_json("post", "/rollouts/search", json=query.model_dump())
        return self._page(data, self._parse_rollout)

    async def _query_attempts(self, rollout_id: str, query: QueryAttemptsRequest) -> Sequence[Attempt]:
        data = await self._request_json("post", f"/rollouts/{rollout_id}/attempts/search", json=query.model_dump())
        return self._page(data, Attempt.model_validate)

    async def _get_optional(self, path: str, parse: Callable[[Any], T]) -> Optional[T]:
        """GET returning ``None`` for a ``null`` answer or (logged) failures other than auth errors."""
        try:
            data = await self._request_json("get", path)
        except Exception as exc:
            if _is_auth_error(exc):
                raise
            client_logger.error("GET %s failed: %r", path, exc)
            return None
        return parse(data) if data is not None else None

    async def get_rollout_by_id(self, rollout_id: str) -> Optional[Union[Rollout, AttemptedRollout]]:
        return await self._get_optional(f"/rollouts/{rollout_id}", self._parse_rollout)

    async def get_latest_attempt(self, rollout_id: str) -> Optional[Attempt]:
        return await self._get_optional(f"/rollouts/{rollout_id}/attempts/latest", Attempt.model_validate)

    async def _query_resources(self, query: QueryResourcesRequest) -> Sequence[ResourcesUpdate]:
        params = {key: str(value) for key, value in query.model_dump().items() if value is not None}
        data = await self._request_json("get", "/resources", params=params)
        return self._page(data, ResourcesUpdate.model_validate)

    async def get_resources_by_id(self, resources_id: str) -> Optional[ResourcesUpdate]:
        return await self._get_optional(f"/resources/{resources_id}", ResourcesUpdate.model_validate)

    async def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        return await self._get_optional("/resources/latest", ResourcesUpdate.model_validate)

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        data = await self._request_json(
            "post", "/spans/next", json={"rollout_id": rollout_id, "attempt_id": attempt_id}
        )
        return int(data["sequence_id"])

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[Tuple[str, str]]) -> Sequence[int]:
        """See :meth:`LightningStore.get_many_span_sequence_ids`; one request for all pairs."""
        pairs = [[rollout_id, attempt_id] for rollout_id, attempt_id in rollout_attempt_ids]
        if not pairs:
            return []
        data = await self._request_json("post", "/spans/next/batch", json={"rollout_attempt_ids": pairs})
        return [int(x) for x in data["sequence_ids"]]

    async def wait_for_rollouts(self, *, rollout_ids: List[str], timeout: Optional[float] = None) -> List[Rollout]:
        """See :meth:`LightningStore.wait_for_rollouts`.

        Long waits are split into server-side waits of at most 10 seconds each, so no single request outlives
        the request timeout.
        """
        slice_seconds = self.wait_slice_seconds
        deadline = None if timeout is None else time.monotonic() + timeout
        finished: Dict[str, Rollout] = {}
        pending = list(dict.fromkeys(rollout_ids))
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = slice_seconds if remaining is None else min(slice_seconds, remaining)
            started = time.monotonic()
            data = await self._request_json(
                "post",
                "/waits/rollouts",
                json={"rollout_ids": pending, "timeout": wait},
                timeout=wait + self._request_timeout,
            )
            for item in data:
                rollout = self._parse_rollout(item)
                finished[rollout.rollout_id] = rollout
            pending = [rid for rid in pending if rid not in finished]
            # A server-side wait that ends before its slice means every known rollout finished (unknown ids
            # are never waited for); only a slice that ran out calls for another one.
            returned_early = time.monotonic() - started < wait * 0.9
            if not pending or returned_early or (deadline is not None and time.monotonic() >= deadline):
                break
        return [finished[rid] for rid in rollout_ids if rid in finished]

    async def _query_spans(self, query: QuerySpansRequest) -> Sequence[Span]:
        data = await self._request_json("post", "/spans/search", json=query.model_dump())
        return self._page(data, Span.model_validate)

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        data = await self._request_json("post", "/resources", json=resources, idempotent=False)
        return ResourcesUpdate.model_validate(data)

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        data = await self._request_json("post", f"/resources/{resources_id}", json=resources, idempotent=False)
        return ResourcesUpdate.model_validate(data)

    async def _update_rollout(self, rollout_id: str, fields: Dict[str, Any]) -> Rollout:
        data = await self._request_json("post", f"/rollouts/{rollout_id}", json=fields)
        return self._parse_rollout(data)

    async def _update_attempt(self, rollout_id: str, attempt_id: str, fields: Dict[str, Any]) -> Attempt:
        data = await self._request_json("post", f"/rollouts/{rollout_id}/attempts/{attempt_id}", json=fields)
        return Attempt.model_validate(data)

    async def _query_workers(self, query: QueryWorkersRequest) -> Sequence[Worker]:
        data = await self._request_json("post", "/workers/search", json=query.model_dump())
        return self._page(data, Worker.model_validate)

    async def get_worker_by_id(self, worker_id: str) -> Optional[Worker]:
        return await self._get_optional(f"/workers/{worker_id}", Worker.model_validate)

    async def update_worker(self, worker_id: str, heartbeat_stats: Dict[str, Any] | Unset = UNSET) -> Worker:
        body = None if isinstance(heartbeat_stats, Unset) else {"heartbeat_stats": heartbeat_stats}
        data = await self._request_json("post", f"/workers/{worker_id}", json=body)
        return Worker.model_validate(data)

    async def add_metrics(self, records: Sequence[MetricsRecord]) -> Sequence[MetricsRecord]:
        if not records:
            return []
        body = {"records": [record.model_dump(mode="json") for record in records]}
        data = await self._request_json("post", "/metrics", json=body)
        return [MetricsRecord.model_validate(item) for item in data]

    async def query_metrics(
        self, *, run_id: Optional[str] = None, limit: int = -1, offset: int = 0
    ) -> PaginatedResult[MetricsRecord]:
        params: Dict[str, Any] = {"limit": limit, "offset": offset}
        if run_id is not None:
            params["run_id"] = run_id
        data = await self._request_json("get", "/metrics", params=params)
        return self._page(data, MetricsRecord.model_validate)
