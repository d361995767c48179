"""Span model stored by the LightningStore, convertible from OpenTelemetry spans."""

from __future__ import annotations

import json
import time
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Dict, List, Literal, Optional, Protocol, Sequence, Union

from pydantic import ConfigDict, Field, PlainSerializer, PlainValidator, WithJsonSchema

from .wire import WireModel

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

__all__ = [
    "AttributeValue",
    "MAX_SEQUENCE_ID",
    "Attributes",
    "TraceState",
    "SpanContext",
    "TraceStatus",
    "Event",
    "Link",
    "OtelResource",
    "Span",
    "SpanNames",
    "SpanAttributeNames",
    "SpanLike",
    "StatusCode",
    "SpanCoreFields",
    "SpanRecordingContext",
]

AttributeValue = Union[str, bool, int, float, Sequence[str], Sequence[bool], Sequence[int], Sequence[float]]
Attributes = Dict[str, AttributeValue]

_PRIMITIVES = (str, bool, int, float)
_PRIMITIVE_TYPES = frozenset(_PRIMITIVES)
_STR_ONLY = frozenset((str,))


def _validate_attributes(value: Any) -> Dict[str, Any]:
    """Check span attributes: string keys; primitive values or lists of primitives (tuples become lists).

    Hand-written because pydantic's validation of the ``AttributeValue`` union costs milliseconds for a span carrying
    thousands of token ids, and every span crosses this check when it is stored or read over HTTP.
    """
    if not isinstance(value, dict):
        raise ValueError(f"attributes must be a mapping, got {type(value).__name__}")
    # Fast path, checked in C: string keys and primitive values of exactly these types (what JSON decodes to).
    if _STR_ONLY.issuperset(map(type, value)) and _PRIMITIVE_TYPES.issuperset(map(type, value.values())):
        return value
    result = value
    for key, item in value.items():
        if not isinstance(key, str):
            raise ValueError(f"attribute keys must be strings, got {key!r}")
        if isinstance(item, _PRIMITIVES):
            continue
        if isinstance(item, (list, tuple)) and (
            _PRIMITIVE_TYPES.issuperset(map(type, item)) or all(isinstance(element, _PRIMITIVES) for element in item)
        ):
            if isinstance(item, tuple):
                if result is value:
                    result = dict(value)
                result[key] = list(item)
            continue
        if isinstance(item, (list, tuple)):
            bad = next(element for element in item if not isinstance(element, _PRIMITIVES))
            raise ValueError(
                f"attribute {key!r} must be a list of strings, bools, ints or floats; it holds {type(bad).__name__} "
                f"{bad!r}"
            )
        raise ValueError(
            f"attribute {key!r} must be a string, bool, int, float or a list of them, got {type(item).__name__}"
        )
    return result


_ATTRIBUTES_JSON_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            {"type": "string"},
            {"type": "boolean"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "array", "items": {"anyOf": [{"type": t} for t in ("string", "boolean", "integer", "number")]}},
        ]
    },
}


def _serialize_attributes(value: Dict[str, Any]) -> Dict[str, Any]:
    return value


ValidatedAttributes = Annotated[
    Attributes,
    PlainValidator(_validate_attributes),
    PlainSerializer(_serialize_attributes, return_type=Any),
    WithJsonSchema(_ATTRIBUTES_JSON_SCHEMA),
]
"""``Attributes`` as model fields declare them: validated by :func:`_validate_attributes`."""
TraceState = Dict[str, str]
StatusCode = Literal["UNSET", "OK", "ERROR"]
SpanLike = Union["ReadableSpan", "Span"]


def convert_timestamp(ts: Optional[int]) -> Optional[float]:
    """Seconds from an OpenTelemetry timestamp: values above 1e12 are nanoseconds; falsy -> None."""
    if not ts:
        return None
    return ts / 1e9 if ts > 1e12 else ts


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def extract_extra_fields(src: Any, excluded_fields: Sequence[str]) -> Dict[str, Any]:
    """JSON-safe copy of ``src``'s instance attributes (leading ``_`` stripped), minus ``excluded_fields``."""
    excluded = set(excluded_fields) | {f"_{name}" for name in excluded_fields}
    class_attrs = set(dir(type(src)))
    result: Dict[str, Any] = {}
    for key, value in getattr(src, "__dict__", {}).items():
        if key in excluded or key in class_attrs:
            continue
        stripped = key.lstrip("_")
        if key.startswith("__") or not stripped or stripped in excluded:
            continue
        result[stripped] = _json_safe(value)
    return result


def _format_trace_id(value: int) -> str:
    return format(value, "032x")


def _format_span_id(value: int) -> str:
    return format(value, "016x")


class SpanContext(WireModel):
    """Identity of a span within its trace."""

    model_config = ConfigDict(extra="allow")

    trace_id: str
    span_id: str
    is_remote: bool
    trace_state: TraceState

    @classmethod
    def from_opentelemetry(cls, src: Any) -> SpanContext:
        """Convert an OpenTelemetry ``SpanContext``."""
        return cls(
            trace_id=_format_trace_id(src.trace_id),
            span_id=_format_span_id(src.span_id),
            is_remote=bool(src.is_remote),
            trace_state={k: v for k, v in (src.trace_state or {}).items()},
        )


class TraceStatus(WireModel):
    """Status of a span."""

    model_config = ConfigDict(extra="allow")

    status_code: StatusCode
    description: Optional[str] = None

    @classmethod
    def from_opentelemetry(cls, src: Any) -> TraceStatus:
        """Convert an OpenTelemetry ``Status``."""
        return cls(status_code=src.status_code.name, description=src.description)


class Event(WireModel):
    """A timestamped event inside a span."""

    model_config = ConfigDict(extra="allow")

    name: str
    attributes: ValidatedAttributes
    timestamp: Optional[float] = None

    @classmethod
    def from_opentelemetry(cls, src: Any) -> Event:
        """Convert an OpenTelemetry ``Event``."""
        return cls(name=src.name, attributes=dict(src.attributes or {}), timestamp=convert_timestamp(src.timestamp))


class Link(WireModel):
    """A link from a span to another span."""

    model_config = ConfigDict(extra="allow")

    context: SpanContext
    attributes: Optional[ValidatedAttributes] = None

    @classmethod
    def from_opentelemetry(cls, src: Any) -> Link:
        """Convert an OpenTelemetry ``Link``."""
        return cls(
            context=SpanContext.from_opentelemetry(src.context),
            attributes=dict(src.attributes) if src.attributes else None,
        )


class OtelResource(WireModel):
    """The OpenTelemetry resource (process-level attributes) a span came from."""

    attributes: ValidatedAttributes
    schema_url: str

    @classmethod
    def from_opentelemetry(cls, src: Any) -> OtelResource:
        """Convert an OpenTelemetry ``Resource``."""
        return cls(attributes=dict(src.attributes or {}), schema_url=src.schema_url or "")


class SpanCoreFields(WireModel):
    """The essential fields of a span produced by an emitter, before the store assigns ids."""

    name: str
    status: TraceStatus
    attributes: ValidatedAttributes
    start_time: Optional[float]
    end_time: Optional[float]


class SpanRecordingContext(Protocol):
    """Handle to a span being recorded by ``Tracer.operation_context``."""

    def record_exception(self, exception: BaseException) -> None: ...

    def record_attributes(self, attributes: Attributes) -> None: ...

    def record_status(self, status_code: StatusCode, description: Optional[str] = None) -> None: ...

    def get_recorded_span(self) -> SpanCoreFields: ...


MAX_SEQUENCE_ID = 2**53
"""Largest span sequence id: exact in every JSON reader (a browser's too), and far from the 64-bit integers of the
SQL stores, so that the next id a store issues always fits."""


class Span(WireModel):
    """A span as stored by the LightningStore, bound to a rollout, an attempt and a sequence id."""

    model_config = ConfigDict(extra="allow")

    rollout_id: str
    attempt_id: str
    sequence_id: Annotated[int, Field(ge=0, le=MAX_SEQUENCE_ID)]
    trace_id: str
    span_id: str
    parent_id: Optional[str]
    name: str
    status: TraceStatus
    attributes: ValidatedAttributes
    events: List[Event]
    links: List[Link]
    start_time: Optional[float]
    end_time: Optional[float]
    context: Optional[SpanContext]
    parent: Optional[SpanContext]
    resource: OtelResource

    @classmethod
    def from_opentelemetry(cls, src: ReadableSpan, rollout_id: str, attempt_id: str, sequence_id: int) -> Span:
        """Convert a finished OpenTelemetry span."""
        context = src.get_span_context() if hasattr(src, "get_span_context") else src.context
        parent = src.parent
        extra = extract_extra_fields(
            src,
            [
                "name",
                "context",
                "parent",
                "resource",
                "attributes",
                "events",
                "links",
                "start_time",
                "end_time",
                "status",
                "span_processor",
                "rollout_id",
                "attempt_id",
                "trace_id",
                "span_id",
                "parent_id",
                "sequence_id",
                "kind",
                "instrumentation_info",
                "instrumentation_scope",
                "limits",
                "record_exception",
                "set_status_on_exception",
                "lock",
                "sampler",
                "id_generator",
                "span_limits",
                "ended",
                "end_on_exit",
                "dropped_attributes",
                "dropped_events",
                "dropped_links",
            ],
        )
        return cls(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            trace_id=_format_trace_id(context.trace_id) if context is not None else _format_trace_id(0),
            span_id=_format_span_id(context.span_id) if context is not None else _format_span_id(0),
            parent_id=_format_span_id(parent.span_id) if parent is not None else None,
            name=src.name,
            status=TraceStatus.from_opentelemetry(src.status),
            attributes=dict(src.attributes or {}),  # type: ignore[arg-type]  # OTel's AnyValue is checked on validation
            events=[Event.from_opentelemetry(e) for e in src.events],
            links=[Link.from_opentelemetry(link) for link in src.links],
            start_time=convert_timestamp(src.start_time),
            end_time=convert_timestamp(src.end_time),
            context=SpanContext.from_opentelemetry(context) if context is not None else None,
            parent=SpanContext.from_opentelemetry(parent) if parent is not None else None,
            resource=OtelResource.from_opentelemetry(src.resource),
            **extra,
        )

    @classmethod
    def from_attributes(
        cls,
        *,
        attributes: Attributes,
        rollout_id: Optional[str] = None,
        attempt_id: Optional[str] = None,
        sequence_id: Optional[int] = None,
        name: Optional[str] = None,
        trace_id: Optional[str] = None,
        span_id: Optional[str] = None,
        parent_id: Optional[str] = None,
        start_time: Optional[float] = None,
        end_time: Optional[float] = None,
        resource: Optional[OtelResource] = None,
        status: Optional[TraceStatus] = None,
    ) -> Span:
        """Build a synthetic span; missing trace/span ids are random."""
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        generator = RandomIdGenerator()
        trace_id = trace_id or _format_trace_id(generator.generate_trace_id())
        span_id = span_id or _format_span_id(generator.generate_span_id())
        return cls(
            rollout_id=rollout_id or "",
            attempt_id=attempt_id or "",
            sequence_id=sequence_id or 0,
            trace_id=trace_id,
            span_id=span_id,
            parent_id=parent_id,
            name=name or "agentlightning.virtual",
            status=status or TraceStatus(status_code="OK"),
            attributes=attributes,
            events=[],
            links=[],
            start_time=start_time,
            end_time=end_time,
            context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
            parent=(
                SpanContext(trace_id=trace_id, span_id=parent_id, is_remote=False, trace_state={})
                if parent_id is not None
                else None
            ),
            resource=resource or OtelResource(attributes={}, schema_url=""),
        )

    @classmethod
    def from_core_fields(
        cls,
        core: SpanCoreFields,
        *,
        rollout_id: Optional[str] = None,
        attempt_id: Optional[str] = None,
        sequence_id: Optional[int] = None,
    ) -> Span:
        """Build a span from emitter core fields."""
        return cls.from_attributes(
            attributes=core.attributes,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            name=core.name,
            status=core.status,
            start_time=core.start_time or time.time(),
            end_time=core.end_time,
        )


class SpanNames(str, Enum):
    """Deprecated span-name constants (use :mod:`agentbolt.semconv`)."""

    REWARD = "agentlightning.reward"
    MESSAGE = "agentlightning.message"
    OBJECT = "agentlightning.object"
    EXCEPTION = "agentlightning.exception"
    VIRTUAL = "agentlightning.virtual"
    ROLLOUT_ID = "agentlightning.rollout_id"
    ATTEMPT_ID = "agentlightning.attempt_id"
    SPAN_SEQUENCE_ID = "agentlightning.span_sequence_id"


class SpanAttributeNames(str, Enum):
    """Deprecated attribute-name constants."""

    MESSAGE = "message"
    OBJECT = "object"
