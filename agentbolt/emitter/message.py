"""Free-text messages recorded in the trace."""

from __future__ import annotations

from typing import Any, Dict, Optional

from agentbolt.emitter.annotation import resolve_tracer, to_attributes
from agentbolt.semconv import AGL_MESSAGE, LightningSpanAttributes
from agentbolt.tracer.base import get_active_tracer
from agentbolt.types.tracer import SpanLike

__all__ = ["emit_message", "get_message_value"]

_BODY = LightningSpanAttributes.MESSAGE_BODY.value


def emit_message(message: str, attributes: Optional[Dict[str, Any]] = None, propagate: bool = True) -> None:
    """Record an ``agentlightning.message`` span with the text in ``agentlightning.message.body``.

    Args:
        message: The text.
        attributes: Extra span attributes (nested values are flattened).
        propagate: Send the span to the active tracer; False records nothing.

    Raises:
        TypeError: ``message`` is not a string.
        RuntimeError: No active tracer (with ``propagate=True``).
    """
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}.")
    span_attributes = {**to_attributes(attributes or {}, ""), _BODY: message}
    tracer = resolve_tracer(propagate, "a message", get_active_tracer)
    tracer.create_span(name=AGL_MESSAGE, attributes=span_attributes)


def get_message_value(span: SpanLike) -> Optional[str]:
    """The message text of a span, or None if it has none.

    Raises:
        TypeError: The stored body is not a string.
    """
    body = (span.attributes or {}).get(_BODY)
    if body is None:
        return None
    if not isinstance(body, str):
        raise TypeError(f"{_BODY} must be a str, got {type(body).__name__}.")
    return body
