"""Free-text messages recorded in the trace."""

from __future__ import annotations

from typing import Any, Dict, Optional

from agentbolt.emitter.annotation import emit_span
from agentbolt.semconv import AGL_MESSAGE, LightningSpanAttributes
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
    emit_span(AGL_MESSAGE, "a message", {_BODY: message}, attributes, propagate)


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
