"""HTTP plumbing both OpenAI-compatible servers share: reading and validating bodies, bearer tokens, error answers.

* :func:`read_body` caps the body size (413), :func:`parse_json_object` checks the content type (415), parses with
  orjson (invalid UTF-8, lone surrogate escapes and malformed JSON are 400) and refuses nesting deeper than
  :data:`MAX_JSON_DEPTH` and integers beyond 64 bits, which orjson would turn into floats (400), and :func:`validate_request` applies a schema of :mod:`agentbolt.openai_api.schema`
  (400 naming the field).
* :func:`unauthorized_response` is the OpenAI-style 401 that :class:`~agentbolt.utils.http_auth.BearerAuthMiddleware`
  (re-exported here with :func:`bearer_token_matches`) answers without the key.
* :func:`install_body_timeout` bounds the time a request body may take to arrive (408 beyond, see
  :mod:`agentbolt.utils.request_limits`).
* :func:`install_error_handlers` makes every error of a FastAPI app an OpenAI-style body: :class:`ApiError`,
  unknown routes (404), wrong methods (405), FastAPI's own validation errors (400) and unexpected exceptions (500).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Scope

from agentbolt.openai_api.errors import ApiError, error_body
from agentbolt.openai_api.schema import validation_message
from agentbolt.utils.checks import check_positive
from agentbolt.utils.http_auth import BearerAuthMiddleware, bearer_token_matches
from agentbolt.utils.request_limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_REQUEST_BYTES,
    BodyTimeoutMiddleware,
    ErrorBody,
)

__all__ = [
    "off_loop_if_large",
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_REQUEST_BYTES",
    "MAX_JSON_DEPTH",
    "BearerAuthMiddleware",
    "bearer_token_matches",
    "client_closed",
    "error_response",
    "body_timeout_error",
    "install_body_timeout",
    "install_error_handlers",
    "parse_json_object",
    "read_body",
    "unauthorized",
    "unauthorized_response",
    "validate_request",
]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


async def off_loop_if_large(size: int, inline_below: int, work: Callable[[], R]) -> R:
    """``work()`` on the event loop when ``size`` (bytes of the body it handles) is under ``inline_below``, else on a
    worker thread.

    Decoding, templating or tokenizing a body of many megabytes takes seconds; on the event loop it would hold up
    every other request for as long. Small bodies stay on the loop, where a thread hand-off costs more than the work.
    """
    if size < inline_below:
        return work()
    return await asyncio.to_thread(work)


MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a request body (tool schemas need a few levels, not hundreds)."""
_JSON = "application/json"


def error_response(error: ApiError, **extra: Any) -> Response:
    """The HTTP answer for ``error`` (``extra`` keys go into the ``error`` object)."""
    return Response(error.body(**extra), status_code=error.status, media_type=_JSON, headers=error.headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 once it exceeds ``limit`` bytes (checked before reading when announced)."""
    announced = request.headers.get("content-length")
    if announced is not None and announced.isdigit() and int(announced) > limit:
        raise _too_large(int(announced), limit)
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
    except ClientDisconnect:
        # A client that leaves mid-body is no server error: answered (to no one) without an error log and traceback.
        logger.info("Client disconnected from %s before sending its whole body", request.url.path)
        raise client_closed("the client closed the connection before sending the whole request body") from None
    return b"".join(chunks)


def client_closed(message: str) -> ApiError:
    """The 499 for a client that closed its connection before its answer (nobody reads it; never logged as an
    error)."""
    return ApiError(499, message, "client_closed")


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"Request body of {size} bytes or more is larger than the limit of {limit} bytes")


def _is_json(content_type: Optional[str]) -> bool:
    if not content_type:
        return True  # like FastAPI: a body without a content type is read as JSON
    media = content_type.split(";", 1)[0].strip().lower()
    return media == _JSON or (media.startswith("application/") and media.endswith("+json"))


def parse_json_object(raw: bytes, content_type: Optional[str]) -> Dict[str, Any]:
    """Parse a request body that must be a JSON object.

    Raises:
        ApiError: 415 for another content type, 400 for an empty body, invalid JSON (including invalid UTF-8 and
            lone surrogate escapes such as ``"\\ud800"``), a value that is not an object, nesting deeper than
            :data:`MAX_JSON_DEPTH`, or an integer outside 64 bits (orjson would read it as an inexact float, and
            a field passed through to a backend would silently change).
    """
    if not _is_json(content_type):
        raise ApiError(415, f"Content-Type must be application/json, got {content_type!r}")
    if not raw.strip():
        raise ApiError(400, "Request body is empty: send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    # Counting brackets runs in C; only bodies that could be that deep are walked.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _depth_exceeds(body, MAX_JSON_DEPTH):
        raise ApiError(400, f"Request body is nested more than {MAX_JSON_DEPTH} levels deep")
    if _LONG_DIGIT_RUN.search(raw):  # only then can a number be an integer orjson read as a float
        _check_integer_widths(raw)
    return body


_LONG_DIGIT_RUN = re.compile(rb"\d{19,}")
"""19 digits or more: the shortest integer literal beyond orjson's range [-2**63, 2**64 - 1] (-9223372036854775809)."""


def _check_integer_widths(raw: bytes) -> None:
    """Re-read a body (which orjson accepted, so nested at most :data:`MAX_JSON_DEPTH` levels and with no number
    beyond a double's range) with the standard parser, which keeps integers exact, and refuse one beyond 64 bits.
    Only bodies with a run of 19 or more digits come here, and most of those hold such digits in strings."""
    stack: List[Tuple[Any, str]] = [(json.loads(raw), "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((item, f"{path}.{key}" if path else str(key)) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{index}]") for index, item in reversed(list(enumerate(value))))
        elif isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            raise ApiError(
                400,
                f"{path}: integer {value} is beyond 64 bits; send numbers this large as strings",
                param=path,
            )


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether objects and arrays in ``value`` nest more than ``limit`` levels (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def validate_request(model: Type[M], body: Dict[str, Any]) -> M:
    """Validate a parsed body with ``model`` (strict types).

    Raises:
        ApiError: 400 naming the first offending field.
    """
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise ApiError(400, message, param=param) from None


def unauthorized() -> ApiError:
    """The 401 for a missing or wrong key."""
    return ApiError(
        401,
        "Missing or wrong API key: send 'Authorization: Bearer <key>'",
        headers={"www-authenticate": "Bearer"},
        code="invalid_api_key",
    )


def unauthorized_response(scope: Scope) -> Response:
    """The OpenAI-style 401 answered to a request of ``scope`` without the key."""
    return error_response(unauthorized())


def body_timeout_error(scope: Scope, message: str) -> bytes:
    """The OpenAI-style body of the 408 for a request whose body did not arrive in time."""
    return error_body(408, message, "invalid_request_error", code="request_timeout")


def install_body_timeout(app: Any, timeout: float, error_body: ErrorBody = body_timeout_error) -> None:
    """Answer 408 (body from ``error_body``) and close the connection when a request body is not whole within
    ``timeout`` seconds of its headers (:class:`~agentbolt.utils.request_limits.BodyTimeoutMiddleware`).

    Added last, it wraps every other middleware of ``app``.

    Raises:
        TypeError: ``timeout`` is not a number.
        ValueError: ``timeout`` is not positive and finite.
    """
    timeout = check_positive(timeout, "body_timeout")
    app.add_middleware(BodyTimeoutMiddleware, timeout=timeout, error_body=error_body)


def install_error_handlers(app: Any) -> None:
    """Answer every error of the FastAPI ``app`` with an OpenAI-style body (see the module docstring)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            message = f"Unknown route: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        headers = dict(exc.headers or {})
        return Response(error_body(exc.status_code, message), exc.status_code, headers, _JSON)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        location = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{location}: {first.get('msg', 'invalid request')}" if location else str(first.get("msg", exc))
        return error_response(ApiError(400, message, param=location or None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.error("Unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(500, f"Internal server error ({type(exc).__name__})"))
