"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

As in OpenAI's API, ``code`` is a short machine-readable string naming the failure when one applies
(``model_not_found``, ``context_length_exceeded``, ``invalid_api_key``, ``unsupported_parameter``...) and ``null``
otherwise; the HTTP status is the response's, never the ``code``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import orjson

__all__ = ["ApiError", "error_body", "ERROR_TYPES"]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
"""The ``type`` an error gets from its status unless the raiser names one."""


def _error_type(status: int, type_: Optional[str]) -> str:
    """``type_``, else the type of ``status`` in :data:`ERROR_TYPES` (``invalid_request_error`` for the others)."""
    return type_ or ERROR_TYPES.get(status, "invalid_request_error")


def error_body(
    status: int,
    message: str,
    type_: Optional[str] = None,
    param: Optional[str] = None,
    *,
    code: Optional[str] = None,
    **extra: Any,
) -> bytes:
    """The JSON body of an error answer (OpenAI's format; ``extra`` keys are added to the ``error`` object).

    Args:
        status: HTTP status of the answer (it picks the default ``type``).
        message: What is wrong.
        type_: The error's ``type`` (default from the status, see :data:`ERROR_TYPES`).
        param: The request field at fault, if one is.
        code: OpenAI's short error code (``model_not_found``...), or None where no specific code applies.
        **extra: More keys of the ``error`` object.
    """
    error: Dict[str, Any] = {
        "message": message,
        "type": _error_type(status, type_),
        "param": param,
        "code": code,
        **extra,
    }
    return orjson.dumps({"error": error})


class ApiError(Exception):
    """A failure answered with an OpenAI-style error body.

    Args:
        status: HTTP status (400, 401, 404, 413, 415, 429, 503...).
        message: What is wrong, naming the offending value and what would be valid.
        type_: The error's ``type`` (default from the status: ``invalid_request_error``, ``authentication_error``...).
        param: The request field at fault, if one is.
        headers: Extra response headers (``WWW-Authenticate``, ``Retry-After``).
        code: OpenAI's short error code (``model_not_found``, ``context_length_exceeded``...), or None (``null`` in
            the body) where no specific code applies.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type_: Optional[str] = None,
        param: Optional[str] = None,
        headers: Optional[Dict[str, str]] = None,
        code: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = _error_type(status, type_)
        self.param = param
        self.headers = headers or {}
        self.code = code

    def body(self, **extra: Any) -> bytes:
        """The JSON error body."""
        return error_body(self.status, self.message, self.type, self.param, code=self.code, **extra)
