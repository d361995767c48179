"""The store server: a FastAPI app serving any :class:`LightningStore` under ``/v1/agl``, and its launcher.

Routes come from the table in :mod:`agentbolt.store.http.routes`; this module turns each row into a handler that
validates the request, calls the store and encodes the answer. Bad input gets a 4xx JSON error and never reaches
the store; store exceptions are mapped by :func:`agentbolt.store.http.errors.status_for_exception`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import math
import os
import re
import types
import typing
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union
from urllib.parse import parse_qs, unquote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Mount, Route

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.store.base import LightningStore, LightningStoreCapabilities, forward_store_api
from agentbolt.store.collection.base import StorageUnavailableError
from agentbolt.store.collection_based import CollectionBasedLightningStore
from agentbolt.store.dashboard import install_dashboard
from agentbolt.store.http.errors import (
    NOT_APPLIED_HEADER,
    error_body,
    error_kind,
    exception_detail,
    status_for_exception,
)
from agentbolt.store.http.middleware import GuardMiddleware, MetricsMiddleware, body_timeout_error
from agentbolt.store.http.routes import (
    API_V1_AGL_PREFIX,
    API_V1_PREFIX,
    ROUTES,
    RawJson,
    StoreCall,
    StoreRoute,
    paginated_content,
)
from agentbolt.store.requests import _PaginationFields
from agentbolt.store.threading import LightningStoreThreaded
from agentbolt.store.utils import LATENCY_BUCKETS
from agentbolt.types.wire import decode_json, encode_json_repairing
from agentbolt.utils.checks import check_positive
from agentbolt.utils.request_limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, BodyTimeoutMiddleware
from agentbolt.utils.server_launcher import (
    LaunchMode,
    PythonServerLauncher,
    PythonServerLauncherArgs,
    on_shutdown_start,
)

if TYPE_CHECKING:
    from agentbolt.store.http.client import LightningStoreClient
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "LightningStoreServer",
    "DEFAULT_PORT",
    "DEFAULT_MAX_REQUEST_BYTES",
    "ServerShuttingDownError",
    "background_watchdog",
    "build_store_app",
]

logger = logging.getLogger("agentbolt.store.server")

DEFAULT_PORT = 4747


# ---------------------------------------------------------------------------------------------------------------
# Responses and errors


def _json_response(content: Any, status_code: int = 200) -> Response:
    body = content if isinstance(content, RawJson) else encode_json_repairing(content)
    return Response(content=body, status_code=status_code, media_type="application/json")


class ServerShuttingDownError(StorageUnavailableError):
    """A long wait ended early because the store server is shutting down (answered 503: waiting again is safe)."""


def _error_response(status_code: int, detail: Any, error_type: str, kind: str) -> Response:
    return Response(
        content=error_body(detail, error_type, kind), status_code=status_code, media_type="application/json"
    )


def _exception_response(exc: Exception) -> Response:
    status_code = status_for_exception(exc)
    if isinstance(exc, ServerShuttingDownError):
        logger.info("%s", exc)
    elif isinstance(exc, StorageUnavailableError):
        logger.warning("Store call failed, nothing applied: %s", exc)
    elif status_code >= 500:
        logger.exception("Store call failed")
    else:
        logger.debug("Store call rejected with %d: %s", status_code, exc)
    response = _error_response(status_code, exception_detail(exc), type(exc).__name__, error_kind(exc))
    if isinstance(exc, StorageUnavailableError):
        response.headers[NOT_APPLIED_HEADER] = "1"
        response.headers["Retry-After"] = "1"
    return response


async def _http_exception_response(request: Request, exc: HTTPException) -> Response:
    """Errors raised by the routes themselves (bad options, unknown paths) in the common error format."""
    response = _error_response(exc.status_code, exc.detail, "HTTPException", "ValueError")
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def _validation_error(exc: RequestValidationError) -> Response:
    """422 for malformed or mistyped input, in the common error format (``detail`` lists the problems)."""
    errors = [{key: error[key] for key in ("type", "loc", "msg") if key in error} for error in exc.errors()]
    return _error_response(422, errors, "RequestValidationError", "ValueError")


async def _validation_error_response(request: Request, exc: RequestValidationError) -> Response:
    return _validation_error(exc)


class _StoreRoute(APIRoute):
    """Route that turns exceptions raised by the store into JSON error responses."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (HTTPException, RequestValidationError):
                raise
            except ClientDisconnect:
                # The client left (or its body did not arrive in time) before the end of its body: nothing applied,
                # and nobody reads the answer.
                logger.debug("Client left %s %s before the end of its body", request.method, request.url.path)
                return _error_response(499, "The client closed the connection mid-request.", "ClientDisconnect", "")
            except Exception as exc:
                return _exception_response(exc)

        return guarded


def _bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


@functools.cache
def _unsortable_fields(model: Type[BaseModel]) -> frozenset[str]:
    """Fields of ``model`` declared as objects or lists, whose values have no order (a free-form value such as a task
    input is sorted when its values compare)."""
    scalars = (str, int, float, bool)
    unsortable = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        options = (
            [a for a in typing.get_args(annotation) if a is not type(None)] if _is_union(annotation) else [annotation]
        )
        if not all(
            a is Any or typing.get_origin(a) is typing.Literal or (isinstance(a, type) and issubclass(a, scalars))
            for a in options
        ):
            unsortable.add(name)
    return frozenset(unsortable)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _validate_pagination(request: _PaginationFields, model: Type[BaseModel]) -> None:
    """Reject bad sort/pagination options with 400."""
    if request.sort_by is not None and request.sort_by not in model.model_fields:
        allowed = ", ".join(model.model_fields)
        raise _bad_request(f"Invalid sort_by: {request.sort_by}, allowed fields are: {allowed}")
    if request.sort_by in _unsortable_fields(model):
        raise _bad_request(f"Invalid sort_by: {request.sort_by} holds objects or lists, which have no order")
    if request.sort_order not in ("asc", "desc"):
        raise _bad_request(f"Invalid sort_order: {request.sort_order}, must be 'asc' or 'desc'")
    if request.limit == 0 or request.limit < -1:
        raise _bad_request("Limit must be greater than 0 or -1 for no limit")
    if request.offset < 0:
        raise _bad_request("Offset must be greater than or equal to 0")
    if request.limit >= 2**63 or request.offset >= 2**63:
        raise _bad_request("Limit and offset must be below 2**63")
    filter_logic = getattr(request, "filter_logic", "and")
    if filter_logic not in ("and", "or"):
        raise _bad_request(f"Invalid filter_logic: {filter_logic}, must be 'and' or 'or'")


def _reject_nulls(request: BaseModel, fields: Sequence[str]) -> None:
    for field in fields:
        if field in request.model_fields_set and getattr(request, field) is None:
            raise _bad_request(f"{field} is invalid; it cannot be a null value.")


# ---------------------------------------------------------------------------------------------------------------
# The app


def _new_app(**kwargs: Any) -> FastAPI:
    """A FastAPI app without FastAPI's own OpenTelemetry instrumentation (where the installed version has it).

    The store must not trace its own requests: in a process whose tracer exports spans to this very store, that
    would feed the store with spans about storing spans.
    """
    try:
        return FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False}, **kwargs)
    except TypeError:  # FastAPI versions without built-in telemetry
        return FastAPI(**kwargs)


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

ANSWER_NESTING = 8
"""Levels an answer may add above a value the request carried (a page of rollouts puts each input three down):
bodies nested deeper than the JSON parser reads minus these are refused, so that every answer stays readable."""


def _parse_body(body: bytes, model: Type[BodyT], *, optional: bool = False) -> BodyT:
    """Decode (orjson) and validate a JSON body; invalid bodies become 422 errors.

    Decoding with orjson and validating Python objects is several times faster than pydantic's own JSON mode
    for spans, whose attribute values are a union of many types.

    Args:
        body: The raw body.
        model: Model of the body.
        optional: An empty body stands for ``model()``.
    """
    if optional and not body.strip():
        return model()
    try:
        data = decode_json(body, headroom=ANSWER_NESTING)
    except ValueError as exc:
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


def _query_fields(query_string: bytes, model: Type[BaseModel]) -> Dict[str, Any]:
    """The query parameters as fields of ``model`` (list fields from repeated keys)."""
    params = parse_qs(query_string.decode("latin-1"), keep_blank_values=True)
    fields: Dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if name not in params:
            continue
        annotation = str(info.annotation)
        fields[name] = params[name] if "List[" in annotation or "list[" in annotation else params[name][-1]
    return fields


def _parse_query(query_string: bytes, model: Type[BodyT]) -> BodyT:
    """Validate the query parameters with ``model``; invalid ones become 422 errors."""
    try:
        return model.model_validate(_query_fields(query_string, model))
    except ValidationError as exc:
        errors = [
            {**error, "loc": ("query", *error["loc"])} for error in exc.errors(include_url=False, include_context=False)
        ]
        raise RequestValidationError(errors) from exc


def _is_json_media_type(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


def _check_content_type(content_type: Optional[str], body: bytes) -> None:
    """Refuse a body declared as something else than JSON (415).

    A body without a ``Content-Type`` is read as JSON, as the reference does. One declared as text or a form is
    refused: those are the types a web page may send to any address without the browser asking the server first,
    so accepting them would let any page a user opens write to a store on the user's machine.
    """
    if content_type is not None and body.strip() and not _is_json_media_type(content_type):
        raise HTTPException(
            status_code=415,
            detail=f"Unsupported Content-Type {content_type!r}: the body must be JSON sent as application/json",
        )


def _route_body(
    route: StoreRoute, get_form: bool, body: bytes, query_string: bytes, content_type: Optional[str] = None
) -> Optional[BaseModel]:
    """The validated body (or query) of a request to ``route``."""
    if route.body is None:
        return None
    if get_form or route.verb == "GET":
        parsed: BaseModel = _parse_query(query_string, route.body)
    else:
        _check_content_type(content_type, body)
        parsed = _parse_body(body, route.body, optional=route.body_optional)
    if route.page_of is not None:
        _validate_pagination(parsed, route.page_of)  # type: ignore[arg-type]
    if route.not_null:
        _reject_nulls(parsed, route.not_null)
    return parsed


async def _answer(
    route: StoreRoute,
    call: StoreCall,
    get_form: bool,
    path_values: Dict[str, str],
    body: bytes,
    query_string: bytes,
    content_type: Optional[str] = None,
) -> Response:
    """Serve one request to ``route``: validate, call the store, encode the answer (errors included)."""
    try:
        parsed = _route_body(route, get_form, body, query_string, content_type)
        if route.serve is not None:
            content = await route.serve(call, path_values, parsed)
        else:
            content = await call(route.store_method, **path_values, **route.arguments(parsed))
            if route.page_of is not None:
                assert isinstance(parsed, _PaginationFields)
                content = paginated_content(content, parsed.limit, parsed.offset)
        return _json_response(content, route.status)
    except HTTPException as exc:
        return _error_response(exc.status_code, exc.detail, "HTTPException", "ValueError")
    except RequestValidationError as exc:
        return _validation_error(exc)
    except Exception as exc:
        return _exception_response(exc)


def _route_endpoint(route: StoreRoute, call: StoreCall, get_form: bool) -> Callable[[Request], Any]:
    """The FastAPI endpoint of a route (documented in OpenAPI; requests normally take the dispatcher's path)."""

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        query_string = request.scope["query_string"]
        content_type = request.headers.get("content-type")
        return await _answer(route, call, get_form, request.path_params, body, query_string, content_type)

    endpoint.__name__ = route.store_method
    endpoint.__doc__ = f"``{route.store_method}`` of the served store."
    return endpoint


def _route_forms(routes: Sequence[StoreRoute]) -> List[Tuple[StoreRoute, str, str, bool]]:
    """``(route, verb, path, get_form)`` of every route and GET form, literal segments before parameters (so
    ``/rollouts/search`` and ``.../attempts/latest`` win over ids)."""
    forms: List[Tuple[StoreRoute, str, str, bool]] = []
    for route in routes:
        forms.append((route, route.verb, route.path, False))
        if route.get_path is not None:
            forms.append((route, "GET", route.get_path, True))
    forms.sort(key=lambda form: form[2].count("{"))  # stable: the table's order within equal counts
    return forms


class _StoreDispatcher:
    """ASGI middleware answering the store routes directly, before FastAPI's router.

    Matching a request costs one dictionary lookup (literal paths) or a few regular expressions (paths with ids), and
    the handler receives the raw body: FastAPI's routing and dependency machinery, which cost more CPU than the store
    call itself for small requests, is skipped. Anything else (documentation, OTLP, mounts, unknown paths) goes on
    to the FastAPI app, whose copies of the same routes serve the OpenAPI document.
    """

    def __init__(self, app: Any, call: StoreCall) -> None:
        self.app = app
        self.call = call
        self.literal: Dict[Tuple[str, str], Tuple[StoreRoute, bool]] = {}
        self.patterns: List[Tuple[str, re.Pattern[str], StoreRoute, bool]] = []
        for route, verb, path, get_form in _route_forms(ROUTES):
            full = API_V1_AGL_PREFIX + path
            if "{" not in path:
                self.literal.setdefault((verb, full), (route, get_form))
            else:
                pattern = re.compile(
                    "^" + re.sub(r"{(\w+)}", r"(?P<\1>[^/]+)", full) + "$"
                )  # paths hold no metacharacters
                self.patterns.append((verb, pattern, route, get_form))

    def _match(self, method: str, path: str) -> Optional[Tuple[StoreRoute, bool, Dict[str, str]]]:
        found = self.literal.get((method, path))
        if found is not None:
            return found[0], found[1], {}
        for verb, pattern, route, get_form in self.patterns:
            if verb == method:
                match = pattern.match(path)
                if match is not None:
                    return route, get_form, match.groupdict()
        return None

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Matched on the path as sent, so that an id holding an escaped "/" (``%2F``) stays one path segment.
        raw_path = scope.get("raw_path")
        path = raw_path.decode("utf-8", "replace") if raw_path else scope["path"]
        matched = self._match(scope["method"], path)
        if matched is None:
            await self.app(scope, receive, send)
            return
        route, get_form, escaped_values = matched
        path_values = {name: unquote(value) for name, value in escaped_values.items()}
        chunks: List[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        content_type = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-type"), None)
        body = b"".join(chunks)
        answering = _answer(route, self.call, get_form, path_values, body, scope["query_string"], content_type)
        if route.path.startswith("/waits/"):
            response = await _unless_disconnected(answering, receive)
            if response is None:
                return  # the client went away: its wait was cancelled, no one reads an answer
        else:
            response = await answering
        await response(scope, receive, send)


async def _unless_disconnected(answering: Coroutine[Any, Any, Response], receive: Any) -> Optional[Response]:
    """Await ``answering``, cancelled if the client disconnects first (a wait would otherwise run to its deadline,
    and a client retrying after its own timeout would leave one running wait behind each try)."""
    answer = asyncio.ensure_future(answering)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((answer, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not answer.done():
            answer.cancel()
    return answer.result() if answer.done() and not answer.cancelled() else None


def _add_store_routes(app: FastAPI, call: StoreCall, body_models: Dict[str, Type[BaseModel]]) -> None:
    """Register every row of the route table on the FastAPI app (for its OpenAPI document and as a fallback)."""
    forms = _route_forms(ROUTES)
    for route, verb, path, get_form in forms:
        extra: Dict[str, Any] = {}
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in route.path_params
        ]
        if route.body is not None and verb == "POST":
            body_models[route.body.__name__] = route.body
            schema = {"$ref": f"#/components/schemas/{route.body.__name__}"}
            extra["requestBody"] = {
                "required": not route.body_optional,
                "content": {"application/json": {"schema": schema}},
            }
        elif route.body is not None:
            parameters += [{"name": name, "in": "query", "required": False} for name in route.body.model_fields]
        if parameters:
            extra["parameters"] = parameters
        app.add_api_route(
            API_V1_AGL_PREFIX + path,
            _route_endpoint(route, call, get_form),
            methods=[verb],
            status_code=route.status,
            openapi_extra=extra or None,
            name=f"{route.store_method}{'_get' if get_form else ''}",
        )


class _LongWaits:
    """The store's long waits in flight, and how they end when the server begins to shut down.

    A wait that ends within the shutdown's grace period is left to answer as usual. A longer one (minutes, or no
    timeout) would hold the shutdown until the grace period ran out and then be cancelled with a 500; it is ended at
    once instead, with a 503 (nothing was applied). The client retries ``wait_for_rollouts`` as any idempotent
    call, so a server restarted on the same address within its retries picks the wait up again; a runner whose
    ``wait_for_queued_rollouts`` fails polls again.
    """

    METHODS = frozenset({"wait_for_rollouts", "wait_for_queued_rollouts"})
    ANSWER_MARGIN_SECONDS = 0.5
    """Time kept, at the end of the grace period, for a wait that ends by itself to send its answer."""

    def __init__(self) -> None:
        self._deadlines: Dict[asyncio.Task[Any], float] = {}
        self._ended: set[asyncio.Task[Any]] = set()

    def end_long_ones(self, grace_seconds: float) -> None:
        """Cancel the waits in flight that would not end within ``grace_seconds`` (on the serving loop)."""
        cutoff = asyncio.get_running_loop().time() + grace_seconds - self.ANSWER_MARGIN_SECONDS
        for task, deadline in list(self._deadlines.items()):
            if deadline > cutoff and task not in self._ended:
                self._ended.add(task)
                task.cancel()

    def guard(self, call: StoreCall) -> StoreCall:
        """``call``, with the long waits made endable by :meth:`end_long_ones`."""

        async def guarded(method_name: str, /, *args: Any, **kwargs: Any) -> Any:
            if method_name not in self.METHODS:
                return await call(method_name, *args, **kwargs)
            task = asyncio.current_task()
            assert task is not None
            timeout = kwargs.get("timeout")
            self._deadlines[task] = math.inf if timeout is None else asyncio.get_running_loop().time() + timeout
            try:
                return await call(method_name, *args, **kwargs)
            except asyncio.CancelledError:
                if task not in self._ended:
                    raise
                if hasattr(task, "uncancel"):  # Python 3.11+: the request goes on to answer
                    task.uncancel()
                raise ServerShuttingDownError(
                    f"The store server is shutting down: {method_name} ended early; waiting again is safe"
                ) from None
            finally:
                self._deadlines.pop(task, None)
                self._ended.discard(task)

        return guarded


def build_store_app(
    call: StoreCall,
    *,
    server_id: str,
    api_key: Optional[str] = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    cors_origins: Sequence[str] = (),
    tracker: Optional[MetricsBackend] = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
) -> FastAPI:
    """The store's FastAPI app; ``call(method_name, *args, **kwargs)`` runs each store call.

    Args:
        call: Runs one store call (the server's wrapped store).
        server_id: Identity reported by the health routes and checked against the client's expectation.
        api_key: Bearer token required on every route except health checks.
        max_request_bytes: Largest accepted request body.
        cors_origins: Allowed CORS origins (``["*"]`` for any; empty disables CORS).
        tracker: Metrics backend (HTTP metrics middleware and, when it supports it, the Prometheus mount).
        body_timeout: Seconds a request body may take to arrive after its headers; a client that misses it gets a
            408 (nothing applied) and its connection is closed.
    """
    check_positive(body_timeout, "body_timeout")
    app = _new_app(title="LightningStore Server", version="0.3.1")
    long_waits = _LongWaits()
    on_shutdown_start(app, long_waits.end_long_ones)
    call = long_waits.guard(call)
    # Routes are added to the app's own router (not an included one): requests are then matched in a single pass
    # over the routes, which matters at thousands of requests per second.
    app.router.route_class = _StoreRoute
    app.add_exception_handler(HTTPException, _http_exception_response)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error_response)  # type: ignore[arg-type]

    async def health() -> Response:
        return _json_response({"status": "ok", "server_id": server_id})

    app.add_api_route(API_V1_AGL_PREFIX + "/health", health, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"], include_in_schema=False)
    _add_store_routes(app, call, _install_body_docs(app))
    _add_otlp_routes(app, call)
    # The Prometheus mount, then the dashboard's routes, whose app answers every other path (last).
    if tracker is not None and tracker.has_prometheus():
        _mount_prometheus(app)
    install_dashboard(app, call)
    app.add_middleware(_StoreDispatcher, call=call)
    app.add_middleware(GuardMiddleware, api_key=api_key, max_request_bytes=max_request_bytes, server_id=server_id)
    # Outside the guard, which reads chunked bodies itself.
    app.add_middleware(
        BodyTimeoutMiddleware,
        timeout=body_timeout,
        error_body=body_timeout_error,
        extra_headers=[(NOT_APPLIED_HEADER.encode(), b"1")],
    )
    if tracker is not None:
        # Outside the guard and the body deadline: a request is counted with the status its client gets (the 408 of
        # a body that did not arrive in time, not the disconnect the layers within see; the guard's refusals too).
        _install_metrics(app, tracker)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials=True,
            expose_headers=["*"],
        )
    return app


def _install_metrics(app: FastAPI, tracker: MetricsBackend) -> None:
    """HTTP metrics: ``agl.http.*`` per templated path, method and status, counted by a middleware outside every
    route (the store dispatcher included), the guard and the body deadline."""
    tracker.register_counter("agl.http.total", ["path", "method", "status"], group_level=2)
    tracker.register_histogram("agl.http.latency", ["path", "method", "status"], buckets=LATENCY_BUCKETS, group_level=2)
    # Labels come from the routes registered so far (all of them: this runs last), never from the request alone.
    route_paths = [route.path for route in app.routes if isinstance(route, Route) and ":" not in route.path]
    mount_paths = [route.path for route in app.routes if isinstance(route, Mount)]
    app.add_middleware(MetricsMiddleware, tracker=tracker, route_paths=route_paths, mount_paths=mount_paths)


def _mount_prometheus(app: FastAPI) -> None:
    """The Prometheus exposition at ``/v1/prometheus``; mounted before the dashboard's catch-all route."""
    from prometheus_client import make_asgi_app

    try:
        from agentbolt.utils.metrics import get_prometheus_registry

        registry = get_prometheus_registry()
    except ImportError:
        from prometheus_client import REGISTRY as registry
    from starlette.responses import RedirectResponse

    path = API_V1_PREFIX + "/prometheus"
    app.add_api_route(path, lambda: RedirectResponse(path + "/"), include_in_schema=False)  # the mount needs the slash
    app.mount(path, make_asgi_app(registry=registry))


def _add_otlp_routes(app: FastAPI, call: StoreCall) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    from agentbolt.utils.otlp import handle_otlp_export, spans_and_unnumbered_from_proto

    async def ingest(message: Any) -> None:
        spans, missing = spans_and_unnumbered_from_proto(message)
        unnumbered = set(missing)
        numbered = [span for index, span in enumerate(spans) if index not in unnumbered]
        if numbered:
            await call("add_many_spans", numbered)
        if missing:
            # Issued and stored in one store call: two exports arriving together (a retry beside its first try)
            # cannot interleave their ids and their insertions.
            await call("add_spans_with_new_sequence_ids", [spans[index] for index in missing])

    async def otlp_traces(request: Request) -> Response:
        """OTLP/HTTP protobuf trace export."""
        return await handle_otlp_export(
            request, ExportTraceServiceRequest, ExportTraceServiceResponse, ingest, "traces"
        )

    app.add_api_route(API_V1_PREFIX + "/traces", otlp_traces, methods=["POST"], tags=["otlp"])

    async def not_implemented(request: Request) -> Response:
        return _error_response(501, f"{request.url.path} is not supported by this server.", "NotImplemented", "")

    for path in ("/metrics", "/logs", "/development/profiles"):
        app.add_api_route(API_V1_PREFIX + path, not_implemented, methods=["POST"], include_in_schema=False)


# ---------------------------------------------------------------------------------------------------------------
# The background watchdog


@contextlib.asynccontextmanager
async def background_watchdog(store: Optional[LightningStore]) -> AsyncIterator[None]:
    """Within the block, run ``store``'s watchdog in the background every
    :attr:`~agentbolt.store.collection_based.CollectionBasedLightningStore.watchdog_period`, so that rollouts time
    out while no request comes in; several server processes sharing the storage scan once per period among them.

    A failed scan is logged and the next period scans again. Nothing runs for a store without a watchdog (not
    collection-based, directly or inside a :class:`~agentbolt.store.threading.LightningStoreThreaded`) or a read-only
    one. The background task ends with the block.
    """
    watched = store.store if isinstance(store, LightningStoreThreaded) else store
    if not isinstance(watched, CollectionBasedLightningStore) or getattr(watched, "read_only", False):
        yield
        return
    task = asyncio.ensure_future(_watch(store, watched.watchdog_period))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _watch(store: Union[CollectionBasedLightningStore[Any], LightningStoreThreaded], period: float) -> None:
    while True:
        await asyncio.sleep(period)
        try:
            await store.run_watchdog()
        except Exception:
            logger.exception("The store's background watchdog scan failed; it runs again in %g seconds.", period)


# ---------------------------------------------------------------------------------------------------------------
# The server object

_PROCESS_LOCAL: Dict[str, Any] = {
    "store": None,
    "app": None,
    "server_launcher": None,
    "tracker": None,
    "_single_loop": False,
    "_client": None,
    "_cors_origins": [],
    "_max_request_bytes": DEFAULT_MAX_REQUEST_BYTES,
    "_body_timeout": DEFAULT_BODY_TIMEOUT,
}
"""Attributes of a :class:`LightningStoreServer` that stay with the creating process, each with the value a pickled
copy holds instead."""


class LightningStoreServer(LightningStore):
    """Serve a :class:`LightningStore` over HTTP, and act as that store in the creating process.

    In the process that created it, calling a store method on the server calls the wrapped store directly; in
    other processes (after pickling) calls go over HTTP through a :class:`LightningStoreClient`. While it serves, the
    store's watchdog also runs in the background (:func:`background_watchdog`).

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
        body_timeout: Seconds a request body may take to arrive after its headers; a client that misses it gets a
            408 (nothing applied) and its connection is closed.
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
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
    ) -> None:
        if not isinstance(store, LightningStore):
            raise TypeError(f"store must be a LightningStore, got {type(store).__name__}")
        if launcher_args is not None:
            if host is not None or port is not None or launch_mode != "thread":
                raise ValueError("launcher_args cannot be combined with host, port or launch_mode.")
        else:
            if port is None:
                logger.warning("No port given for the store server; using %d.", DEFAULT_PORT)
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
        check_positive(body_timeout, "body_timeout")
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
        self._body_timeout = body_timeout
        self._cors_origins = _normalize_origins(cors_allow_origins)
        self._owner_pid = os.getpid()
        self.server_id = server_id or uuid.uuid4().hex
        self._zero_copy = bool(capabilities.get("zero_copy", False))
        self._client: Optional[LightningStoreClient] = None
        self.app: Optional[FastAPI] = self._build_app()
        self.server_launcher: Optional[PythonServerLauncher] = PythonServerLauncher(
            self.app, launcher_args, serve_context=self._serving
        )
        self._endpoint = self.server_launcher.access_endpoint

    # -- pickling / lifecycle -----------------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name not in _PROCESS_LOCAL}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state, **{name: copy.copy(value) for name, value in _PROCESS_LOCAL.items()})

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

    def _serving(self) -> contextlib.AbstractAsyncContextManager[None]:
        """What runs around serving, in each serving loop: the store's background watchdog."""
        return background_watchdog(self.store)

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
            from agentbolt.store.http.client import LightningStoreClient

            # Code that holds the server (an algorithm) may wait for rollouts as long as it likes.
            self._client = LightningStoreClient(
                self._endpoint, api_key=self._api_key, expected_server_id=self.server_id, long_waits=True
            )
        return await getattr(self._client, method_name)(*args, **kwargs)

    # -- app ----------------------------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        return build_store_app(
            _weakly_bound(self._call_store),
            server_id=self.server_id,
            api_key=self._api_key,
            max_request_bytes=self._max_request_bytes,
            cors_origins=self._cors_origins,
            tracker=self.tracker,
            body_timeout=self._body_timeout,
        )


def _weakly_bound(call_store: StoreCall) -> StoreCall:
    """``call_store`` (a server's bound method) without holding the server.

    FastAPI keeps route endpoints in a process-wide cache (of thousands of callables), so endpoints holding their
    server would keep every server built in the process alive, and with it its store, the store's threads and files.
    """
    method = weakref.WeakMethod(call_store)

    async def call(method_name: str, /, *args: Any, **kwargs: Any) -> Any:
        bound = method()
        if bound is None:
            raise RuntimeError("The store server that built this app was garbage-collected")
        return await bound(method_name, *args, **kwargs)

    return call


# Every other LightningStore method is the wrapped store's, reached as described in _delegate.
forward_store_api(LightningStoreServer, LightningStoreServer._delegate)
