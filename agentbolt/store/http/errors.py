"""Errors over HTTP: which status the server answers for an exception, and which exception the client raises.

Every error is a JSON body ``{"detail": <message>, "error_type": <exception class>, "error_kind": <builtin base>}``.
The client turns it into a :class:`LightningStoreHTTPError` (an :class:`aiohttp.ClientResponseError`) whose subclass
also derives from the builtin exception the store raised, so ``except ValueError`` works over HTTP as in process.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Type

import aiohttp
import orjson
from pydantic import ValidationError

from agentbolt.store.collection.base import (
    DuplicatedPrimaryKeyError,
    StorageOutcomeUnknownError,
    StorageUnavailableError,
)

__all__ = [
    "LightningStoreHTTPError",
    "LightningStoreValueError",
    "LightningStoreTypeError",
    "LightningStoreLookupError",
    "LightningStoreRuntimeError",
    "LightningStoreNotImplementedError",
    "NOT_APPLIED_HEADER",
    "status_for_exception",
    "error_body",
    "error_kind",
    "error_from_response",
    "is_auth_error",
]

NOT_APPLIED_HEADER = "x-agentbolt-not-applied"
"""Response header of a 5xx answer guaranteeing that the request changed nothing (sending it again is safe)."""

_NOT_FOUND_MARKERS = ("not found", "does not exist", "no attempts found", "unknown")


def error_kind(exc: BaseException) -> str:
    """Name of the first builtin exception class in ``exc``'s ancestry (e.g. ``ValueError``)."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins":
            return cls.__name__
    return "Exception"


def status_for_exception(exc: BaseException) -> int:
    """HTTP status of an exception raised by the store while serving a request.

    503 means the storage could not be reached and nothing was applied; 500 is a failure whose effect is unknown.
    """
    if isinstance(exc, ValidationError):
        return 422
    if isinstance(exc, DuplicatedPrimaryKeyError):
        return 409
    if isinstance(exc, StorageUnavailableError):
        return 503
    if isinstance(exc, StorageOutcomeUnknownError):
        return 500
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


def error_body(detail: Any, error_type: str, kind: str) -> bytes:
    """The JSON body of every error: the message, the exception class, and its builtin base class."""
    return orjson.dumps({"detail": detail, "error_type": error_type, "error_kind": kind})


def exception_detail(exc: BaseException) -> Any:
    """The ``detail`` of an exception: the validation errors of a pydantic error, else the message."""
    if isinstance(exc, ValidationError):
        return orjson.loads(exc.json(include_url=False, include_context=False))
    return str(exc) or type(exc).__name__


class LightningStoreHTTPError(aiohttp.ClientResponseError):
    """An error answered by a LightningStore server.

    Attributes:
        status: HTTP status code.
        message: The server's error message (``detail``).
        error_type: Name of the exception class raised on the server, when known.
        not_applied: The server guarantees that the request changed nothing.
    """

    def __init__(self, *args: Any, error_type: Optional[str] = None, not_applied: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_type = error_type
        self.not_applied = not_applied


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
_AUTH_STATUSES = frozenset({401, 403})


def _error_class(status: int, kind: Optional[str]) -> Type[LightningStoreHTTPError]:
    if kind in _ERROR_CLASSES:
        return _ERROR_CLASSES[kind]
    if status in (400, 404, 409, 413, 422):
        return LightningStoreValueError
    if status == 501:
        return LightningStoreNotImplementedError
    return LightningStoreHTTPError


def _detail_message(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts: List[str] = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", ()))
                parts.append(f"{loc}: {item.get('msg', item)}" if loc else str(item.get("msg", item)))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return str(detail)


def _parse_error_payload(payload: bytes) -> Tuple[Any, Optional[str], Optional[str]]:
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode("utf-8", "replace")[:500], None, None
    if isinstance(parsed, dict):
        return parsed.get("detail"), parsed.get("error_type"), parsed.get("error_kind")
    return parsed, None, None


def error_from_response(response: aiohttp.ClientResponse, payload: bytes) -> LightningStoreHTTPError:
    """The exception the client raises for an error answer (``response`` with its read ``payload``)."""
    detail, error_type, kind = _parse_error_payload(payload)
    message = _detail_message(detail) if detail is not None else (response.reason or f"HTTP {response.status}")
    cls = _error_class(response.status, kind)
    return cls(
        response.request_info,
        response.history,
        status=response.status,
        message=message,
        headers=response.headers,
        error_type=error_type,
        not_applied=response.headers.get(NOT_APPLIED_HEADER) == "1",
    )


def is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an authentication or authorization failure (401/403), which is never hidden."""
    return isinstance(exc, aiohttp.ClientResponseError) and exc.status in _AUTH_STATUSES
