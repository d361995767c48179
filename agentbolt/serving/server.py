"""OpenAI-compatible HTTP server around a :class:`~agentbolt.serving.transformers_engine.TransformersEngine`.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``. Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``: 400 for invalid requests and context overflow, 404 for an
unknown model, 503 while the model is loading.

With ``"return_token_ids": true`` (vLLM's extension) chat responses carry ``prompt_token_ids`` at the top level
and ``token_ids`` in every choice (in every streamed chunk, the ids of that chunk); completion choices carry both
``prompt_token_ids`` and ``token_ids``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import signal
import threading
import time
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Coroutine, Dict, List, Optional, Tuple, TypeVar, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from agentbolt.serving.params import EngineError, GenerationOutput, SamplingParams, SequenceDelta
from agentbolt.serving.protocol import ChatCompletionRequest, CompletionRequest, LoadLoraRequest, UnloadLoraRequest
from agentbolt.serving.tool_parser import ParsedToolCall, ToolCallParser, parse_tool_calls
from agentbolt.serving.transformers_engine import TransformersEngine
from agentbolt.utils.id import generate_id
from agentbolt.utils.server_launcher import LaunchMode, PythonServerLauncher, PythonServerLauncherArgs, pick_free_port

__all__ = ["create_app", "InferenceServer", "ServerError", "find_free_port"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ServerError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param


def _error_response(status: int, message: str, type_: str, param: Optional[str] = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _sse(payload: Dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _normalize_messages(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Flatten content parts to text and fill ``content`` so chat templates can concatenate it."""
    normalized = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role not in {"system", "developer", "user", "assistant", "tool"}:
            raise ServerError(
                400, f"messages[{position}].role must be system, user, assistant or tool", param="messages"
            )
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in {"text", "input_text"}:
                    raise ServerError(400, f"messages[{position}]: only text content parts are supported")
                texts.append(str(part.get("text", "")))
            content = "".join(texts)
        elif content is None:
            if role != "assistant" or not message.get("tool_calls"):
                raise ServerError(400, f"messages[{position}].content is required", param="messages")
            content = ""
        elif not isinstance(content, str):
            raise ServerError(400, f"messages[{position}].content must be a string or a list of parts")
        item = dict(message)
        item["role"] = "system" if role == "developer" else role
        item["content"] = content
        normalized.append(item)
    return normalized


class _Handler:
    """Request handling shared by the routes."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self.load_error: Optional[BaseException] = None

    def require_loaded(self) -> None:
        if self.load_error is not None:
            raise ServerError(500, f"model failed to load: {self.load_error}", "server_error")
        if not self.engine.loaded:
            raise ServerError(503, "model is loading, retry shortly", "service_unavailable")

    def adapter_for(self, model: Optional[str]) -> Optional[str]:
        engine = self.engine
        if model is None or model in {engine.served_name, engine.model_ref}:
            return None
        if model in engine.adapters:
            return model
        raise ServerError(404, f"The model `{model}` does not exist.", "not_found_error", "model")

    def model_name(self, model: Optional[str]) -> str:
        return model or self.engine.served_name

    # ------------------------------------------------------------------ logprobs formatting

    def _token_text(self, token_id: int) -> str:
        return str(self.engine.tokenizer.decode([token_id]))

    def chat_logprobs(
        self, token_ids: List[int], logprobs: Optional[List[float]], tops: Optional[List[List[Tuple[int, float]]]]
    ) -> Optional[Dict[str, Any]]:
        if logprobs is None:
            return None
        content = []
        for position, (token_id, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
            text = self._token_text(token_id)
            alternatives = []
            for alt_id, alt_logprob in tops[position] if tops else []:
                alt_text = self._token_text(alt_id)
                alternatives.append({"token": alt_text, "logprob": alt_logprob, "bytes": list(alt_text.encode())})
            content.append(
                {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": alternatives}
            )
        return {"content": content}

    def completion_logprobs(
        self,
        token_ids: List[int],
        logprobs: Optional[List[float]],
        tops: Optional[List[List[Tuple[int, float]]]],
        offset: int,
    ) -> Optional[Dict[str, Any]]:
        if logprobs is None:
            return None
        tokens = [self._token_text(t) for t in token_ids]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        top = None
        if tops:
            top = [{self._token_text(alt): lp for alt, lp in entry} for entry in tops]
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets}

    # ------------------------------------------------------------------ chat

    def chat_prompt(self, body: ChatCompletionRequest) -> List[int]:
        messages = _normalize_messages(body.messages)
        tools = body.tools if body.tools_enabled() else None
        template = getattr(self.engine.tokenizer, "chat_template", None) or ""
        if tools and "tools" not in template:
            raise ServerError(400, "this model's chat template does not support tools", param="tools")
        return self.engine.encode_chat(messages, tools, **(body.chat_template_kwargs or {}))

    def chat_response(self, body: ChatCompletionRequest, output: GenerationOutput) -> Dict[str, Any]:
        choices = []
        completion_tokens = 0
        for choice in output.choices:
            completion_tokens += len(choice.token_ids)
            message: Dict[str, Any] = {"role": "assistant", "content": choice.text}
            finish: Optional[str] = choice.finish_reason
            if body.tools_enabled():
                content, calls = parse_tool_calls(choice.text)
                message["content"] = content
                if calls:
                    message["tool_calls"] = [call.to_openai() for call in calls]
                    finish = "tool_calls" if finish == "stop" else finish
            entry: Dict[str, Any] = {
                "index": choice.index,
                "message": message,
                "logprobs": self.chat_logprobs(choice.token_ids, choice.logprobs, choice.top_logprobs),
                "finish_reason": finish,
            }
            if body.return_token_ids:
                entry["token_ids"] = choice.token_ids
            choices.append(entry)
        response: Dict[str, Any] = {
            "id": f"chatcmpl-{generate_id(24)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name(body.model),
            "choices": choices,
            "usage": {
                "prompt_tokens": len(output.prompt_token_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(output.prompt_token_ids) + completion_tokens,
            },
        }
        if body.return_token_ids:
            response["prompt_token_ids"] = output.prompt_token_ids
        return response

    async def chat_stream(
        self,
        body: ChatCompletionRequest,
        prompt: List[int],
        stream: AsyncGenerator[List[SequenceDelta], None],
        first: List[SequenceDelta],
    ) -> AsyncIterator[str]:
        base = {
            "id": f"chatcmpl-{generate_id(24)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name(body.model),
        }
        parsers = [ToolCallParser() for _ in range(body.n)] if body.tools_enabled() else None
        call_counts = [0] * body.n
        for index in range(body.n):
            opening: Dict[str, Any] = {
                **base,
                "choices": [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            if body.return_token_ids and index == 0:
                opening["prompt_token_ids"] = prompt
            yield _sse(opening)
        async for event in _relay_deltas(
            body.include_usage,
            base,
            prompt,
            stream,
            first,
            lambda delta: self._chat_chunk_choice(body, delta, parsers, call_counts),
        ):
            yield event

    def _chat_chunk_choice(
        self,
        body: ChatCompletionRequest,
        delta: SequenceDelta,
        parsers: Optional[List[ToolCallParser]],
        call_counts: List[int],
    ) -> Dict[str, Any]:
        text = delta.text
        calls: List[ParsedToolCall] = []
        finish: Optional[str] = delta.finish_reason
        if parsers is not None:
            parser = parsers[delta.index]
            text, calls = parser.feed(delta.text)
            if finish is not None:
                rest, more = parser.finish()
                text, calls = text + rest, calls + more
        payload: Dict[str, Any] = {}
        if text:
            payload["content"] = text
        if calls:
            payload["tool_calls"] = [self._indexed(call, call_counts, delta.index) for call in calls]
        if finish == "stop" and call_counts[delta.index]:
            finish = "tool_calls"
        choice: Dict[str, Any] = {
            "index": delta.index,
            "delta": payload,
            "logprobs": self.chat_logprobs(delta.token_ids, delta.logprobs, delta.top_logprobs),
            "finish_reason": finish,
        }
        if body.return_token_ids:
            choice["token_ids"] = delta.token_ids
        return choice

    @staticmethod
    def _indexed(call: ParsedToolCall, call_counts: List[int], choice: int) -> Dict[str, Any]:
        entry = call.to_openai(index=call_counts[choice])
        call_counts[choice] += 1
        return entry

    # ------------------------------------------------------------------ completions

    def completion_prompts(self, body: CompletionRequest) -> List[List[int]]:
        prompts = []
        for prompt in body.prompts():
            if isinstance(prompt, str):
                prompts.append(self.engine.encode(prompt))
            elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                prompts.append(list(prompt))
            else:
                raise ServerError(
                    400, "prompt must be a string, a list of strings, or token id list(s)", param="prompt"
                )
        return prompts

    def completion_choice(self, body: CompletionRequest, prompt: List[int], index: int, choice: Any) -> Dict[str, Any]:
        entry: Dict[str, Any] = {
            "index": index,
            "text": choice.text,
            "logprobs": self.completion_logprobs(choice.token_ids, choice.logprobs, choice.top_logprobs, 0),
            "finish_reason": choice.finish_reason,
        }
        if body.return_token_ids:
            entry["prompt_token_ids"] = prompt
            entry["token_ids"] = choice.token_ids
        return entry


def create_app(engine: TransformersEngine, *, load: bool = True) -> FastAPI:
    """Build the FastAPI application.

    Args:
        engine: The engine to serve. If it is not loaded yet and ``load`` is true, it is loaded in a background
            thread at startup while ``/health`` and the API answer 503.
        load: Start (load) the engine at application startup.

    Returns:
        The application.
    """
    handler = _Handler(engine)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader: Optional[threading.Thread] = None
        if load:

            def start() -> None:
                try:
                    engine.start()
                except BaseException as exc:  # reported by /health and the API
                    logger.exception("Model failed to load")
                    handler.load_error = exc

            loader = threading.Thread(target=start, name="agentbolt-engine-loader", daemon=True)
            loader.start()
        yield
        if loader is not None:
            await asyncio.to_thread(loader.join)
        await asyncio.to_thread(engine.stop)

    app = FastAPI(title="agentbolt inference server", lifespan=lifespan)
    app.state.engine = engine
    app.state.handler = handler

    @app.exception_handler(ServerError)
    async def _server_error(_: Request, exc: ServerError) -> JSONResponse:
        return _error_response(exc.status, exc.message, exc.type, exc.param)

    @app.exception_handler(EngineError)
    async def _engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return _error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        location = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{location}: {first.get('msg', 'invalid request')}" if location else str(first.get("msg", exc))
        return _error_response(400, message, "invalid_request_error", location or None)

    @app.get("/health")
    async def health() -> JSONResponse:
        if handler.load_error is not None:
            return JSONResponse({"status": "error", "error": str(handler.load_error)}, status_code=500)
        if not engine.loaded:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "weight_version": engine.weight_version})

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        handler.require_loaded()
        created = int(time.time())
        data = [
            {
                "id": engine.served_name,
                "object": "model",
                "created": created,
                "owned_by": "agentbolt",
                "root": engine.model_ref,
                "parent": None,
                "max_model_len": engine.max_model_len,
            }
        ]
        for name, path in engine.adapters.items():
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "agentbolt",
                    "root": path,
                    "parent": engine.served_name,
                    "max_model_len": engine.max_model_len,
                }
            )
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest) -> Union[Dict[str, Any], StreamingResponse]:
        handler.require_loaded()
        adapter = handler.adapter_for(body.model)
        params = body.sampling_params()
        prompt = handler.chat_prompt(body)
        if body.stream:
            stream, first = await _open_stream(engine, prompt, params, adapter)
            return StreamingResponse(handler.chat_stream(body, prompt, stream, first), media_type="text/event-stream")
        output = await engine.generate(prompt, params, adapter)
        return handler.chat_response(body, output)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Union[Dict[str, Any], StreamingResponse]:
        handler.require_loaded()
        adapter = handler.adapter_for(body.model)
        params = body.sampling_params()
        prompts = handler.completion_prompts(body)
        base = {
            "id": f"cmpl-{generate_id(24)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": handler.model_name(body.model),
        }
        if body.stream:
            if len(prompts) != 1:
                raise ServerError(400, "streaming supports a single prompt per request", param="prompt")
            stream, first = await _open_stream(engine, prompts[0], params, adapter)
            return StreamingResponse(
                _completion_stream(handler, body, base, prompts[0], stream, first), media_type="text/event-stream"
            )
        for prompt in prompts:  # validate every prompt before generating any
            engine.check_request(prompt, params, adapter)
        outputs = await asyncio.gather(*(engine.generate(prompt, params, adapter) for prompt in prompts))
        choices = []
        completion_tokens = prompt_tokens = 0
        for number, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
            prompt_tokens += len(prompt)
            for choice in output.choices:
                completion_tokens += len(choice.token_ids)
                choices.append(handler.completion_choice(body, prompt, number * body.n + choice.index, choice))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return {**base, "choices": choices, "usage": usage}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(body: LoadLoraRequest) -> Dict[str, Any]:
        handler.require_loaded()
        await asyncio.to_thread(engine.load_adapter, body.lora_name, body.lora_path)
        return {"status": "ok", "lora_name": body.lora_name, "message": f"LoRA adapter '{body.lora_name}' loaded"}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(body: UnloadLoraRequest) -> Dict[str, Any]:
        handler.require_loaded()
        await asyncio.to_thread(engine.unload_adapter, body.lora_name)
        return {"status": "ok", "lora_name": body.lora_name, "message": f"LoRA adapter '{body.lora_name}' unloaded"}

    return app


async def _open_stream(
    engine: TransformersEngine, prompt: List[int], params: SamplingParams, adapter: Optional[str]
) -> Tuple[AsyncGenerator[List[SequenceDelta], None], List[SequenceDelta]]:
    """Submit a streaming request and wait for its first deltas, so that invalid requests still get a 4xx."""
    stream = engine.stream(prompt, params, adapter)
    try:
        first = await anext(stream)
    except BaseException:
        await stream.aclose()
        raise
    return stream, first


async def _completion_stream(
    handler: _Handler,
    body: CompletionRequest,
    base: Dict[str, Any],
    prompt: List[int],
    stream: AsyncGenerator[List[SequenceDelta], None],
    first: List[SequenceDelta],
) -> AsyncIterator[str]:
    offsets = [0] * body.n
    sent_prompt = False

    def to_choice(delta: SequenceDelta) -> Dict[str, Any]:
        nonlocal sent_prompt
        choice: Dict[str, Any] = {
            "index": delta.index,
            "text": delta.text,
            "logprobs": handler.completion_logprobs(
                delta.token_ids, delta.logprobs, delta.top_logprobs, offsets[delta.index]
            ),
            "finish_reason": delta.finish_reason,
        }
        offsets[delta.index] += len(delta.text)
        if body.return_token_ids:
            choice["token_ids"] = delta.token_ids
            if not sent_prompt:
                choice["prompt_token_ids"] = prompt
                sent_prompt = True
        return choice

    async for event in _relay_deltas(body.include_usage, base, prompt, stream, first, to_choice):
        yield event


async def _relay_deltas(
    include_usage: bool,
    base: Dict[str, Any],
    prompt: List[int],
    stream: AsyncGenerator[List[SequenceDelta], None],
    first: List[SequenceDelta],
    to_choice: Callable[[SequenceDelta], Dict[str, Any]],
) -> AsyncIterator[str]:
    """SSE chunks of a streamed generation: one per delta, an error event on engine failure, usage, ``[DONE]``."""
    completion_tokens = 0
    try:
        batch: Optional[List[SequenceDelta]] = first
        while batch is not None:
            for delta in batch:
                completion_tokens += len(delta.token_ids)
                yield _sse({**base, "choices": [to_choice(delta)]})
            batch = await anext(stream, None)
    except EngineError as exc:
        yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None, "code": 500}})
    finally:
        await stream.aclose()
    if include_usage:
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt) + completion_tokens,
        }
        yield _sse({**base, "choices": [], "usage": usage})
    yield "data: [DONE]\n\n"


find_free_port = pick_free_port
"""A TCP port that is free on ``host`` right now (the launcher's port picker, under this module's older name)."""


class InferenceServer:
    """Run the inference server, in the foreground or in a background thread.

    Args:
        engine: Engine to serve (loaded at startup if needed).
        host: Bind address (default loopback only).
        port: TCP port; ``0`` picks a free one.
        log_level: uvicorn log level.
    """

    def __init__(
        self, engine: TransformersEngine, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning"
    ):
        self.engine = engine
        self.host = host
        self.port = port or find_free_port(host)
        self.log_level = log_level
        self.app = create_app(engine)
        self._launcher: Optional[PythonServerLauncher] = None

    @property
    def base_url(self) -> str:
        """Base URL of the OpenAI-compatible API (``http://host:port/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    def _new_launcher(self, launch_mode: LaunchMode) -> PythonServerLauncher:
        # No health check at start-up: /health answers 503 until the model is loaded, which start() waits for.
        args = PythonServerLauncherArgs(
            port=self.port,
            host=self.host,
            launch_mode=launch_mode,
            log_level=logging.getLevelName(self.log_level.upper()),
            thread_join_timeout=30.0,
        )
        # The app's lifespan (loading and stopping the engine) runs around serving.
        self._launcher = PythonServerLauncher(
            self.app, args, serve_context=lambda: self.app.router.lifespan_context(self.app)
        )
        return self._launcher

    def run(self) -> None:
        """Serve in the foreground until SIGINT or SIGTERM, then stop gracefully."""
        launcher = self._new_launcher("asyncio")

        async def serve() -> None:
            task = asyncio.current_task()
            assert task is not None
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
            with contextlib.suppress(asyncio.CancelledError):
                await launcher.run_forever()

        asyncio.run(serve())

    def start(self, wait_loaded: bool = True, timeout: float = 600.0) -> None:
        """Serve in a background thread; return once listening (and, if ``wait_loaded``, once the model is loaded).

        Raises:
            RuntimeError: The server did not start, or the model failed to load, within ``timeout``.
        """
        launcher = self._new_launcher("thread")
        launcher.args.startup_timeout = timeout
        deadline = time.monotonic() + timeout
        _run_blocking(launcher.start())
        while wait_loaded and not self.engine.loaded:
            if time.monotonic() > deadline:
                raise RuntimeError("model did not load in time")
            if self.app.state.handler.load_error is not None:
                raise RuntimeError(f"model failed to load: {self.app.state.handler.load_error}")
            if not launcher.is_running():
                raise RuntimeError("inference server stopped while loading the model")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop a server started with :meth:`start` (and its engine)."""
        if self._launcher is not None:
            _run_blocking(self._launcher.stop())
            self._launcher = None


def _run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, also when the calling thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
