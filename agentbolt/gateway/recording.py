"""What the gateway records about one LLM call, and how it becomes an ``agentbolt.llm_call`` span.

The request path only fills a :class:`CallRecord` (the parsed request, the parsed response or the raw stream bytes,
timings and the outcome). Everything else here runs on the span writer's background task: reassembling streamed
chunks into one completion and flattening request and response into span attributes (layout documented in
:mod:`agentbolt.adapter.triplet`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import orjson
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from agentbolt.gateway.routing import Deployment
from agentbolt.semconv import (
    AGL_LLM_CALL,
    GEN_AI_COMPLETION,
    GEN_AI_PROMPT,
    GEN_AI_REQUEST_FUNCTIONS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    LLM_AGENT_NAME,
    PROMPT_TOKEN_IDS,
    RESPONSE_LOGPROBS,
    RESPONSE_TOKEN_IDS,
    LightningResourceAttributes,
)
from agentbolt.types import OtelResource, Span, SpanContext, TraceStatus

__all__ = ["CallRecord", "assemble_stream", "call_attributes", "build_span"]

logger = logging.getLogger("agentbolt.gateway.recording")

# Request parameters copied to ``gen_ai.request.<name>`` when present.
_REQUEST_PARAMS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "seed", "stream", "stop")
_SERVICE_NAME = "agentbolt.gateway"
_ID_GENERATOR = RandomIdGenerator()


@dataclass
class CallRecord:
    """One proxied LLM call, as seen by the gateway.

    Attributes:
        rollout_id: Rollout named in the request URL.
        attempt_id: Attempt named in the request URL.
        sequence_id: Future of the sequence id requested from the store when the request arrived.
        endpoint: ``chat/completions`` or ``completions``.
        request: The client's request body.
        start_time: When the request arrived (seconds since the epoch).
        agent_name: Value of the agent-name request header, if any.
        deployment: The deployment that answered (None when none did).
        end_time: When the answer was complete.
        status_code: HTTP status the client saw (or the upstream status for passed-through errors).
        response: The complete response (non-streaming).
        stream_body: Raw server-sent events (streaming).
        error: Failure description, None on success.
        error_type: Short failure category.
    """

    rollout_id: str
    attempt_id: str
    sequence_id: Optional[asyncio.Future[int]]
    endpoint: str
    request: Dict[str, Any]
    start_time: float
    agent_name: Optional[str] = None
    deployment: Optional[Deployment] = None
    end_time: Optional[float] = None
    status_code: int = 0
    response: Optional[Dict[str, Any]] = None
    stream_body: Optional[bytes] = None
    error: Optional[str] = None
    error_type: Optional[str] = None

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
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            logger.debug("Skipping a stream event that is not JSON: %r", data[:200])
            continue
        if isinstance(parsed, dict):
            payloads.append(parsed)
    return payloads, done


def _merge_tool_call_delta(calls: Dict[int, Dict[str, Any]], delta: Dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    call = calls.setdefault(index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


def assemble_stream(body: bytes) -> Tuple[Dict[str, Any], Optional[str]]:
    """Rebuild one complete (non-streaming) response from a chat or text completion stream.

    Content, tool-call fragments, token ids and logprobs are concatenated per choice; ``prompt_token_ids``, ``id``,
    ``model`` and ``usage`` are taken from the chunks that carry them.

    Returns:
        The response in the non-streaming layout, and an error message when the stream carried an error event or
        ended without ``[DONE]``.
    """
    payloads, done = _sse_payloads(body)
    response: Dict[str, Any] = {}
    choices: Dict[int, Dict[str, Any]] = {}
    tool_calls: Dict[int, Dict[int, Dict[str, Any]]] = {}
    error: Optional[str] = None
    for chunk in payloads:
        if "error" in chunk:
            err = chunk["error"]
            error = err.get("message") if isinstance(err, dict) else str(err)
            continue
        for key in ("id", "model", "created"):
            if key in chunk and key not in response:
                response[key] = chunk[key]
        if chunk.get("prompt_token_ids") is not None and "prompt_token_ids" not in response:
            response["prompt_token_ids"] = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            response["usage"] = chunk["usage"]
        for delta_choice in chunk.get("choices") or []:
            index = delta_choice.get("index", 0)
            choice = choices.setdefault(index, {"index": index})
            delta = delta_choice.get("delta")
            if isinstance(delta, dict):  # chat completion chunk
                message = choice.setdefault("message", {"role": "assistant", "content": None})
                if delta.get("role"):
                    message["role"] = delta["role"]
                if delta.get("content"):
                    message["content"] = (message["content"] or "") + delta["content"]
                for tool_delta in delta.get("tool_calls") or []:
                    _merge_tool_call_delta(tool_calls.setdefault(index, {}), tool_delta)
            elif delta_choice.get("text"):  # text completion chunk
                choice["text"] = choice.get("text", "") + delta_choice["text"]
            if delta_choice.get("finish_reason") is not None:
                choice["finish_reason"] = delta_choice["finish_reason"]
            if delta_choice.get("prompt_token_ids") is not None and "prompt_token_ids" not in choice:
                choice["prompt_token_ids"] = delta_choice["prompt_token_ids"]
            if delta_choice.get("token_ids"):
                choice.setdefault("token_ids", []).extend(delta_choice["token_ids"])
            logprobs = delta_choice.get("logprobs")
            if isinstance(logprobs, dict):
                merged = choice.setdefault("logprobs", {})
                for key, value in logprobs.items():
                    if isinstance(value, list):
                        merged.setdefault(key, []).extend(value)
    for index, calls in tool_calls.items():
        choices[index]["message"]["tool_calls"] = [calls[i] for i in sorted(calls)]
    response["choices"] = [choices[i] for i in sorted(choices)]
    if error is None and not done:
        error = "The stream ended before [DONE]"
    return response, error


def _put(attributes: Dict[str, Any], key: str, value: Any) -> None:
    """Set an attribute, converting values OpenTelemetry cannot hold (None is skipped, containers become JSON)."""
    if value is None:
        return
    if isinstance(value, (str, bool, int, float)):
        attributes[key] = value
    else:
        attributes[key] = orjson.dumps(value).decode()


def _put_tool_calls(attributes: Dict[str, Any], prefix: str, tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        return
    for j, call in enumerate(tool_calls):
        if not isinstance(call, dict):
            continue
        key = f"{prefix}.tool_calls.{j}"
        _put(attributes, f"{key}.id", call.get("id"))
        _put(attributes, f"{key}.type", call.get("type"))
        function = call.get("function")
        if isinstance(function, dict):
            _put(attributes, f"{key}.function.name", function.get("name"))
            _put(attributes, f"{key}.function.arguments", function.get("arguments"))


def _put_message(attributes: Dict[str, Any], prefix: str, message: Dict[str, Any]) -> None:
    _put(attributes, f"{prefix}.role", message.get("role"))
    _put(attributes, f"{prefix}.content", message.get("content"))
    _put(attributes, f"{prefix}.name", message.get("name"))
    _put(attributes, f"{prefix}.tool_call_id", message.get("tool_call_id"))
    _put(attributes, f"{prefix}.reasoning_content", message.get("reasoning_content"))
    _put_tool_calls(attributes, prefix, message.get("tool_calls"))


def _response_logprobs(choice: Dict[str, Any]) -> Optional[List[float]]:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    values: Any
    if isinstance(content, list):  # chat: [{"token", "logprob", ...}, ...]
        values = [entry.get("logprob") for entry in content if isinstance(entry, dict)]
    else:  # completions: {"token_logprobs": [...]}
        values = logprobs.get("token_logprobs")
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
        return None
    return [float(v) for v in values]


def call_attributes(call: CallRecord, response: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Span attributes of one call: request, response, token ids, logprobs, usage and agent name."""
    attributes: Dict[str, Any] = {}
    request = call.request
    _put(attributes, GEN_AI_REQUEST_MODEL, request.get("model"))
    for name in _REQUEST_PARAMS:
        _put(attributes, f"gen_ai.request.{name}", request.get(name))
    if call.deployment is not None:
        attributes["gen_ai.system"] = call.deployment.provider
        attributes["server.address"] = call.deployment.api_base
    for i, tool in enumerate(request.get("tools") or request.get("functions") or []):
        if not isinstance(tool, dict):
            continue
        function = tool.get("function", tool)
        if isinstance(function, dict):
            prefix = f"{GEN_AI_REQUEST_FUNCTIONS}.{i}"
            _put(attributes, f"{prefix}.name", function.get("name"))
            _put(attributes, f"{prefix}.description", function.get("description"))
            _put(attributes, f"{prefix}.parameters", function.get("parameters"))
    messages = request.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            if isinstance(message, dict):
                _put_message(attributes, f"{GEN_AI_PROMPT}.{i}", message)
    elif "prompt" in request:
        _put(attributes, f"{GEN_AI_PROMPT}.0.role", "user")
        _put(attributes, f"{GEN_AI_PROMPT}.0.content", request.get("prompt"))
    if call.agent_name:
        attributes[LLM_AGENT_NAME] = call.agent_name
    if call.error is not None:
        attributes["error.type"] = call.error_type or "error"
    attributes["http.response.status_code"] = call.status_code
    if response is None:
        return attributes

    _put(attributes, GEN_AI_RESPONSE_ID, response.get("id"))
    _put(attributes, GEN_AI_RESPONSE_MODEL, response.get("model"))
    choices = [c for c in response.get("choices") or [] if isinstance(c, dict)]
    for i, choice in enumerate(choices):
        prefix = f"{GEN_AI_COMPLETION}.{i}"
        message = choice.get("message")
        if isinstance(message, dict):
            _put_message(attributes, prefix, message)
        else:
            _put(attributes, f"{prefix}.role", "assistant")
            _put(attributes, f"{prefix}.content", choice.get("text"))
        _put(attributes, f"{prefix}.finish_reason", choice.get("finish_reason"))
    first = choices[0] if choices else {}
    prompt_ids = response.get("prompt_token_ids", first.get("prompt_token_ids"))
    if isinstance(prompt_ids, list) and prompt_ids:
        attributes[PROMPT_TOKEN_IDS] = [int(t) for t in prompt_ids]
    response_ids = first.get("token_ids")
    if isinstance(response_ids, list) and response_ids:
        attributes[RESPONSE_TOKEN_IDS] = [int(t) for t in response_ids]
    logprobs = _response_logprobs(first)
    if logprobs:
        attributes[RESPONSE_LOGPROBS] = logprobs
    usage = response.get("usage")
    if isinstance(usage, dict):
        _put(attributes, GEN_AI_USAGE_INPUT_TOKENS, usage.get("prompt_tokens"))
        _put(attributes, GEN_AI_USAGE_OUTPUT_TOKENS, usage.get("completion_tokens"))
    else:
        if PROMPT_TOKEN_IDS in attributes:
            attributes[GEN_AI_USAGE_INPUT_TOKENS] = len(attributes[PROMPT_TOKEN_IDS])
        if RESPONSE_TOKEN_IDS in attributes:
            attributes[GEN_AI_USAGE_OUTPUT_TOKENS] = len(attributes[RESPONSE_TOKEN_IDS])
    return attributes


def build_span(call: CallRecord, sequence_id: int) -> Span:
    """The ``agentbolt.llm_call`` span of ``call``."""
    response = call.response
    if call.stream_body is not None:
        response, stream_error = assemble_stream(call.stream_body)
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
