"""Exceptions recorded in the trace (handled ones too)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from agentbolt.emitter.annotation import emit_span
from agentbolt.semconv import AGL_EXCEPTION
from agentbolt.utils.otel import format_exception_attributes

__all__ = ["emit_exception"]


def emit_exception(
    exception: BaseException, attributes: Optional[Dict[str, Any]] = None, propagate: bool = True
) -> None:
    """Record an ``agentlightning.exception`` span with the ``exception.*`` attributes (status OK).

    Args:
        exception: The exception.
        attributes: Extra span attributes.
        propagate: Send the span to the active tracer; False records nothing.

    Raises:
        TypeError: ``exception`` is not an exception.
        RuntimeError: No active tracer (with ``propagate=True``).
    """
    if not isinstance(exception, BaseException):
        raise TypeError(f"exception must be an exception instance, got {type(exception).__name__}.")
    emit_span(AGL_EXCEPTION, "an exception", format_exception_attributes(exception), attributes, propagate)
