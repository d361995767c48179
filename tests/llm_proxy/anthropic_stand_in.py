"""A stand-in for an Anthropic Messages API server (the hosted API cannot be reached here).

It answers ``POST /v1/messages`` in Anthropic's shapes, complete or as an event stream, and checks the headers the
real API requires (``x-api-key``, ``anthropic-version``). The model name chooses the behaviour:

``claude-echo``        answers "Hello there" (a ``tool_use`` of the first tool when tools are offered and the last
                       user turn is not a tool result)
``claude-overloaded``  HTTP 529 with Anthropic's ``overloaded_error``
``claude-badrequest``  HTTP 400 with Anthropic's ``invalid_request_error``
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Dict, List, Optional

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

API_KEY = "stand-in-key"
TEXT_PIECES = ["Hel", "lo ", "there"]


def _error(status: int, kind: str, message: str) -> Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class AnthropicStandIn:
    """The stand-in's state and app.

    Attributes:
        requests: Bodies received, in order.
        headers: Request headers received, in order.
    """

    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.headers: List[Dict[str, str]] = []
        self.app = FastAPI()
        self.app.add_api_route("/v1/messages", self._messages, methods=["POST"])
        self.launcher = PythonServerLauncher(self.app, PythonServerLauncherArgs(launch_mode="thread"))

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (the form of the Anthropic SDK's ``base_url``)."""
        return self.launcher.access_endpoint

    def _tool_use(self, body: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        tools = body.get("tools")
        last = body["messages"][-1]["content"]
        if not tools or (isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)):
            return None
        return {"type": "tool_use", "id": "toolu_standin1", "name": tools[0]["name"], "input": {"city": "Paris"}}

    async def _messages(self, request: Request) -> Response:
        if request.headers.get("x-api-key") != API_KEY:
            return _error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        body = orjson.loads(await request.body())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if body["model"] == "claude-overloaded":
            return _error(529, "overloaded_error", "Overloaded")
        if body["model"] == "claude-badrequest":
            return _error(400, "invalid_request_error", "messages: text content blocks must be non-empty")
        tool_use = self._tool_use(body)
        content = [tool_use] if tool_use else [{"type": "text", "text": "".join(TEXT_PIECES)}]
        message = {
            "id": f"msg_standin{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if tool_use else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 3},
        }
        if body.get("stream"):
            return StreamingResponse(self._stream(message), media_type="text/event-stream")
        return Response(orjson.dumps(message), media_type="application/json")

    async def _stream(self, message: Dict[str, Any]) -> AsyncIterator[bytes]:
        def event(kind: str, **data: Any) -> bytes:
            return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"

        start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 12, "output_tokens": 1}}
        yield event("message_start", message=start)
        yield event("ping")
        block = message["content"][0]
        if block["type"] == "text":
            yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
            for piece in TEXT_PIECES:
                yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
        else:
            yield event("content_block_start", index=0, content_block={**block, "input": {}})
            arguments = orjson.dumps(block["input"]).decode()
            for part in (arguments[:5], arguments[5:]):
                yield event("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": part})
        yield event("content_block_stop", index=0)
        delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        yield event("message_delta", delta=delta, usage={"output_tokens": 3})
        yield event("message_stop")


@contextlib.asynccontextmanager
async def running_stand_in() -> AsyncIterator[AnthropicStandIn]:
    """Serve an :class:`AnthropicStandIn` on a free port for the duration of the block."""
    stand_in = AnthropicStandIn()
    await stand_in.launcher.start()
    try:
        yield stand_in
    finally:
        await stand_in.launcher.stop()
