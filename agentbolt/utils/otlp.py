"""OTLP/HTTP (protobuf) trace ingestion for the store server, and an exporter that targets a store.

Spans arriving over OTLP are bound to a rollout through the resource (or span) attributes
``agentlightning.rollout_id``, ``agentlightning.attempt_id`` and optionally ``agentlightning.span_sequence_id``.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import weakref
import zlib
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Type

from google.protobuf.message import DecodeError, Message
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.semconv import LightningResourceAttributes
from agentbolt.types import Event, Link, OtelResource, Span, SpanContext, TraceStatus
from agentbolt.types.tracer import MAX_SEQUENCE_ID

__all__ = [
    "PROTOBUF_CT",
    "handle_otlp_export",
    "spans_and_unnumbered_from_proto",
    "spans_from_proto",
    "LightningStoreOTLPExporter",
]

logger = logging.getLogger(__name__)

PROTOBUF_CT = "application/x-protobuf"

_ROLLOUT_KEY = LightningResourceAttributes.ROLLOUT_ID.value
_ATTEMPT_KEY = LightningResourceAttributes.ATTEMPT_ID.value
_SEQUENCE_KEY = LightningResourceAttributes.SPAN_SEQUENCE_ID.value
_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}

SequenceIdBulkIssuer = Callable[[Sequence[Tuple[str, str]]], Awaitable[Sequence[int]]]
"""Allocates one sequence id per ``(rollout_id, attempt_id)`` pair, in order."""


# ---------------------------------------------------------------------------------------------------------------
# protobuf -> python conversion


def _any_value_to_python(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` to a plain Python value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        return [_any_value_to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _kv_list_to_dict(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return None


def _kv_list_to_dict(kvs: Any) -> Dict[str, Any]:
    return {kv.key: _any_value_to_python(kv.value) for kv in kvs}


def _to_attributes(kvs: Any) -> Dict[str, Any]:
    """Attributes valid for :class:`Span`: nested maps are flattened to dotted keys, mixed lists become JSON."""
    result: Dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, dict):
            for sub_key, sub_value in value.items():
                put(f"{key}.{sub_key}", sub_value)
        elif isinstance(value, list) and (
            any(isinstance(v, (dict, list)) or v is None for v in value) or len({type(v) for v in value}) > 1
        ):
            result[key] = json.dumps(value)
        else:
            result[key] = value

    for key, value in _kv_list_to_dict(kvs).items():
        put(key, value)
    return result


def _bytes_to_trace_id_hex(raw: bytes) -> str:
    return raw.hex().rjust(32, "0") if raw else "0" * 32


def _bytes_to_span_id_hex(raw: bytes) -> str:
    return raw.hex().rjust(16, "0") if raw else "0" * 16


def _ns_to_seconds(ns: int) -> Optional[float]:
    return ns / 1e9 if ns else None


def _parse_trace_state(raw: str) -> Dict[str, str]:
    state: Dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key:
            state[key] = value
    return state


def _events_from_proto(events: Any) -> List[Event]:
    return [
        Event(name=e.name, attributes=_to_attributes(e.attributes), timestamp=_ns_to_seconds(e.time_unix_nano))
        for e in events
    ]


def _links_from_proto(links: Any) -> List[Link]:
    return [
        Link(
            context=SpanContext(
                trace_id=_bytes_to_trace_id_hex(link.trace_id),
                span_id=_bytes_to_span_id_hex(link.span_id),
                is_remote=False,
                trace_state=_parse_trace_state(link.trace_state),
            ),
            attributes=_to_attributes(link.attributes) or None,
        )
        for link in links
    ]


def _resource_from_proto(resource: Any, schema_url: str = "") -> OtelResource:
    return OtelResource(attributes=_to_attributes(resource.attributes), schema_url=schema_url)


def _normalize_sequence_id(value: Any) -> Optional[int]:
    """An integer sequence id, or ``None`` when absent, negative or unparsable."""
    if value is None:
        return None
    try:
        number = int(str(value))
    except ValueError:
        logger.warning("Ignoring invalid span sequence id %r", value)
        return None
    if not 0 <= number <= MAX_SEQUENCE_ID:
        logger.warning("Ignoring span sequence id %r: outside 0 to 2^53", value)
        return None
    return number


async def spans_from_proto(
    request: ExportTraceServiceRequest, sequence_id_bulk_issuer: SequenceIdBulkIssuer
) -> List[Span]:
    """Convert an OTLP trace export request into store spans.

    Spans without a rollout id or an attempt id (from their resource or their own attributes) are skipped.
    Spans without a valid sequence id get one from ``sequence_id_bulk_issuer`` (one call for the whole request).

    Args:
        request: The decoded ``ExportTraceServiceRequest``.
        sequence_id_bulk_issuer: Coroutine allocating sequence ids for ``(rollout_id, attempt_id)`` pairs.

    Returns:
        The converted spans, in request order.
    """
    spans, missing = spans_and_unnumbered_from_proto(request)
    if missing:
        issued = await sequence_id_bulk_issuer([(spans[i].rollout_id, spans[i].attempt_id) for i in missing])
        for index, sequence_id in zip(missing, issued, strict=True):
            spans[index].sequence_id = sequence_id
    return spans


def spans_and_unnumbered_from_proto(request: ExportTraceServiceRequest) -> Tuple[List[Span], List[int]]:
    """The spans of an OTLP trace export request (as :func:`spans_from_proto`), and the positions of those without a
    valid sequence id, which carry 0 in its place: a store numbers them with ``add_spans_with_new_sequence_ids``.
    """
    spans: List[Span] = []
    missing: List[int] = []
    for resource_spans in request.resource_spans:
        resource = _resource_from_proto(resource_spans.resource, resource_spans.schema_url)
        for scope_spans in resource_spans.scope_spans:
            for proto_span in scope_spans.spans:
                attributes = _to_attributes(proto_span.attributes)
                rollout_id = attributes.get(_ROLLOUT_KEY, resource.attributes.get(_ROLLOUT_KEY))
                attempt_id = attributes.get(_ATTEMPT_KEY, resource.attributes.get(_ATTEMPT_KEY))
                if rollout_id is None or attempt_id is None or rollout_id == "" or attempt_id == "":
                    logger.debug("Skipping OTLP span %r without rollout/attempt id", proto_span.name)
                    continue
                sequence_id = _normalize_sequence_id(
                    attributes.get(_SEQUENCE_KEY, resource.attributes.get(_SEQUENCE_KEY))
                )
                trace_id = _bytes_to_trace_id_hex(proto_span.trace_id)
                span_id = _bytes_to_span_id_hex(proto_span.span_id)
                if sequence_id is None:
                    missing.append(len(spans))
                spans.append(
                    Span(
                        rollout_id=str(rollout_id),
                        attempt_id=str(attempt_id),
                        sequence_id=sequence_id if sequence_id is not None else 0,
                        trace_id=trace_id,
                        span_id=span_id,
                        parent_id=_bytes_to_span_id_hex(proto_span.parent_span_id)
                        if proto_span.parent_span_id
                        else None,
                        name=proto_span.name,
                        status=TraceStatus(
                            status_code=_STATUS_CODES.get(proto_span.status.code, "UNSET"),  # type: ignore[arg-type]
                            description=proto_span.status.message or None,
                        ),
                        attributes=attributes,
                        events=_events_from_proto(proto_span.events),
                        links=_links_from_proto(proto_span.links),
                        start_time=_ns_to_seconds(proto_span.start_time_unix_nano),
                        end_time=_ns_to_seconds(proto_span.end_time_unix_nano),
                        context=SpanContext(
                            trace_id=trace_id,
                            span_id=span_id,
                            is_remote=False,
                            trace_state=_parse_trace_state(proto_span.trace_state),
                        ),
                        parent=None,
                        resource=resource,
                    )
                )
    return spans, missing


# ---------------------------------------------------------------------------------------------------------------
# HTTP handling


def _accepts_gzip(request: Any) -> bool:
    header = request.headers.get("accept-encoding", "")
    return any(token.split(";")[0].strip().lower() == "gzip" for token in header.split(","))


def _maybe_gzip_response(request: Any, payload: bytes) -> Tuple[bytes, Dict[str, str]]:
    """Gzip ``payload`` when the client accepts it; returns the body and extra headers."""
    if _accepts_gzip(request):
        return gzip.compress(payload), {"Content-Encoding": "gzip"}
    return payload, {}


def _bad_request_response(request: Any, message: str, content_type: str = PROTOBUF_CT) -> Any:
    """400 response whose body is a protobuf ``google.rpc.Status`` carrying ``message``."""
    from google.rpc.status_pb2 import Status
    from starlette.responses import Response

    body, headers = _maybe_gzip_response(request, Status(code=3, message=message).SerializeToString())
    return Response(content=body, status_code=400, media_type=content_type, headers=headers)


async def handle_otlp_export(
    request: Any,
    request_message_cls: Type[Message],
    response_message_cls: Type[Message],
    message_callback: Callable[[Any], Awaitable[None]],
    signal_name: str,
) -> Any:
    """Decode an OTLP/HTTP protobuf export request, hand it to ``message_callback`` and answer.

    Args:
        request: The Starlette request.
        request_message_cls: Protobuf class of the request (e.g. ``ExportTraceServiceRequest``).
        response_message_cls: Protobuf class of the (empty) success response.
        message_callback: Coroutine receiving the decoded request message.
        signal_name: ``"traces"``, ``"metrics"``... (used in error messages).

    Returns:
        A Starlette response: 200 with the serialized response message, or 400 with a ``google.rpc.Status``.
    """
    from starlette.responses import Response

    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != PROTOBUF_CT:
        return _bad_request_response(request, f"Unsupported Content-Type '{content_type}', expected '{PROTOBUF_CT}'")
    body = await request.body()
    if request.headers.get("content-encoding", "").strip().lower() == "gzip":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            return _bad_request_response(request, f"Unable to decompress OTLP {signal_name} payload: {exc}")
    message = request_message_cls()
    try:
        message.ParseFromString(body)
    except (DecodeError, ValueError) as exc:
        return _bad_request_response(request, f"Unable to parse OTLP {signal_name} payload: {exc}")
    await message_callback(message)
    payload, headers = _maybe_gzip_response(request, response_message_cls().SerializeToString())
    return Response(content=payload, status_code=200, media_type=PROTOBUF_CT, headers=headers)


# ---------------------------------------------------------------------------------------------------------------
# Exporter


class LightningStoreOTLPExporter(OTLPSpanExporter):
    """OTLP/HTTP span exporter that sends spans to a store while a rollout attempt is active.

    While enabled, every exported span's resource carries the rollout and attempt ids so the store can bind it.
    While disabled, exports are dropped (reported as successful) because there is nothing to bind spans to.

    The store's bearer token is sent with every request: the ``api_key`` given to :meth:`enable_store_otlp`, else
    ``$AGENTBOLT_API_KEY`` (read when the exporter is created). An ``Authorization`` header passed in ``headers``
    takes precedence over both.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import requests

        # Headers set on the session reach every request, and the token can change when another store is bound.
        session = kwargs.get("session") or requests.Session()
        kwargs["session"] = session
        super().__init__(*args, **kwargs)
        self._auth_session = session
        self._explicit_auth = any(key.lower() == "authorization" for key in (kwargs.get("headers") or {}))
        # A forked child must not share the parent's pooled connections (both would read the same sockets).
        if hasattr(os, "register_at_fork"):
            session_ref = weakref.ref(session)

            def drop_pooled_connections() -> None:
                forked_session = session_ref()
                if forked_session is not None:
                    forked_session.close()

            os.register_at_fork(after_in_child=drop_pooled_connections)
        self._set_bearer_token(os.environ.get(API_KEY_ENV_VAR))
        self._default_endpoint: str = self._endpoint
        self._rollout_id: Optional[str] = None
        self._attempt_id: Optional[str] = None

    @property
    def endpoint(self) -> str:
        """The URL spans are currently exported to."""
        return self._endpoint

    @property
    def rollout_id(self) -> Optional[str]:
        """Rollout bound to exported spans, if enabled."""
        return self._rollout_id

    @property
    def attempt_id(self) -> Optional[str]:
        """Attempt bound to exported spans, if enabled."""
        return self._attempt_id

    def _set_endpoint(self, endpoint: str) -> None:
        self._endpoint = endpoint
        client = getattr(self, "_client", None)
        if client is not None and hasattr(client, "_endpoint"):
            client._endpoint = endpoint

    def _set_bearer_token(self, token: Optional[str]) -> None:
        if token and not self._explicit_auth:
            self._auth_session.headers["Authorization"] = f"Bearer {token}"

    def enable_store_otlp(
        self, endpoint: str, rollout_id: str, attempt_id: str, *, api_key: Optional[str] = None
    ) -> None:
        """Export to ``endpoint`` with spans bound to ``rollout_id`` / ``attempt_id``.

        Args:
            endpoint: The store's OTLP/HTTP traces URL (``store.otlp_traces_endpoint()``).
            rollout_id: Rollout bound to the exported spans.
            attempt_id: Attempt bound to the exported spans.
            api_key: The store's bearer token (default: the token found when the exporter was created).
        """
        self._set_endpoint(endpoint)
        self._set_bearer_token(api_key)
        self._rollout_id = rollout_id
        self._attempt_id = attempt_id

    def disable_store_otlp(self) -> None:
        """Go back to the default endpoint and stop binding spans to a rollout."""
        self._set_endpoint(self._default_endpoint)
        self._rollout_id = None
        self._attempt_id = None

    def should_bypass(self) -> bool:
        """Whether exports are dropped while no rollout is bound."""
        return True

    def export_bound(self, spans: Sequence[ReadableSpan], rollout_id: str, attempt_id: str) -> SpanExportResult:
        """Export ``spans`` now, bound to the given rollout attempt (whatever the exporter is currently bound to).

        The ids are merged into each span's resource (``agentlightning.rollout_id`` / ``agentlightning.attempt_id``).
        """
        binding = Resource({_ROLLOUT_KEY: rollout_id, _ATTEMPT_KEY: attempt_id})
        for span in spans:
            span._resource = span.resource.merge(binding)  # type: ignore[attr-defined]
        return super().export(spans)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export ``spans``, stamping the bound rollout and attempt ids onto their resources."""
        if self._rollout_id is not None and self._attempt_id is not None:
            return self.export_bound(spans, self._rollout_id, self._attempt_id)
        if self.should_bypass():
            return SpanExportResult.SUCCESS
        return super().export(spans)

    def store_reachable(self, timeout: float = 2.0) -> bool:
        """Whether the store behind the current endpoint answers HTTP at all (any status counts as an answer).

        Tells a store that is down (worth retrying) from one that answered an export with an error.
        """
        root = self._endpoint[: -len("/v1/traces")] if self._endpoint.endswith("/v1/traces") else self._endpoint
        try:
            self._auth_session.get(f"{root}/v1/agl/health", timeout=timeout)
        except Exception:
            return False
        return True
