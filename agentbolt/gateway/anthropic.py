"""Anthropic Messages API on the gateway: checking requests, and translating between Messages and chat completions.

Every function here is pure (dicts and bytes in, dicts and bytes out); :mod:`agentbolt.gateway.app` wires them
into the ``/v1/messages`` route:

* For a model served by an OpenAI-compatible backend, :func:`messages_to_chat` turns the request into a chat
  completion request (checked with the chat request's schema; an error names the Messages request's field), the
  gateway's chat path forwards and records it (token ids included), and
  :func:`chat_to_message` / :class:`ChatStreamTranslator` turn the answer back into a message or its event stream.
* For a model served by an Anthropic-compatible backend, the request is passed through unchanged; to record the
  call, :func:`messages_to_chat` (lenient) and :func:`message_to_chat_completion` (after
  :func:`assemble_message_stream` for streams) give the span the same chat shape every other call has.
* :func:`anthropic_error_body` writes errors in Anthropic's shape (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import orjson
from pydantic import ValidationError

from agentbolt.openai_api.errors import ApiError
from agentbolt.openai_api.schema import ChatCompletionRequest, Location, validation_failure

__all__ = [
    "ChatStreamTranslator",
    "anthropic_error_body",
    "anthropic_error_from_openai",
    "assemble_message_stream",
    "chat_to_message",
    "message_to_chat_completion",
    "messages_to_chat",
    "validate_messages_request",
]

logger = logging.getLogger("agentbolt.gateway.anthropic")

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
"""Chat ``finish_reason`` -> Messages ``stop_reason`` (``stop_sequence`` is told apart from ``end_turn`` separately)."""
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
}
"""Messages ``stop_reason`` -> chat ``finish_reason`` (for recording passed-through calls)."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_IGNORED_FIELDS = (
    "metadata",
    "thinking",
    "service_tier",
    "container",
    "context_management",
    "mcp_servers",
    "cache_control",
    "diagnostics",
    "inference_geo",
    "output_config",
    "speed",
    "user_profile_id",
    "workspace_id",
)
"""Request fields with no chat-completion counterpart: accepted and not forwarded to chat backends."""
_TOOL_FIELDS = {"parameters": "input_schema"}
"""A chat tool's ``function`` fields -> the Messages tool's fields (``name`` and ``description`` keep theirs)."""


def _is_status(value: Any) -> bool:
    """Whether ``value`` is an HTTP error status (an int from 400 to 599, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599


def anthropic_error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for other server errors)."""
    return _ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def anthropic_error_body(status: int, message: str) -> bytes:
    """An error body in Anthropic's shape."""
    return orjson.dumps({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})


def anthropic_error_from_openai(status: int, body: bytes) -> bytes:
    """Rewrite an error body (OpenAI's shape, Anthropic's, or plain text) into Anthropic's shape."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("type") == "error" and isinstance(parsed.get("error"), dict):
        return body
    error = parsed.get("error", parsed.get("detail")) if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = error["message"]
    elif isinstance(error, str):
        message = error
    else:
        message = body[:500].decode("utf-8", errors="replace").strip() or f"HTTP {status}"
    return anthropic_error_body(status, message)


def _invalid(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error")


def validate_messages_request(body: Mapping[str, Any]) -> str:
    """Check the fields every Messages request needs and return its model name.

    Raises:
        ApiError: 400 naming the missing or malformed field.
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model: field required (a non-empty string)")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _invalid("max_tokens: field required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _invalid(f"max_tokens: must be a positive integer, got {max_tokens!r}")
    messages = body.get("messages")
    if messages is None:
        raise _invalid("messages: field required")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages: must be a non-empty list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"messages.{index}: must be an object with 'role' and 'content'")
        if message.get("role") not in ("user", "assistant"):
            raise _invalid(f"messages.{index}.role: must be 'user' or 'assistant', got {message.get('role')!r}")
        if not isinstance(message.get("content"), (str, list)):
            raise _invalid(f"messages.{index}.content: must be a string or a list of content blocks")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid(f"stream: must be a boolean, got {stream!r}")
    return model


def _blocks(content: Any, where: str) -> List[Dict[str, Any]]:
    """Content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _invalid(f"{where}: must be a string or a list of content blocks")
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _invalid(f"{where}.{index}: must be a content block with a 'type'")
    return content


def _text(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _invalid(f"{where}.text: must be a string")
    return text


def _image_part(block: Mapping[str, Any], where: str) -> Dict[str, Any]:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise _invalid(f"{where}.source: an image needs a base64 source (media_type, data) or a url source")


def _joined(parts: List[Dict[str, Any]]) -> Any:
    """Chat content: a string when every part is text (joined by newlines), else the list of parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _user_messages(blocks: List[Dict[str, Any]], where: str, strict: bool) -> List[Dict[str, Any]]:
    """One user turn's blocks as chat messages: a ``tool`` message per tool result, then the user's own parts."""
    out: List[Dict[str, Any]] = []
    parts: List[Dict[str, Any]] = []
    for index, block in enumerate(blocks):
        at, kind = f"{where}.{index}", block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str) or not tool_use_id:
                raise _invalid(f"{at}.tool_use_id: must be a non-empty string")
            texts: List[str] = []
            for inner_index, inner in enumerate(_blocks(block.get("content", ""), f"{at}.content")):
                if inner["type"] == "text":
                    texts.append(_text(inner, f"{at}.content.{inner_index}"))
                elif inner["type"] == "image":
                    parts.append(_image_part(inner, f"{at}.content.{inner_index}"))
                elif strict:
                    raise _invalid(f"{at}.content.{inner_index}: unsupported block type {inner['type']!r}")
            text = "\n".join(texts)
            if block.get("is_error") is True:
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": tool_use_id, "content": text})
        elif strict:
            raise _invalid(f"{at}: unsupported content block type {kind!r} for an OpenAI-compatible backend")
    if parts:
        out.append({"role": "user", "content": _joined(parts)})
    return out


def _assistant_message(blocks: List[Dict[str, Any]], where: str, strict: bool) -> Dict[str, Any]:
    texts: List[str] = []
    calls: List[Dict[str, Any]] = []
    for index, block in enumerate(blocks):
        at, kind = f"{where}.{index}", block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
                raise _invalid(f"{at}: a tool_use block needs a string 'id' and 'name'")
            if not isinstance(arguments, dict):
                raise _invalid(f"{at}.input: must be an object")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # reasoning of an earlier turn: chat completions have no place for it
        elif strict:
            raise _invalid(f"{at}: unsupported content block type {kind!r} for an OpenAI-compatible backend")
    message: Dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _system_text(system: Any) -> Optional[str]:
    if system is None:
        return None
    if isinstance(system, str):
        return system or None
    blocks = _blocks(system, "system")
    return "\n".join(_text(block, f"system.{i}") for i, block in enumerate(blocks) if block["type"] == "text") or None


def _tools(tools: Any, strict: bool) -> List[Dict[str, Any]]:
    if not isinstance(tools, list):
        raise _invalid("tools: must be a list")
    out: List[Dict[str, Any]] = []
    for index, tool in enumerate(tools):
        at = f"tools.{index}"
        if not isinstance(tool, dict):
            raise _invalid(f"{at}: must be an object")
        if tool.get("type", "custom") != "custom":
            if strict:
                raise _invalid(
                    f"{at}: server tool {tool.get('type')!r} is not available on an OpenAI-compatible backend"
                )
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{at}.name: must be a non-empty string")
        if not isinstance(schema, dict):
            raise _invalid(f"{at}.input_schema: must be a JSON schema object")
        function: Dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, chat: Dict[str, Any]) -> None:
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise _invalid("tool_choice: must be an object with a 'type'")
    kind = choice["type"]
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _invalid("tool_choice.name: must name one of the tools")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise _invalid(f"tool_choice.type: must be auto, any, tool or none, got {kind!r}")
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def messages_to_chat(body: Mapping[str, Any], strict: bool = True) -> Dict[str, Any]:
    """Translate a Messages request into a chat completion request.

    ``system`` (a string or text blocks) becomes the first message; text and image blocks become message parts;
    ``tool_use`` blocks become the assistant's ``tool_calls`` and ``tool_result`` blocks ``tool`` messages; tools,
    ``tool_choice``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` and ``stream`` carry
    over; the fields in :data:`_IGNORED_FIELDS` (``metadata``, ``thinking``, ``cache_control``...) are dropped.

    Args:
        body: A request that passed :func:`validate_messages_request`.
        strict: Refuse what a chat backend cannot take (documents, server tools...) with a 400, and check the
            translation with the chat completion request schema; when False (to record a call passed through to an
            Anthropic backend), leave out what chat has no place for instead, unchecked.

    Raises:
        ApiError: 400 naming the offending field of the Messages request (``messages.1.content``,
            ``stop_sequences``, ``tools.0.input_schema``...), never a field of the chat request it translates to.
    """
    messages: List[Dict[str, Any]] = []
    origins: List[str] = []  # the Messages field each chat message comes from
    system = _system_text(body.get("system"))
    if system is not None:
        messages.append({"role": "system", "content": system})
        origins.append("system")
    for index, message in enumerate(body["messages"]):
        where = f"messages.{index}.content"
        blocks = _blocks(message["content"], where)
        if message["role"] == "user":
            turn = _user_messages(blocks, where, strict)
        else:
            turn = [_assistant_message(blocks, where, strict)]
        messages.extend(turn)
        origins.extend([where] * len(turn))
    chat: Dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise _invalid(f"top_k: must be a positive integer, got {top_k!r}")
    for field in ("temperature", "top_p", "top_k"):  # ranges are checked with the chat request's schema
        if body.get(field) is not None:
            chat[field] = body[field]
    stops = body.get("stop_sequences")
    if stops:
        chat["stop"] = stops
    if body.get("tools"):
        tools = _tools(body["tools"], strict)
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    if body.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    ignored = [field for field in _IGNORED_FIELDS if body.get(field) is not None]
    if ignored:
        logger.debug("Messages request fields not used with a chat backend: %s", ", ".join(ignored))
    if strict:
        _check_chat(chat, origins)
    return chat


def _check_chat(chat: Dict[str, Any], origins: Sequence[str]) -> None:
    """Check a translated request with the chat schema; ``origins[i]`` is the Messages field of chat message ``i``.

    Raises:
        ApiError: 400 naming the field of the Messages request the offending chat field was translated from.
    """
    try:
        ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        location, message = validation_failure(exc)
        where = _messages_location(location, origins)
        raise _invalid(f"{where}: {message}" if where else message) from None


def _messages_location(location: Location, origins: Sequence[str]) -> str:
    """The Messages request field that the chat request field at ``location`` was translated from."""
    if not location:
        return ""
    head, rest = location[0], list(location[1:])
    if head == "messages" and rest:
        return origins[int(rest[0])]  # a chat message's own fields are the translation's, not the client's
    if head == "stop":
        head = "stop_sequences"
    elif head == "tools" and len(rest) > 2 and rest[1] == "function":  # tools[k].function.<field>
        rest = [rest[0], _TOOL_FIELDS.get(str(rest[2]), rest[2]), *rest[3:]]
    elif head == "tool_choice":
        rest = ["name"] if rest[:1] == ["function"] else []  # tool_choice.function.name
    return ".".join(str(part) for part in (head, *rest))


def _tool_input(arguments: Any, name: str) -> Dict[str, Any]:
    """Tool-call arguments (a JSON string) as a tool_use ``input`` object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = orjson.loads(arguments or "{}")
    except (orjson.JSONDecodeError, TypeError):
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    logger.warning(
        "Tool call %r has arguments that are not a JSON object (%r); sending an empty input", name, arguments
    )
    return {}


def _stop_reason(finish_reason: Optional[str], matched: Any, stops: Iterable[str]) -> Tuple[str, Optional[str]]:
    """``stop_reason`` and ``stop_sequence`` of a chat answer (vLLM-style backends name the matched stop string)."""
    if finish_reason == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def _usage(usage: Any) -> Dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def _message_id(completion_id: Any) -> str:
    return (
        f"msg_{completion_id}" if isinstance(completion_id, str) and completion_id else f"msg_{secrets.token_hex(12)}"
    )


def chat_to_message(completion: Mapping[str, Any], model: str, stop_sequences: Iterable[str] = ()) -> Dict[str, Any]:
    """Translate a chat completion (its first choice) into a Messages response naming ``model``."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: List[Dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        name = function.get("name") or ""
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{secrets.token_hex(12)}",
                "name": name,
                "input": _tool_input(function.get("arguments"), name),
            }
        )
    stop_reason, stop_sequence = _stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stop_sequences)
    return {
        "id": _message_id(completion.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(completion.get("usage")),
    }


def _event(kind: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def anthropic_error_event(status: int, message: str) -> bytes:
    """A stream ``error`` event (what Anthropic sends when a stream fails after it started)."""
    return _event("error", {"error": {"type": anthropic_error_type(status), "message": message}})


class ChatStreamTranslator:
    """Turns a chat completion event stream into a Messages event stream, one piece of bytes at a time.

    Feed it the chat stream's bytes in order (pieces may end anywhere); it returns the Messages events
    (``message_start``, ``content_block_start``/``delta``/``stop``, ``message_delta``, ``message_stop``) that the
    bytes complete. An ``error`` chunk becomes an ``error`` event.

    Args:
        model: Model name the events report.
        stop_sequences: The request's stop sequences (to report ``stop_sequence``).
    """

    def __init__(self, model: str, stop_sequences: Iterable[str] = ()) -> None:
        self.model = model
        self.stop_sequences = list(stop_sequences)
        self._pending = b""
        self._started = False
        self._finished = False
        self._block: Optional[Tuple[str, int]] = None  # ("text", -) or ("tool", chat tool-call index)
        self._index = -1
        self._finish_reason: Optional[str] = None
        self._matched: Any = None
        self._usage: Dict[str, Any] = {}

    def feed(self, data: bytes) -> bytes:
        """Messages events for the complete chat events in ``data`` (and what was left over before)."""
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        out: List[bytes] = []
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                out.append(self._finish())
                continue
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if isinstance(chunk, dict):
                out.append(self._chunk(chunk))
        return b"".join(out)

    def close(self) -> bytes:
        """Events still owed when the chat stream ended (a stream cut before ``[DONE]`` ends with an error)."""
        tail = self.feed(b"\n") if self._pending else b""
        if not self._finished:
            self._finished = True
            return tail + anthropic_error_event(502, "The backend's stream ended before it was complete")
        return tail

    def _start(self, chunk: Dict[str, Any]) -> bytes:
        if self._started:
            return b""
        self._started = True
        # Messages streams count the input at their start: the first chunk's prompt token ids do when the backend
        # returns them (the gateway asks for them); the final count comes with message_delta in any case.
        prompt = chunk.get("prompt_token_ids")
        message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(prompt) if isinstance(prompt, list) else 0, "output_tokens": 0},
        }
        return _event("message_start", {"message": message})

    def _close_block(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return _event("content_block_stop", {"index": self._index})

    def _open(self, block: Tuple[str, int], content_block: Dict[str, Any]) -> bytes:
        closed = self._close_block()
        self._block = block
        self._index += 1
        return closed + _event("content_block_start", {"index": self._index, "content_block": content_block})

    def _chunk(self, chunk: Dict[str, Any]) -> bytes:
        if self._finished:
            return b""
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            # The gateway's own error events carry the status as ``http_status``; some servers put it in ``code``.
            found = [error.get(key) for key in ("http_status", "code")] if isinstance(error, dict) else []
            status = next((value for value in found if _is_status(value)), 502)
            self._finished = True
            return anthropic_error_event(status, str(message))
        out = [self._start(chunk)]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self._block != ("text", 0):
                    out.append(self._open(("text", 0), {"type": "text", "text": ""}))
                out.append(
                    _event(
                        "content_block_delta",
                        {"index": self._index, "delta": {"type": "text_delta", "text": delta["content"]}},
                    )
                )
            for call in delta.get("tool_calls") or []:
                out.append(self._tool_delta(call))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return b"".join(out)

    def _tool_delta(self, call: Dict[str, Any]) -> bytes:
        out = []
        block = ("tool", int(call.get("index", 0)))
        function = call.get("function") or {}
        if self._block != block:
            content_block = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{secrets.token_hex(12)}",
                "name": function.get("name") or "",
                "input": {},
            }
            out.append(self._open(block, content_block))
        if function.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(_event("content_block_delta", {"index": self._index, "delta": delta}))
        return b"".join(out)

    def _finish(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        stop_reason, stop_sequence = _stop_reason(self._finish_reason, self._matched, self.stop_sequences)
        return (
            self._start(None)
            + self._close_block()
            + _event(
                "message_delta",
                {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}, "usage": _usage(self._usage)},
            )
            + _event("message_stop", {})
        )


def message_to_chat_completion(message: Mapping[str, Any]) -> Dict[str, Any]:
    """A Messages response as a chat completion (how a passed-through call is recorded)."""
    texts: List[str] = []
    calls: List[Dict[str, Any]] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
    chat_message: Dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        chat_message["tool_calls"] = calls
    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": chat_message,
                "finish_reason": FINISH_REASONS.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def assemble_message_stream(body: bytes) -> Tuple[Dict[str, Any], Optional[str]]:
    """Rebuild the message a Messages event stream carried.

    Returns:
        The message, and an error message when the stream carried an ``error`` event or ended before
        ``message_stop``.
    """
    message: Dict[str, Any] = {"content": [], "usage": {}}
    partial_json: Dict[int, str] = {}
    error: Optional[str] = None
    stopped = False
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            event = orjson.loads(line[5:].strip())
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = {**event["message"], "content": [], "usage": dict(event["message"].get("usage") or {})}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta" and message["content"]:
            block, delta = message["content"][-1], event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                index = len(message["content"]) - 1
                partial_json[index] = partial_json.get(index, "") + str(delta.get("partial_json", ""))
        elif kind == "message_delta":
            message.update({k: v for k, v in (event.get("delta") or {}).items() if v is not None})
            message["usage"].update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            stopped = True
        elif kind == "error":
            err = event.get("error")
            error = err.get("message") if isinstance(err, dict) else str(err)
    for index, text in partial_json.items():
        message["content"][index]["input"] = _tool_input(text, str(message["content"][index].get("name")))
    if error is None and not stopped:
        error = "The stream ended before message_stop"
    return message, error
