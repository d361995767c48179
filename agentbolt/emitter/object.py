"""Arbitrary Python objects recorded in the trace (literals as text, bytes as base64, the rest as JSON)."""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, Optional, Tuple

from agentbolt.emitter.annotation import emit_span
from agentbolt.semconv import AGL_OBJECT, LightningSpanAttributes
from agentbolt.types.tracer import Attributes, SpanCoreFields, SpanLike
from agentbolt.utils.otel import full_qualified_name

__all__ = ["emit_object", "get_object_value", "encode_object"]

_TYPE = LightningSpanAttributes.OBJECT_TYPE.value
_LITERAL = LightningSpanAttributes.OBJECT_LITERAL.value
_JSON = LightningSpanAttributes.OBJECT_JSON.value
# bool before int: it is an int subclass. Subclasses (``IntEnum``, ``np.float64``...) are recorded as their base type.
_LITERAL_TYPES: Tuple[type, ...] = (bool, str, int, float)


def encode_object(obj: Any) -> Attributes:
    """Span attributes describing ``obj``.

    Raises:
        RuntimeError: ``obj`` is neither a literal, bytes, nor JSON-serialisable.
    """
    for literal_type in _LITERAL_TYPES:
        if isinstance(obj, literal_type):
            # The base type's own conversion: ``str()`` of an enum member would give its name, not its value.
            try:
                text = literal_type.__str__(obj) if literal_type is str else str(literal_type(obj))
            except ValueError as exc:  # an integer with more digits than Python turns into text
                raise RuntimeError(f"Cannot record object of type {full_qualified_name(type(obj))}: {exc}") from exc
            return {_TYPE: literal_type.__name__, _LITERAL: text}
    if isinstance(obj, (bytes, bytearray)):
        return {_TYPE: "bytes", _LITERAL: base64.b64encode(bytes(obj)).decode("ascii")}
    try:
        encoded = json.dumps(obj)
    except (TypeError, ValueError) as exc:
        raise RuntimeError(f"Cannot record object of type {full_qualified_name(type(obj))}: {exc}") from exc
    return {_TYPE: full_qualified_name(type(obj)), _JSON: encoded}


def emit_object(object: Any, attributes: Optional[Dict[str, Any]] = None, propagate: bool = True) -> SpanCoreFields:
    """Record an ``agentlightning.object`` span describing ``object``.

    Args:
        object: The value (str/int/float/bool, bytes, or anything JSON-serialisable).
        attributes: Extra span attributes.
        propagate: Send the span to the active tracer; False only builds the core fields.

    Returns:
        The span's core fields.

    Raises:
        RuntimeError: The object cannot be encoded, or no tracer is active (with ``propagate=True``).
    """
    return emit_span(AGL_OBJECT, "an object", encode_object(object), attributes, propagate)


def get_object_value(span: SpanLike) -> Any:
    """Decode the object recorded on a span (None when the span holds none).

    Raises:
        RuntimeError: The stored JSON is invalid or the literal type is unknown.
    """
    attributes = span.attributes or {}
    if _JSON in attributes:
        try:
            return json.loads(str(attributes[_JSON]))
        except ValueError as exc:
            raise RuntimeError(f"Invalid JSON in {_JSON}: {exc}") from exc
    if _LITERAL not in attributes:
        return None
    literal = str(attributes[_LITERAL])
    kind = attributes.get(_TYPE, "str")
    if kind == "str":
        return literal
    if kind == "int":
        return int(literal)
    if kind == "float":
        return float(literal)
    if kind == "bool":
        return literal.lower() == "true"
    if kind == "bytes":
        return base64.b64decode(literal)
    raise RuntimeError(f"Unknown literal object type {kind!r} in {_TYPE}.")
