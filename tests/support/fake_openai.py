"""A small OpenAI-compatible chat and text completions server for tests and benchmarks.

This is a stand-in for a hosted OpenAI API, which cannot be reached here. It is a real HTTP server (FastAPI +
uvicorn on 127.0.0.1, free port) that the real ``openai`` SDK talks to. Behaviour:

* ``POST /v1/chat/completions``: answers ``"Echo: <last user message>"``; when the request offers tools and the last
  message is from the user, it calls the first tool instead (arguments ``{"query": <last user message>}``).
  ``stream: true`` returns server-sent events (role chunk, content or tool-call fragments, a final chunk with the
  finish reason, an optional usage chunk, ``[DONE]``).
* ``POST /v1/completions`` (the legacy text-completion API): answers ``"Echo: <prompt>"`` (a prompt given as token ids
  is read back as characters), as JSON or, with ``stream: true``, as server-sent events (text chunks, a final chunk
  with the finish reason, an optional usage chunk, ``[DONE]``). Token ids come as vLLM returns them for this API:
  ``prompt_token_ids`` and ``token_ids`` on each choice (the prompt ids in the first chunk of a stream); ``logprobs: k``
  gives the legacy ``tokens`` / ``token_logprobs`` layout.
* vLLM-style token ids (``prompt_token_ids`` on the response / first chunk, ``token_ids`` per choice / per delta)
  when the request has ``return_token_ids: true`` or :attr:`FakeOpenAIConfig.token_ids` is set; per-token
  ``logprobs`` when the request asks for them. "Tokens" are the characters' code points.
* Configurable latency (:attr:`FakeOpenAIConfig.delay`) and failures (:attr:`FakeOpenAIConfig.fail_next` requests
  answered with :attr:`FakeOpenAIConfig.fail_status`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentbolt.utils.server_launcher import pick_free_port

MODEL = "fake-model"


@dataclass
class FakeOpenAIConfig:
    """Behaviour knobs, changeable while the server runs."""

    delay: float = 0.0
    fail_next: int = 0
    fail_status: int = 500
    token_ids: bool = False
    requests: List[Dict[str, Any]] = field(default_factory=list)


def tokenize(text: str) -> List[int]:
    """The fake tokenizer: one token per character."""
    return [ord(c) for c in text]


def _last_user_text(messages: List[Dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _prompt_text(messages: List[Dict[str, Any]]) -> str:
    return "".join(f"<{m.get('role')}>{m.get('content') or ''}" for m in messages)


def _logprobs(text: str) -> Dict[str, Any]:
    return {
        "content": [
            {"token": c, "logprob": -0.01 * (i + 1), "bytes": list(c.encode()), "top_logprobs": []}
            for i, c in enumerate(text)
        ]
    }


def _prompt_of(body: Dict[str, Any]) -> str:
    """The text of a text-completion request's prompt: a string, the first of a list, or token ids as characters."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list):
        return "".join(chr(token) for token in prompt)
    return prompt if isinstance(prompt, str) else ""


def _text_logprobs(text: str, offset: int = 0) -> Dict[str, Any]:
    return {
        "tokens": list(text),
        "token_logprobs": [-0.01 * (offset + i + 1) for i in range(len(text))],
        "top_logprobs": [{c: -0.01 * (offset + i + 1)} for i, c in enumerate(text)],
        "text_offset": [offset + i for i in range(len(text))],
    }


def create_app(config: FakeOpenAIConfig) -> FastAPI:
    """The FastAPI app serving the fake API."""
    # The server runs inside the test process: keep FastAPI from tracing its requests into the tracer under test.
    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})

    async def received(body: Dict[str, Any]) -> Optional[JSONResponse]:
        """Record a completion request and apply the configured delay; the injected failure, if one is due."""
        config.requests.append(body)
        if config.delay:
            await asyncio.sleep(config.delay)
        if config.fail_next <= 0:
            return None
        config.fail_next -= 1
        return JSONResponse(
            {"error": {"message": "injected failure", "type": "server_error", "code": None}},
            status_code=config.fail_status,
        )

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await request.json()
        failure = await received(body)
        if failure is not None:
            return failure
        messages = body.get("messages") or []
        user_text = _last_user_text(messages)
        tools = body.get("tools") or []
        wants_tool = bool(tools) and bool(messages) and messages[-1].get("role") == "user"
        with_ids = bool(body.get("return_token_ids")) or config.token_ids
        with_logprobs = bool(body.get("logprobs"))
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        model = body.get("model") or MODEL
        prompt_ids = tokenize(_prompt_text(messages))
        if wants_tool:
            tool_name = tools[0]["function"]["name"]
            arguments = json.dumps({"query": user_text})
            content = None
            tool_calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:8]}",
                    "type": "function",
                    "function": {"name": tool_name, "arguments": arguments},
                }
            ]
            generated = arguments
            finish_reason = "tool_calls"
        else:
            content = f"Echo: {user_text}"
            tool_calls = None
            generated = content
            finish_reason = "stop"
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(generated),
            "total_tokens": len(prompt_ids) + len(generated),
        }
        if not body.get("stream"):
            message: Dict[str, Any] = {"role": "assistant", "content": content}
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice: Dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
            if with_ids:
                choice["token_ids"] = tokenize(generated)
            if with_logprobs:
                choice["logprobs"] = _logprobs(generated)
            response: Dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
            if with_ids:
                response["prompt_token_ids"] = prompt_ids
            return JSONResponse(response)

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[str]:
            def chunk(delta: Dict[str, Any], finish: Optional[str] = None, **extra: Any) -> str:
                choice: Dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                choice.update(extra.pop("choice_extra", {}))
                payload = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    **extra,
                }
                return f"data: {json.dumps(payload)}\n\n"

            first_extra = {"prompt_token_ids": prompt_ids} if with_ids else {}
            yield chunk({"role": "assistant", "content": ""}, **first_extra)
            if tool_calls:
                call = tool_calls[0]
                half = len(arguments) // 2
                pieces = [arguments[:half], arguments[half:]]
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
                for piece in pieces:
                    extra: Dict[str, Any] = {}
                    if with_ids:
                        extra["token_ids"] = tokenize(piece)
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, choice_extra=extra)
            else:
                assert content is not None
                words = content.split(" ")
                for i, word in enumerate(words):
                    piece = word if i == 0 else " " + word
                    extra = {}
                    if with_ids:
                        extra["token_ids"] = tokenize(piece)
                    if with_logprobs:
                        extra["logprobs"] = _logprobs(piece)
                    yield chunk({"content": piece}, choice_extra=extra)
            yield chunk({}, finish_reason)
            if include_usage:
                payload = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Any:
        body = await request.json()
        failure = await received(body)
        if failure is not None:
            return failure
        prompt = _prompt_of(body)
        text = f"Echo: {prompt}"
        with_ids = bool(body.get("return_token_ids")) or config.token_ids
        with_logprobs = isinstance(body.get("logprobs"), int) and not isinstance(body.get("logprobs"), bool)
        completion_id = f"cmpl-{uuid.uuid4().hex[:12]}"
        model = body.get("model") or MODEL
        prompt_ids = tokenize(prompt)
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(text),
            "total_tokens": len(prompt_ids) + len(text),
        }
        if not body.get("stream"):
            choice: Dict[str, Any] = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            if with_ids:
                choice["prompt_token_ids"] = prompt_ids
                choice["token_ids"] = tokenize(text)
            if with_logprobs:
                choice["logprobs"] = _text_logprobs(text)
            return JSONResponse(
                {
                    "id": completion_id,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[str]:
            def chunk(choices: List[Dict[str, Any]], **extra: Any) -> str:
                payload = {
                    "id": completion_id,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": choices,
                    **extra,
                }
                return f"data: {json.dumps(payload)}\n\n"

            offset = 0
            for i, word in enumerate(text.split(" ")):
                piece = word if i == 0 else " " + word
                choice: Dict[str, Any] = {"index": 0, "text": piece, "finish_reason": None, "logprobs": None}
                if with_ids:
                    choice["token_ids"] = tokenize(piece)
                    if i == 0:
                        choice["prompt_token_ids"] = prompt_ids
                if with_logprobs:
                    choice["logprobs"] = _text_logprobs(piece, offset)
                offset += len(piece)
                yield chunk([choice])
            yield chunk([{"index": 0, "text": "", "finish_reason": "stop", "logprobs": None}])
            if include_usage:
                yield chunk([], usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class FakeOpenAIServer:
    """Runs the fake API (or another FastAPI ``app``, such as a scripted stand-in) with uvicorn in a background thread.

    Usage::

        with FakeOpenAIServer() as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="test")
    """

    def __init__(self, config: Optional[FakeOpenAIConfig] = None, *, app: Optional[FastAPI] = None) -> None:
        self.config = config or FakeOpenAIConfig()
        self.port = pick_free_port("127.0.0.1")
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(
            uvicorn.Config(
                app or create_app(self.config), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
        )
        self._thread: Optional[threading.Thread] = None

    def start(self) -> FakeOpenAIServer:
        """Start serving; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self._server.run, name="fake-openai", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("The fake OpenAI server did not start.")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main() -> None:
    """Serve the fake API in the foreground: ``python tests/fake_openai.py --port 8000 [--token-ids]``."""
    import argparse

    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible chat and text completions server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-ids", action="store_true", help="Always return vLLM-style token ids.")
    parser.add_argument("--delay", type=float, default=0.0, help="Seconds to wait before answering.")
    args = parser.parse_args()
    config = FakeOpenAIConfig(delay=args.delay, token_ids=args.token_ids)
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
