"""A small OpenAI-compatible backend with scripted failure modes, for the gateway's error-path tests.

It stands in for hosted APIs and misbehaving inference servers, which cannot be reproduced with a real engine here.
It answers like vLLM with ``return_token_ids`` (top-level ``prompt_token_ids``, per-choice ``token_ids``, streamed
per chunk). The behaviour is chosen by the model name the gateway forwards:

``echo``        normal answers (content, tool calls when tools are offered, token ids, logprobs)
``slow``        sleeps ``slow_seconds`` before answering
``fail500``     always HTTP 500
``flaky``       HTTP 503 for the first ``flaky_failures`` requests, then normal
``ratelimit``   always HTTP 429
``badrequest``  HTTP 400 with an OpenAI error body
``malformed``   HTTP 200 with a body that is not JSON
``drop``        streams two events, then drops the connection (non-streaming: drops before answering)
``gated``       streams the first event, then waits until ``gate`` is set (at most 10 s) before the rest
``compact``     normal answers, streamed without the optional space after ``data:`` (``data:[DONE]``)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, AsyncIterator, Dict, List

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

RESPONSE_TOKENS = [7, 8, 9, 10]
RESPONSE_PIECES = ["Hel", "lo ", "the", "re"]


def prompt_token_ids(body: Dict[str, Any]) -> List[int]:
    """Deterministic fake tokenization of the prompt: one id per character (mod 1000)."""
    if "messages" in body:
        text = "".join(str(m.get("content") or "") for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    return [ord(c) % 1000 for c in text] or [1]


class FakeBackend:
    """The fake server's state and app.

    Attributes:
        requests: Bodies received, in order.
        slow_seconds: Delay of the ``slow`` model.
        flaky_failures: Failures of the ``flaky`` model before it recovers.
    """

    def __init__(self, slow_seconds: float = 3.0, flaky_failures: int = 2) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.slow_seconds = slow_seconds
        self.flaky_failures = flaky_failures
        self.gate = threading.Event()
        self.gate_timed_out = False
        self.app = FastAPI()
        self.app.add_api_route("/v1/chat/completions", self._chat, methods=["POST"])
        self.app.add_api_route("/v1/completions", self._chat, methods=["POST"])
        self.app.add_api_route("/v1/models", self._models, methods=["GET"])
        self.launcher = PythonServerLauncher(self.app, PythonServerLauncherArgs(launch_mode="thread"))

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``."""
        return f"{self.launcher.access_endpoint}/v1"

    def count(self, model: str) -> int:
        """Requests received for ``model``."""
        return sum(1 for body in self.requests if body.get("model") == model)

    async def _models(self) -> Response:
        return Response(orjson.dumps({"object": "list", "data": [{"id": "echo", "object": "model"}]}))

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.requests.append(body)
        model = body.get("model")
        chat = request.url.path.endswith("chat/completions")
        if model == "slow":
            await asyncio.sleep(self.slow_seconds)
        elif model == "fail500":
            return Response(orjson.dumps({"error": {"message": "engine crashed"}}), status_code=500)
        elif model == "flaky" and self.count("flaky") <= self.flaky_failures:
            return Response(orjson.dumps({"error": {"message": "warming up"}}), status_code=503)
        elif model == "ratelimit":
            return Response(orjson.dumps({"error": {"message": "slow down"}}), status_code=429)
        elif model == "badrequest":
            error = {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}
            return Response(orjson.dumps(error), status_code=400, media_type="application/json")
        elif model == "malformed":
            return Response(b'{"id": "x", "choices": [', media_type="application/json")
        elif model == "surrogate" and not body.get("stream"):  # half an emoji, escaped: valid for Python's reader
            answer = (
                b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "a\\ud83d b"}}]}'
            )
            return Response(answer, media_type="application/json")
        elif model == "oddchoices" and not body.get("stream"):  # JSON, but not a chat completion
            return Response(orjson.dumps({"id": "x", "choices": [{"message": "hi"}]}), media_type="application/json")
        elif model == "drop" and not body.get("stream"):
            raise ConnectionAbortedError("dropping the connection on purpose")
        if body.get("stream"):
            return StreamingResponse(self._stream(body, chat), media_type="text/event-stream")
        return Response(orjson.dumps(self._complete(body, chat)), media_type="application/json")

    def _tool_call(self, body: Dict[str, Any]) -> Dict[str, Any] | None:
        tools = body.get("tools")
        if not tools or body.get("messages", [{}])[-1].get("role") == "tool":
            return None
        name = tools[0]["function"]["name"]
        return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": '{"city": "Paris"}'}}

    def _complete(self, body: Dict[str, Any], chat: bool) -> Dict[str, Any]:
        want_ids = bool(body.get("return_token_ids"))
        want_logprobs = bool(body.get("logprobs"))
        tool_call = self._tool_call(body) if chat else None
        text = "".join(RESPONSE_PIECES)
        choice: Dict[str, Any] = {"index": 0, "finish_reason": "tool_calls" if tool_call else "stop"}
        if chat:
            message: Dict[str, Any] = {"role": "assistant", "content": None if tool_call else text}
            if tool_call:
                message["tool_calls"] = [tool_call]
            choice["message"] = message
            if want_logprobs:
                choice["logprobs"] = {
                    "content": [{"token": p, "logprob": -0.5 * (i + 1)} for i, p in enumerate(RESPONSE_PIECES)]
                }
        else:
            choice["text"] = text
            if want_logprobs:
                choice["logprobs"] = {"tokens": RESPONSE_PIECES, "token_logprobs": [-0.5 * (i + 1) for i in range(4)]}
        response: Dict[str, Any] = {
            "id": f"cmpl-{len(self.requests)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_token_ids(body)), "completion_tokens": 4, "total_tokens": 0},
        }
        if want_ids:
            response["prompt_token_ids"] = prompt_token_ids(body)
            choice["token_ids"] = list(RESPONSE_TOKENS)
        return response

    async def _stream(self, body: Dict[str, Any], chat: bool) -> AsyncIterator[bytes]:
        want_ids = bool(body.get("return_token_ids"))
        want_logprobs = bool(body.get("logprobs"))
        tool_call = self._tool_call(body) if chat else None
        base = {
            "id": f"cmpl-{len(self.requests)}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
        }

        data = b"data:" if body.get("model") == "compact" else b"data: "

        def event(choice: Dict[str, Any], **extra: Any) -> bytes:
            return data + orjson.dumps({**base, **extra, "choices": [choice]}) + b"\n\n"

        first: Dict[str, Any] = {"index": 0, "finish_reason": None}
        if chat:
            first["delta"] = {"role": "assistant", "content": ""}
        else:
            first["text"] = ""
        yield event(first, **({"prompt_token_ids": prompt_token_ids(body)} if want_ids else {}))
        for i, (piece, token) in enumerate(zip(RESPONSE_PIECES, RESPONSE_TOKENS, strict=True)):
            if body.get("model") == "drop" and i == 1:
                # Let the events reach the gateway first: aiohttp drops data still buffered when it learns that
                # the connection broke, so a drop in the same instant as the events would lose them at random.
                await asyncio.sleep(0.05)
                raise ConnectionAbortedError("dropping the stream on purpose")
            if body.get("model") == "gated" and i == 0:
                self.gate_timed_out = not await asyncio.to_thread(self.gate.wait, 10.0)
            choice: Dict[str, Any] = {"index": 0, "finish_reason": None}
            if tool_call:
                delta: Dict[str, Any] = {"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}
                if i == 0:
                    delta["tool_calls"][0].update(id=tool_call["id"], type="function")
                    delta["tool_calls"][0]["function"]["name"] = tool_call["function"]["name"]
                args = tool_call["function"]["arguments"]
                part = len(args) // len(RESPONSE_PIECES) + 1
                delta["tool_calls"][0]["function"]["arguments"] = args[i * part : (i + 1) * part]
                choice["delta"] = delta
            elif chat:
                # quotes_done: an answer quoting the stream's end marker, which must not end the recording
                quoted = body.get("model") == "quotes_done" and i == 0
                choice["delta"] = {"content": "say data: [DONE]\n\ndata: [DONE] " if quoted else piece}
            else:
                choice["text"] = piece
            if want_ids:
                choice["token_ids"] = [token]
            if want_logprobs:
                if chat:
                    choice["logprobs"] = {"content": [{"token": piece, "logprob": -0.5 * (i + 1)}]}
                else:
                    choice["logprobs"] = {"tokens": [piece], "token_logprobs": [-0.5 * (i + 1)]}
            yield event(choice)
            await asyncio.sleep(0)
        last: Dict[str, Any] = {"index": 0, "finish_reason": "tool_calls" if tool_call else "stop"}
        last["delta" if chat else "text"] = {} if chat else ""
        yield event(last)
        if body.get("model") != "nodone":  # nodone: a backend that ends its stream without the last event
            yield data + b"[DONE]\n\n"


@contextlib.asynccontextmanager
async def running_backend(**kwargs: Any) -> AsyncIterator[FakeBackend]:
    """Serve a :class:`FakeBackend` on a free port for the duration of the block."""
    backend = FakeBackend(**kwargs)
    await backend.launcher.start()
    try:
        yield backend
    finally:
        await backend.launcher.stop()
