"""What the gateway records about one LLM call, and how it becomes an ``agentbolt.llm_call`` span.

The request path only fills a :class:`CallRecord` (the parsed request, the parsed response or the raw stream bytes,
timings and the outcome) and hands it to the span writer (:class:`~agentbolt.store.span_writer.SpanWriter`).
Everything else here runs on the writer's task: reassembling streamed chunks into one completion and turning
request and response into span attributes with :mod:`agentbolt.llm_call_attributes` (the module the OpenAI SDK
instrumentation uses too), plus what only the gateway knows (backend, HTTP status, agent name).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import orjson
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from agentbolt.gateway.routing import Deployment
from agentbolt.llm_call_attributes import CompletionRecord, llm_call_attributes
from agentbolt.semconv import AGL_LLM_CALL, LLM_AGENT_NAME, LLM_CALL_ID, LightningResourceAttributes
from agentbolt.store.span_writer import PendingSpan
from agentbolt.types import OtelResource, Span, SpanContext, TraceStatus

__all__ = ["CallRecord", "assemble_stream", "call_attributes", "build_span", "decode_answer"]

logger = logging.getLogger("agentbolt.gateway.recording")

_SERVICE_NAME = "agentbolt.gateway"
_ID_GENERATOR = RandomIdGenerator()


@dataclass
class CallRecord(PendingSpan):
    """One proxied LLM call, as seen by the gateway; the span writer turns it into a span.

    Attributes:
        rollout_id: Rollout named in the request URL.
        attempt_id: Attempt named in the request URL.
        sequence_id: Future of the sequence id requested from the store when the request arrived.
        endpoint: ``chat/completions``, ``completions`` or ``v1/messages`` (passed through to an Anthropic backend).
        request: The client's request body.
        start_time: When the request arrived (seconds since the epoch).
        agent_name: Value of the agent-name request header, if any.
        call_id: The call's identity, sent to the client as the ``x-request-id`` response header.
        deployment: The deployment that answered (None when none did).
        end_time: When the answer was complete.
        status_code: HTTP status the client saw (or the upstream status for passed-through errors).
        response: The complete response (non-streaming).
        stream_body: Raw server-sent events (streaming).
        error: Failure description, None on success.
        error_type: Short failure category.
        messages_api: The backend spoke Anthropic's Messages API: ``response`` and ``stream_body`` are in that
            shape (``request`` is its chat translation), and are recorded as the chat call they are equivalent to.
    """

    rollout_id: str
    attempt_id: str
    sequence_id: Optional[asyncio.Future[int]]
    endpoint: str
    request: Dict[str, Any]
    start_time: float
    agent_name: Optional[str] = None
    call_id: Optional[str] = None
    deployment: Optional[Deployment] = None
    end_time: Optional[float] = None
    status_code: int = 0
    response: Optional[Dict[str, Any]] = None
    stream_body: Optional[bytes] = None
    error: Optional[str] = None
    error_type: Optional[str] = None
    messages_api: bool = False

    def succeed(self, status_code: int, response: Dict[str, Any]) -> None:
        """Mark the call complete with a parsed response body."""
        self.end_time = time.time()
        self.status_code = status_code
        self.response = response

    def fail(self, status_code: int, message: str, error_type: str) -> None:
        """Mark the call failed."""
        self.end_time = time.time()
        self.status_code = status_code
        self.error = message
        self.error_type = error_type

    async def issued_sequence_id(self) -> Optional[int]:
        """The sequence id requested when the request arrived (waits for the store to issue it)."""
        if self.sequence_id is None:
            return None
        return await asyncio.shield(self.sequence_id)

    def to_span(self, sequence_id: int) -> Span:
        """The call's ``agentbolt.llm_call`` span."""
        return build_span(self, sequence_id)

    def describe(self) -> str:
        """How log messages name this call's span."""
        return f"the span of a call of rollout {self.rollout_id} / attempt {self.attempt_id}"

    def stream_finished(self, body: bytes, error: Optional[Any]) -> None:
        """Mark a streamed call finished; ``error`` is a ``GatewayError`` when the stream broke."""
        self.end_time = time.time()
        self.stream_body = body
        if error is not None:
            self.status_code = error.status_code
            self.error = error.message
            self.error_type = error.error_type
        else:
            self.status_code = 200


def decode_answer(data: bytes) -> Any:
    """A backend's JSON, read as the OpenAI SDK reads it.

    orjson is tried first (fast); what it refuses and Python's reader takes (an escaped lone surrogate, ``"\\ud83d"``,
    which some servers write for half an emoji) is read by Python's reader instead.

    Raises:
        ValueError: ``data`` is not JSON.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _sse_payloads(body: bytes) -> Tuple[List[Dict[str, Any]], bool]:
    """JSON payloads of the ``data:`` lines of a server-sent event stream, and whether ``[DONE]`` was seen."""
    payloads: List[Dict[str, Any]] = []
    done = False
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            parsed = decode_answer(data)
        except ValueError:
            logger.debug("Skipping a stream event that is not JSON: %r", data[:200])
            continue
        if isinstance(parsed, dict):
            payloads.append(parsed)
    return payloads, done


def assemble_stream(body: bytes) -> Tuple[CompletionRecord, Optional[str]]:
    """Rebuild one complete response from a chat or text completion stream (see :class:`CompletionRecord`).

    Returns:
        The reassembled response, and an error message when the stream carried an error event or ended without
        ``[DONE]``.
    """
    payloads, done = _sse_payloads(body)
    record = CompletionRecord()
    error: Optional[str] = None
    for chunk in payloads:
        if "error" in chunk:
            err = chunk["error"]
            error = err.get("message") if isinstance(err, dict) else str(err)
            continue
        record.add_chunk(chunk)
    if error is None and not done:
        error = "The stream ended before [DONE]"
    return record, error


def call_attributes(call: CallRecord, response: Optional[CompletionRecord]) -> Dict[str, Any]:
    """Span attributes of one call: the LLM call's (request, response, token ids, usage) and the gateway's own."""
    deployment = call.deployment
    attributes = llm_call_attributes(
        call.request,
        response,
        operation="text_completion" if call.endpoint == "completions" else "chat",
        provider=deployment.provider if deployment is not None else None,
    )
    if deployment is not None:
        attributes["server.address"] = deployment.shown_base
    if call.agent_name:
        attributes[LLM_AGENT_NAME] = call.agent_name
    if call.call_id:
        attributes[LLM_CALL_ID] = call.call_id
    if call.error is not None:
        attributes["error.type"] = call.error_type or "error"
    attributes["http.response.status_code"] = call.status_code
    return attributes


def _recorded_response(call: CallRecord) -> Tuple[Optional[CompletionRecord], Optional[str]]:
    """The call's answer as one chat completion, and the stream's error (if it was a stream that broke)."""
    if call.messages_api:
        from agentbolt.gateway.anthropic import assemble_message_stream, message_to_chat_completion

        message, stream_error = (
            (call.response, None) if call.stream_body is None else assemble_message_stream(call.stream_body)
        )
        completion = message_to_chat_completion(message) if message is not None else None
        return (CompletionRecord.from_completion(completion) if completion is not None else None), stream_error
    if call.stream_body is not None:
        return assemble_stream(call.stream_body)
    return (CompletionRecord.from_completion(call.response) if call.response is not None else None), None


def build_span(call: CallRecord, sequence_id: int) -> Span:
    """The ``agentbolt.llm_call`` span of ``call``."""
    response, stream_error = _recorded_response(call)
    if call.error is None and stream_error is not None:
        call.error, call.error_type = stream_error, "stream_incomplete"
    error = call.error
    attributes = call_attributes(call, response)
    status = TraceStatus(status_code="ERROR", description=error) if error is not None else TraceStatus(status_code="OK")
    resource = OtelResource(
        attributes={
            LightningResourceAttributes.ROLLOUT_ID.value: call.rollout_id,
            LightningResourceAttributes.ATTEMPT_ID.value: call.attempt_id,
            LightningResourceAttributes.SPAN_SEQUENCE_ID.value: sequence_id,
            "service.name": _SERVICE_NAME,
        },
        schema_url="",
    )
    trace_id, span_id = (
        format(_ID_GENERATOR.generate_trace_id(), "032x"),
        format(_ID_GENERATOR.generate_span_id(), "016x"),
    )
    # The attributes are built above with plain str/int/float/bool values and homogeneous lists, so the span is
    # assembled without re-validating them (validating the token-id lists is most of the cost of a span).
    return Span.model_construct(
        rollout_id=call.rollout_id,
        attempt_id=call.attempt_id,
        sequence_id=sequence_id,
        trace_id=trace_id,
        span_id=span_id,
        parent_id=None,
        name=AGL_LLM_CALL,
        status=status,
        attributes=attributes,
        events=[],
        links=[],
        start_time=call.start_time,
        end_time=call.end_time,
        context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
        parent=None,
        resource=resource,
    )
