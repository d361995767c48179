"""OpenTelemetry helpers: tracer access, attribute flattening and sanitising, tags, links and exceptions.

Span attributes in OpenTelemetry are flat (``str -> primitive | homogeneous list of primitives``). Emitters and
adapters exchange nested data through dotted keys (``a.b.0.c``); the functions here convert between the two
representations and make arbitrary values safe to attach to a span.
"""

from __future__ import annotations

import json
import logging
import traceback
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Type, TypeVar, Union

from opentelemetry import trace as trace_api
from opentelemetry.trace import get_tracer_provider as otel_get_tracer_provider
from pydantic import TypeAdapter

from agentbolt.env_var import LightningEnvVar, resolve_bool_env_var
from agentbolt.semconv import LightningSpanAttributes, LinkAttributes, LinkPydanticModel
from agentbolt.types.tracer import Attributes, AttributeValue, Span
from agentbolt.types.wire import without_lone_surrogates

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace import Tracer as SdkTracer

__all__ = [
    "full_qualified_name",
    "get_tracer_provider",
    "get_tracer",
    "make_tag_attributes",
    "extract_tags_from_attributes",
    "make_link_attributes",
    "query_linked_spans",
    "extract_links_from_attributes",
    "filter_attributes",
    "filter_and_unflatten_attributes",
    "flatten_attributes",
    "unflatten_attributes",
    "sanitize_attribute_value",
    "sanitize_attributes",
    "sanitize_list_attribute_sanity",
    "check_attributes_sanity",
    "format_exception_attributes",
    "record_exception_event",
    "get_span_processors",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_PRIMITIVES = (str, bool, int, float)
_TRACER_NAME = "agentlightning"
_TAG_LIST_ADAPTER: TypeAdapter[List[str]] = TypeAdapter(List[str])
_LINK_LIST_ADAPTER: TypeAdapter[List[LinkPydanticModel]] = TypeAdapter(List[LinkPydanticModel])


def full_qualified_name(cls: type) -> str:
    """Importable name of a class: ``module.QualName`` (just ``QualName`` for builtins).

    Args:
        cls: The class.

    Returns:
        The qualified name, e.g. ``"dict"`` or ``"agentbolt.types.tracer.Span"``.
    """
    module = getattr(cls, "__module__", None)
    if module is None or module == "builtins":
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def _emitter_debug_enabled() -> bool:
    default = logger.getEffectiveLevel() <= logging.DEBUG
    return bool(resolve_bool_env_var(LightningEnvVar.AGL_EMITTER_DEBUG, fallback=default))


def _ensure_initialized() -> None:
    if getattr(trace_api, "_TRACER_PROVIDER", None) is None:
        raise RuntimeError("Tracer is not initialized. Cannot emit a meaningful span.")


def get_span_processors(provider: Any, expected_type: Type[T]) -> List[T]:
    """Span processors of a given type registered on an SDK tracer provider.

    Args:
        provider: An ``opentelemetry.sdk.trace.TracerProvider``.
        expected_type: The processor class to look for.

    Returns:
        The matching processors, in registration order.
    """
    active = getattr(provider, "_active_span_processor", None)
    processors = getattr(active, "_span_processors", ()) or ()
    return [p for p in processors if isinstance(p, expected_type)]


def get_tracer_provider(inspect: bool = True) -> TracerProvider:
    """The global OpenTelemetry tracer provider, which must have been set by a tracer.

    Args:
        inspect: Log the active span processors when emitter debugging is on (env ``AGL_EMITTER_DEBUG``,
            defaulting to whether this module's logger is at DEBUG level).

    Returns:
        The global provider (normally an SDK ``TracerProvider``).

    Raises:
        RuntimeError: No tracer provider has been set.
    """
    from opentelemetry.sdk.trace import TracerProvider

    _ensure_initialized()
    provider = otel_get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        logger.error("The global tracer provider is %r, not an OpenTelemetry SDK TracerProvider.", provider)
        return provider  # type: ignore[return-value]
    if inspect and _emitter_debug_enabled():
        processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", ())
        logger.debug("Active span processors: %s", [type(p).__name__ for p in processors])
    return provider


def get_tracer(use_active_span_processor: bool = True) -> Union[trace_api.Tracer, SdkTracer]:
    """An OpenTelemetry tracer on the global provider.

    Args:
        use_active_span_processor: When False, the tracer shares the provider's sampler, resource and id
            generator but has no span processor, so its spans are never exported.

    Returns:
        The tracer.

    Raises:
        RuntimeError: No tracer provider has been set.
    """
    provider = get_tracer_provider()
    if use_active_span_processor:
        return provider.get_tracer(_TRACER_NAME)
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    return SdkTracer(
        sampler=provider.sampler,
        resource=provider.resource,
        span_processor=SynchronousMultiSpanProcessor(),
        id_generator=provider.id_generator,
        instrumentation_info=None,  # type: ignore[arg-type]
        span_limits=provider._span_limits,  # pyright: ignore[reportPrivateUsage]
        instrumentation_scope=InstrumentationScope(_TRACER_NAME),
    )


# --------------------------------------------------------------------------------------------------------------------
# Flattening


def _primitive_kind(value: Any) -> Optional[type]:
    # bool is a subclass of int: test it first so the two stay distinct.
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind
    return None


def flatten_attributes(nested: Any, *, expand_leaf_lists: bool = False) -> Dict[str, Any]:
    """Flatten nested dicts/lists into dotted keys.

    Dicts become ``parent.key`` entries and lists ``parent.<index>`` entries. Unless ``expand_leaf_lists`` is set, a
    non-empty list whose items are all primitives of one type is kept as a single list value (OpenTelemetry supports
    homogeneous lists); lists of mixed primitive types are expanded with a warning.

    Args:
        nested: The value to flatten.
        expand_leaf_lists: Always expand lists into indexed keys.

    Returns:
        The flat mapping. A primitive at the root gives ``{"": value}``; an empty container gives ``{}``.

    Raises:
        ValueError: A dict has a non-string key.
    """
    flat: Dict[str, Any] = {}

    def join(prefix: str, key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    def visit(value: Any, prefix: str) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"Cannot flatten a dict with a non-string key {key!r} (at {prefix or '<root>'}).")
                visit(item, join(prefix, key))
            return
        if isinstance(value, (list, tuple)):
            if not expand_leaf_lists and prefix and value:
                kinds = {_primitive_kind(item) for item in value}
                if None not in kinds:
                    if len(kinds) == 1:
                        flat[prefix] = list(value)
                        return
                    logger.warning(
                        "List attribute %r mixes primitive types %s; expanding it into indexed keys.",
                        prefix,
                        sorted(k.__name__ for k in kinds if k is not None),
                    )
            for index, item in enumerate(value):
                visit(item, join(prefix, str(index)))
            return
        flat[prefix] = value

    visit(nested, "")
    return flat


def _listify(node: Any) -> Any:
    if isinstance(node, dict):
        converted = {key: _listify(value) for key, value in node.items()}
        if converted and set(converted) == {str(i) for i in range(len(converted))}:
            return [converted[str(i)] for i in range(len(converted))]
        return converted
    return node


def unflatten_attributes(flat: Mapping[str, Any]) -> Union[Dict[str, Any], List[Any]]:
    """Rebuild the nested structure from dotted keys.

    Dicts whose keys are exactly ``"0"`` .. ``"n-1"`` become lists (at any depth, root included). When a key is both
    a leaf and a prefix of deeper keys, the deeper structure wins.

    Args:
        flat: Dotted keys and their values.

    Returns:
        The nested dict (or list).
    """
    root: Dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = root
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        leaf = parts[-1]
        if isinstance(node.get(leaf), dict) and not isinstance(value, dict):
            continue  # a nested path already claimed this key
        node[leaf] = value
    return _listify(root)


def filter_attributes(attributes: Mapping[str, Any], prefix: str) -> Dict[str, Any]:
    """Attributes whose key is ``prefix`` or starts with ``prefix + "."``.

    Args:
        attributes: Flat attributes.
        prefix: The key prefix.

    Returns:
        The matching subset (keys unchanged).
    """
    dotted = prefix + "."
    return {k: v for k, v in attributes.items() if k == prefix or k.startswith(dotted)}


def filter_and_unflatten_attributes(attributes: Mapping[str, Any], prefix: str) -> Union[Dict[str, Any], List[Any]]:
    """Select the attributes under ``prefix`` and rebuild their nested structure (prefix stripped).

    Args:
        attributes: Flat attributes.
        prefix: The key prefix.

    Returns:
        The nested value found under the prefix.

    Raises:
        ValueError: An attribute key equals the prefix itself (a leaf cannot be unflattened under it).
    """
    dotted = prefix + "."
    stripped: Dict[str, Any] = {}
    for key, value in attributes.items():
        if key == prefix:
            raise ValueError(f"Attribute {prefix!r} is a leaf value; expected nested keys under {dotted!r}.")
        if key.startswith(dotted):
            stripped[key[len(dotted) :]] = value
    return unflatten_attributes(stripped)


# --------------------------------------------------------------------------------------------------------------------
# Sanitising


def sanitize_list_attribute_sanity(values: Sequence[Any]) -> Union[List[str], List[bool], List[int], List[float]]:
    """Coerce a list into a homogeneous primitive list acceptable as an attribute value.

    All strings stay strings, all bools stay bools, ints mixed with bools become ints, and numbers mixed with
    floats become floats.

    Args:
        values: The list.

    Returns:
        The homogeneous list.

    Raises:
        ValueError: The list holds anything else (mixed strings/numbers, containers, None...).
    """
    items = list(values)
    kinds = {_primitive_kind(item) for item in items}
    if None in kinds:
        raise ValueError(f"List attribute holds non-primitive values: {values!r}")
    if kinds <= {str}:
        return [str(v) for v in items]
    if kinds == {bool}:
        return [bool(v) for v in items]
    if kinds <= {bool, int}:
        return [int(v) for v in items]
    if kinds <= {bool, int, float}:
        return [float(v) for v in items]
    raise ValueError(f"List attribute mixes strings and numbers: {values!r}")


def sanitize_attribute_value(value: Any, force: bool = True) -> AttributeValue:
    """Make a value acceptable as an OpenTelemetry attribute.

    Primitives pass through, lists are made homogeneous (JSON-encoded if that is impossible), anything else is
    JSON-encoded.

    Args:
        value: The value.
        force: Stringify what JSON cannot encode instead of failing.

    Returns:
        The attribute value.

    Raises:
        ValueError: The value cannot be JSON-encoded and ``force`` is False.
    """
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return sanitize_list_attribute_sanity(value)
        except ValueError:
            logger.warning("List attribute value is not homogeneous; storing it as JSON: %r", value)
    try:
        return json.dumps(value, default=str if force else None)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Value of type {type(value).__name__} is not JSON-serialisable: {exc}") from exc


def sanitize_attributes(attributes: Mapping[str, Any], force: bool = True) -> Attributes:
    """Apply :func:`sanitize_attribute_value` to every attribute.

    Args:
        attributes: Flat attributes.
        force: See :func:`sanitize_attribute_value`.

    Returns:
        The sanitised attributes.

    Raises:
        ValueError: A value cannot be sanitised; the message names its key.
    """
    result: Attributes = {}
    for key, value in attributes.items():
        try:
            result[key] = sanitize_attribute_value(value, force=force)
        except ValueError as exc:
            raise ValueError(f"Failed to sanitize attribute '{key}': {exc}") from exc
    return result


def check_attributes_sanity(attributes: Mapping[Any, Any]) -> None:
    """Validate that attributes are already in OpenTelemetry shape.

    Args:
        attributes: The attributes to check.

    Raises:
        ValueError: A key is not a string, or a value is neither a primitive nor a homogeneous primitive list.
    """
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise ValueError(f"Attribute key {key!r} is not a string.")
        if isinstance(value, _PRIMITIVES):
            continue
        if isinstance(value, (list, tuple)):
            kinds = {_primitive_kind(item) for item in value}
            if None not in kinds and len(kinds) <= 1:
                continue
            raise ValueError(f"Attribute '{key}' must be a list of a single primitive type, got {value!r}.")
        raise ValueError(f"Attribute '{key}' has unsupported type {type(value).__name__}.")


def format_exception_attributes(exception: BaseException) -> Attributes:
    """OpenTelemetry ``exception.*`` attributes describing an exception.

    Args:
        exception: The exception.

    Returns:
        ``exception.type``, ``exception.message``, ``exception.escaped`` and, when available,
        ``exception.stacktrace``; lone surrogates in the message or the stack trace (an error body's ``"\\ud800"``)
        replaced by U+FFFD (:func:`~agentbolt.types.wire.without_lone_surrogates`), since the OTLP encoder drops
        strings without a UTF-8 form, and with them the span.
    """
    attributes: Attributes = {
        "exception.type": type(exception).__name__,
        "exception.message": without_lone_surrogates(str(exception)),
        "exception.escaped": True,
    }
    stacktrace = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
    if stacktrace.strip():
        attributes["exception.stacktrace"] = without_lone_surrogates(stacktrace)
    return attributes


def record_exception_event(span: trace_api.Span, exception: BaseException) -> str:
    """Record ``exception`` on ``span`` as OpenTelemetry's ``exception`` event, its message and stack trace writable.

    OpenTelemetry's ``span.record_exception`` records them as they are, and the OTLP encoder drops a string without
    a UTF-8 form (an error body's lone surrogate ``"\\ud800"``) and with it the span. Here they are the ones of
    :func:`format_exception_attributes`, lone surrogates replaced by U+FFFD; the event's other attributes are
    OpenTelemetry's own.

    Returns:
        The recorded message, for the span's status description.
    """
    attributes = format_exception_attributes(exception)
    message = str(attributes["exception.message"])
    written = {key: attributes[key] for key in ("exception.message", "exception.stacktrace") if key in attributes}
    span.record_exception(exception, attributes=written)
    return message


# --------------------------------------------------------------------------------------------------------------------
# Tags and links


def make_tag_attributes(tags: List[str]) -> Dict[str, Any]:
    """Attributes ``agentlightning.tag.<i>`` for a list of tags.

    Args:
        tags: The tags.

    Returns:
        The flat attributes.
    """
    return flatten_attributes({LightningSpanAttributes.TAG.value: list(tags)}, expand_leaf_lists=True)


def extract_tags_from_attributes(attributes: Mapping[str, Any]) -> List[str]:
    """Tags stored by :func:`make_tag_attributes`.

    Args:
        attributes: Span attributes.

    Returns:
        The tags (empty when none).

    Raises:
        pydantic.ValidationError: The stored tags are not strings.
    """
    prefix = LightningSpanAttributes.TAG.value
    if not filter_attributes(attributes, prefix):
        return []
    return _TAG_LIST_ADAPTER.validate_python(filter_and_unflatten_attributes(attributes, prefix))


def make_link_attributes(links: Dict[str, str]) -> Dict[str, Any]:
    """Attributes ``agentlightning.link.<i>.key_match/value_match`` for link conditions.

    Args:
        links: Mapping of attribute key (or ``trace_id`` / ``span_id``) to the value it must equal.

    Returns:
        The flat attributes.

    Raises:
        ValueError: A value is not a string.
    """
    for key, value in links.items():
        if not isinstance(value, str):
            raise ValueError(f"Link value for {key!r} must be a string, got {type(value).__name__}.")
    entries = [
        {LinkAttributes.KEY_MATCH.value: key, LinkAttributes.VALUE_MATCH.value: value} for key, value in links.items()
    ]
    return flatten_attributes({LightningSpanAttributes.LINK.value: entries}, expand_leaf_lists=True)


def extract_links_from_attributes(attributes: Mapping[str, Any]) -> List[LinkPydanticModel]:
    """Link conditions stored by :func:`make_link_attributes`.

    Args:
        attributes: Span attributes.

    Returns:
        The links (empty when none).
    """
    prefix = LightningSpanAttributes.LINK.value
    if not filter_attributes(attributes, prefix):
        return []
    return _LINK_LIST_ADAPTER.validate_python(filter_and_unflatten_attributes(attributes, prefix))


def _span_ids(span: Union[ReadableSpan, Span]) -> Optional[tuple[str, str]]:
    if isinstance(span, Span):
        return span.trace_id, span.span_id
    context = getattr(span, "context", None)
    if context is None:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def query_linked_spans(
    spans: Sequence[Union[ReadableSpan, Span]], links: List[LinkPydanticModel]
) -> List[Union[ReadableSpan, Span]]:
    """Spans matching every link condition.

    ``trace_id`` / ``span_id`` conditions compare hex ids; other keys compare the span attribute with that key.

    Args:
        spans: Candidate spans (stored spans or OpenTelemetry spans).
        links: The conditions.

    Returns:
        The matching spans, in input order.
    """

    def matches(span: Union[ReadableSpan, Span], link: LinkPydanticModel) -> bool:
        if link.key_match in ("trace_id", "span_id"):
            ids = _span_ids(span)
            if ids is None:
                return False
            return (ids[0] if link.key_match == "trace_id" else ids[1]) == link.value_match
        attributes = span.attributes or {}
        return attributes.get(link.key_match) == link.value_match

    return [span for span in spans if all(matches(span, link) for link in links)]
