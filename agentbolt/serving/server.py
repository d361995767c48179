"""OpenAI-compatible HTTP server around a :class:`~agentbolt.serving.transformers_engine.TransformersEngine`.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``, and the OpenAPI document at ``/openapi.json``.

Every body goes through the same door as the gateway's (:mod:`agentbolt.openai_api`): size limit (413), content type
(415), JSON parsing with orjson (400 for invalid UTF-8, lone surrogates, deep nesting), the strict request schema
(400 naming the field), then this server's own rules (unsupported features, context length, token ids, the work
limits of :class:`ServingLimits`). Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``
everywhere. With an API key, every route but ``/health`` needs ``Authorization: Bearer <key>``. Adapters load over
HTTP only from the configured directories.

With ``"return_token_ids": true`` (vLLM's extension) chat responses carry ``prompt_token_ids`` at the top level
and ``token_ids`` in every choice (in every streamed chunk, the ids of that chunk); completion choices carry both
``prompt_token_ids`` and ``token_ids``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from agentbolt.openai_api.errors import ApiError
from agentbolt.openai_api.http import (
    BearerAuthMiddleware,
    client_closed,
    error_response,
    install_body_timeout,
    install_error_handlers,
    off_loop_if_large,
    parse_json_object,
    read_body,
    unauthorized_response,
    validate_request,
)
from agentbolt.openai_api.openapi import Operation, openapi_document
from agentbolt.openai_api.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ModelCard,
    ModelList,
    StatusResponse,
)
from agentbolt.serving.params import (
    AdapterNotLoadedError,
    ContextOverflowError,
    EngineError,
    EngineOverloadedError,
    GenerationFailedError,
    GenerationOutput,
    SamplingParams,
    SequenceDelta,
    SequenceOutput,
)
from agentbolt.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    LoadLoraRequest,
    UnloadLoraRequest,
    chat_sampling_params,
    completion_sampling_params,
    demanded_tool_call,
    normalize_messages,
)
from agentbolt.serving.token_bytes import TokenBytes
from agentbolt.serving.tool_parser import TOOL_CALL_OPEN, ParsedToolCall, ToolCallParser, parse_tool_calls
from agentbolt.serving.transformers_engine import TransformersEngine
from agentbolt.utils import event_loop
from agentbolt.utils.checks import check_positive
from agentbolt.utils.id import generate_id
from agentbolt.utils.request_limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from agentbolt.utils.server_launcher import LaunchMode, PythonServerLauncher, PythonServerLauncherArgs, pick_free_port

__all__ = ["create_app", "InferenceServer", "ServerError", "ServingLimits", "find_free_port"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
G = TypeVar("G", ChatCompletionRequest, CompletionRequest)

ServerError = ApiError
"""An error answered with an OpenAI-style body (the shared :class:`~agentbolt.openai_api.errors.ApiError`)."""

_LOGPROB_FLOOR = -9999.0  # what vLLM reports for impossible tokens: JSON has no -Infinity

_PROMPT_FIELDS = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}
"""The request field holding the prompt on each generation route: what a context-length error names as its
``param``, as OpenAI's API does."""

_ANSWER_INLINE_ENTRIES = 2048
"""Answers with fewer log-probability entries than this (tokens and their alternatives) are built and encoded on the
event loop; larger ones in a worker thread: an answer of n=10 x 1,900 tokens x 20 alternatives took seconds to
build, during which ``/health`` and every other stream waited."""

_PREPARE_INLINE_BYTES = 4096
"""Request bodies smaller than this have their prompts templated, tokenized and checked on the event loop; larger
ones in a worker thread (:func:`asyncio.to_thread`), so that a huge prompt (tokenizing runs at about 1-4 MB/s)
cannot hold up ``/health`` and the other requests' streams. Below the threshold the work takes at most about a
millisecond, while a thread hop costs about 0.1 ms: small requests stay cheap and the loop is never held long."""


@dataclass
class ServingLimits:
    """Bounds on the work one request may ask for (each refusal is a 400 naming the limit and its flag).

    Attributes:
        max_prompts_per_request: Prompts in one ``/v1/completions`` request (``--max-prompts-per-request``).
        max_sequences_per_request: Sequences one request may start: prompts x ``n``
            (``--max-sequences-per-request``).
        max_request_bytes: Largest request body (``--max-request-bytes``; 413 beyond).
        body_timeout: Seconds a request body may take to arrive after its headers (``--body-timeout``; 408 beyond,
            and the connection is closed).

    The engine's ``max_queued_tokens`` (``--max-queued-tokens``) bounds the work queued and running at once.
    """

    max_prompts_per_request: int = 64
    max_sequences_per_request: int = 256
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("max_prompts_per_request", "max_sequences_per_request", "max_request_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.body_timeout = check_positive(self.body_timeout, "body_timeout")


def _dumps(payload: Any) -> bytes:
    return orjson.dumps(payload)


def _sse(payload: Dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _json(payload: Any) -> Response:
    return Response(_dumps(payload), media_type="application/json")


def _logprob(value: float) -> float:
    return max(value, _LOGPROB_FLOOR)


def _model_not_found(model: str) -> ApiError:
    """The 404 for a model that is neither the served one nor a loaded adapter."""
    return ApiError(404, f"The model `{model}` does not exist.", "not_found_error", "model", code="model_not_found")


class _Handler:
    """Request handling shared by the routes."""

    def __init__(
        self, engine: TransformersEngine, limits: ServingLimits, adapter_dirs: Sequence[Union[str, os.PathLike[str]]]
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.adapter_dirs = [Path(directory).expanduser().resolve() for directory in adapter_dirs]
        self.load_error: Optional[BaseException] = None
        self._token_bytes: Optional[TokenBytes] = None  # built at the first logprobs answer
        # Each token's text and bytes, decoded once: an answer with logprobs names thousands of tokens.
        self._token_texts: Dict[int, str] = {}
        self._token_byte_lists: Dict[int, List[int]] = {}

    async def read(self, request: Request, model: Type[M]) -> M:
        """Read, parse and validate a request body (the shared door of both OpenAI-compatible servers)."""
        return (await self._read_sized(request, model))[0]

    async def _read_sized(self, request: Request, model: Type[M]) -> Tuple[M, int]:
        """:meth:`read`, and the size of the body in bytes."""
        raw = await read_body(request, self.limits.max_request_bytes)
        return validate_request(model, parse_json_object(raw, request.headers.get("content-type"))), len(raw)

    def require_loaded(self) -> None:
        if self.load_error is not None:
            raise ApiError(500, f"model failed to load: {self.load_error}", "server_error")
        if not self.engine.loaded:
            raise ApiError(503, "model is loading, retry shortly", "service_unavailable")

    def adapter_for(self, model: Optional[str]) -> Optional[str]:
        engine = self.engine
        if model is None or model in {engine.served_name, engine.model_ref}:
            return None
        if model in engine.adapters:
            return model
        raise _model_not_found(model)

    async def open_generation(
        self, request: Request, model: Type[G], sampling: Callable[[G], SamplingParams]
    ) -> Tuple[G, Optional[str], SamplingParams, int]:
        """A generation request's body, the adapter it names (None: the base model), its sampling parameters and
        the size of its body in bytes, once the model is loaded."""
        body, size = await self._read_sized(request, model)
        self.require_loaded()
        return body, self.adapter_for(body.model), sampling(body), size

    @staticmethod
    async def prepare(size: int, work: Callable[[], T]) -> T:
        """Run ``work``, a request's templating, tokenizing and checking, on the event loop for a body of ``size``
        bytes under :data:`_PREPARE_INLINE_BYTES`, else in a worker thread while the loop serves other requests."""
        return await off_loop_if_large(size, _PREPARE_INLINE_BYTES, work)

    def model_name(self, model: Optional[str]) -> str:
        return model or self.engine.served_name

    def check_prompt_count(self, count: int) -> None:
        """Refuse more prompts in one request than the limit (400 naming it and its flag)."""
        if count > self.limits.max_prompts_per_request:
            raise ApiError(
                400,
                f"{count} prompts in one request is more than the limit of {self.limits.max_prompts_per_request} "
                "(--max-prompts-per-request)",
                param="prompt",
            )

    def admit(self, prompts: List[List[int]], params: SamplingParams) -> None:
        """Refuse a request asking for more work than the limits allow (400 naming the limit and its flag)."""
        limits = self.limits
        self.check_prompt_count(len(prompts))
        sequences = len(prompts) * params.n
        if sequences > limits.max_sequences_per_request:
            raise ApiError(
                400,
                f"this request would start {sequences} sequences ({len(prompts)} prompts x n={params.n}), more than "
                f"the limit of {limits.max_sequences_per_request} (--max-sequences-per-request)",
                param="n",
            )
        cap = self.engine.max_queued_tokens
        if cap is not None:
            cost = sum(self.engine.request_cost(prompt, params) for prompt in prompts)
            if cost > cap:
                raise ApiError(
                    400,
                    f"this request asks for up to {cost} tokens of work (prompt + n x max_tokens), more than the "
                    f"{cap} the server queues at once (--max-queued-tokens); lower max_tokens, n or the prompt",
                    param="max_tokens",
                )

    # ------------------------------------------------------------------ logprobs formatting

    def _token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = str(self.engine.tokenizer.decode([token_id]))
        return text

    def _token_entry(self, token_id: int, logprob: float) -> Dict[str, Any]:
        """A chat logprobs entry: the token's text decoded alone, its log-probability and its own bytes (a token
        holding part of a UTF-8 character has U+FFFD as its text, and that part of the character as its bytes)."""
        byte_list = self._token_byte_lists.get(token_id)
        if byte_list is None:
            if self._token_bytes is None:
                self._token_bytes = TokenBytes(self.engine.tokenizer)
            byte_list = self._token_byte_lists[token_id] = list(self._token_bytes.of(token_id))
        return {"token": self._token_text(token_id), "logprob": _logprob(logprob), "bytes": byte_list}

    def chat_logprobs(
        self, token_ids: List[int], logprobs: Optional[List[float]], tops: Optional[List[List[Tuple[int, float]]]]
    ) -> Optional[Dict[str, Any]]:
        if logprobs is None:
            return None
        content = []
        for position, (token_id, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
            alternatives = (
                [self._token_entry(alt_id, alt_logprob) for alt_id, alt_logprob in tops[position]] if tops else []
            )
            content.append({**self._token_entry(token_id, logprob), "top_logprobs": alternatives})
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
            top = []
            for entry in tops:
                # Alternatives come most likely first; tokens with the same text (byte tokens that are each part
                # of a character all read "\ufffd") keep the most likely one's value.
                alternatives: Dict[str, float] = {}
                for alt, lp in entry:
                    alternatives.setdefault(self._token_text(alt), _logprob(lp))
                top.append(alternatives)
        values = [_logprob(lp) for lp in logprobs]
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": top, "text_offset": offsets}

    # ------------------------------------------------------------------ chat

    def forced_tool_prefix(self, body: ChatCompletionRequest) -> str:
        """Text that starts the answer when ``tool_choice`` demands a call: the model continues a ``<tool_call>``
        (which the request's sampling parameters guide to a declared tool, see
        :func:`~agentbolt.serving.protocol.chat_sampling_params`).

        Raises:
            ApiError: 400 when the chat template does not write tool calls as ``<tool_call>`` blocks.
        """
        demanded = demanded_tool_call(body)
        if demanded is None:
            return ""
        template = getattr(self.engine.tokenizer, "chat_template", None) or ""
        if TOOL_CALL_OPEN not in template:
            raise ApiError(
                400,
                f"tool_choice {body.tool_choice_name!r} needs a chat template that writes tool calls as "
                f"{TOOL_CALL_OPEN} blocks; this model's does not",
                param="tool_choice",
            )
        return demanded[0]

    def prepare_chat(
        self, body: ChatCompletionRequest, params: SamplingParams, adapter: Optional[str]
    ) -> Tuple[str, List[int]]:
        """A chat request's forced answer opening and its prompt, templated, tokenized and checked against the
        context and the work limits (the context is named before the work limits; see :meth:`prepare`)."""
        forced = self.forced_tool_prefix(body)
        prompt = self.chat_prompt(body, forced)
        self.engine.check_request(prompt, params, adapter)
        self.admit([prompt], params)
        return forced, prompt

    def chat_prompt(self, body: ChatCompletionRequest, forced: str) -> List[int]:
        messages = normalize_messages(body)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []] if body.tools_enabled() else None
        template = getattr(self.engine.tokenizer, "chat_template", None) or ""
        if tools and "tools" not in template:
            raise ApiError(400, "this model's chat template does not support tools", param="tools")
        return self.engine.encode_chat(messages, tools, assistant_prefix=forced, **(body.chat_template_kwargs or {}))

    def chat_response(self, body: ChatCompletionRequest, output: GenerationOutput, forced: str = "") -> Dict[str, Any]:
        choices = []
        completion_tokens = 0
        for choice in output.choices:
            completion_tokens += len(choice.token_ids)
            message: Dict[str, Any] = {"role": "assistant", "content": choice.text}
            finish: Optional[str] = choice.finish_reason
            if body.tools_enabled():
                content, calls = parse_tool_calls(forced + choice.text)
                if body.parallel_tool_calls is False:
                    calls = calls[:1]
                message["content"] = content
                if calls:
                    message["tool_calls"] = [call.to_openai() for call in calls]
                    finish = "tool_calls" if finish == "stop" else finish
            choices.append(self._chat_choice(body, choice, "message", message, finish))
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
        forced: str,
    ) -> AsyncIterator[bytes]:
        base = {
            "id": f"chatcmpl-{generate_id(24)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name(body.model),
        }
        n = body.choices
        parsers = [ToolCallParser() for _ in range(n)] if body.tools_enabled() else None
        for parser in parsers or []:
            parser.feed(forced)  # the forced opening of a tool call is held back until its block closes
        call_counts = [0] * n
        for index in range(n):
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
            if body.parallel_tool_calls is False:
                calls = calls[: max(0, 1 - call_counts[delta.index])]
        payload: Dict[str, Any] = {}
        if text:
            payload["content"] = text
        if calls:
            payload["tool_calls"] = [self._indexed(call, call_counts, delta.index) for call in calls]
        if finish == "stop" and call_counts[delta.index]:
            finish = "tool_calls"
        return self._chat_choice(body, delta, "delta", payload, finish)

    def _chat_choice(
        self,
        body: ChatCompletionRequest,
        sequence: Union[SequenceOutput, SequenceDelta],
        key: str,
        content: Dict[str, Any],
        finish: Optional[str],
    ) -> Dict[str, Any]:
        """One entry of ``choices``: the ``message`` (or streamed ``delta``) of a sequence, its logprobs and finish
        reason, and its token ids when the request asks for them."""
        choice: Dict[str, Any] = {
            "index": sequence.index,
            key: content,
            "logprobs": self.chat_logprobs(sequence.token_ids, sequence.logprobs, sequence.top_logprobs),
            "finish_reason": finish,
        }
        _put_stop_reason(choice, sequence)
        if body.return_token_ids:
            choice["token_ids"] = sequence.token_ids
        return choice

    @staticmethod
    def _indexed(call: ParsedToolCall, call_counts: List[int], choice: int) -> Dict[str, Any]:
        entry = call.to_openai(index=call_counts[choice])
        call_counts[choice] += 1
        return entry

    # ------------------------------------------------------------------ completions

    def completion_prompts(self, body: CompletionRequest) -> List[List[int]]:
        prompts = body.prompts()
        self.check_prompt_count(len(prompts))  # before tokenizing a thousand prompts
        return [self.engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]

    def prepare_completion(
        self, body: CompletionRequest, params: SamplingParams, adapter: Optional[str]
    ) -> List[List[int]]:
        """A completion request's prompts, tokenized and checked: every prompt before any is generated, the context
        before the work limits (see :meth:`prepare`)."""
        prompts = self.completion_prompts(body)
        for prompt in prompts:
            self.engine.check_request(prompt, params, adapter)
        self.admit(prompts, params)
        return prompts

    def completion_choice(self, body: CompletionRequest, prompt: List[int], index: int, choice: Any) -> Dict[str, Any]:
        entry: Dict[str, Any] = {
            "index": index,
            "text": choice.text,
            "logprobs": self.completion_logprobs(choice.token_ids, choice.logprobs, choice.top_logprobs, 0),
            "finish_reason": choice.finish_reason,
        }
        _put_stop_reason(entry, choice)
        if body.return_token_ids:
            entry["prompt_token_ids"] = prompt
            entry["token_ids"] = choice.token_ids
        return entry

    # ------------------------------------------------------------------ adapters

    def adapter_path(self, requested: str) -> str:
        """The adapter directory to load, if it lies inside a configured directory.

        Raises:
            ApiError: 403 when loading over HTTP is disabled or the path is outside the configured directories.
        """
        if not self.adapter_dirs:
            raise ApiError(
                403,
                "loading LoRA adapters over HTTP is disabled: start the server with --lora-dir DIR to allow "
                "adapters from DIR",
                param="lora_path",
            )
        if "\x00" in requested:
            raise ApiError(400, "lora_path holds a NUL character, which no path can", param="lora_path")
        path = Path(requested).expanduser()
        resolved = path.resolve() if path.is_absolute() else (self.adapter_dirs[0] / path).resolve()
        if not any(resolved.is_relative_to(directory) for directory in self.adapter_dirs):
            allowed = ", ".join(str(directory) for directory in self.adapter_dirs)
            raise ApiError(
                403,
                f"lora_path {requested!r} is outside the directories adapters may be loaded from ({allowed}; "
                "--lora-dir)",
                param="lora_path",
            )
        return str(resolved)


_API_DESCRIPTION = (
    "OpenAI-compatible inference (agentbolt serve): chat and text completions with vLLM's token-id extensions, "
    'continuous batching, LoRA adapters. Errors are OpenAI\'s {"error": {...}} body.'
)


def _operations() -> List[Operation]:
    generation_errors = (404, 429, 500, 503)
    return [
        Operation(
            "get",
            "/health",
            "Liveness and readiness: 200 once the model is loaded, 503 while it loads.",
            StatusResponse,
            public=True,
            response_description='{"status": "ok", "weight_version": N}.',
            extra_responses={
                503: ('{"status": "loading"} while the model loads.', StatusResponse),
                500: ('{"status": "error", "error": ...} when the model failed to load.', StatusResponse),
            },
        ),
        Operation("get", "/v1/models", "The served model and loaded LoRA adapters.", ModelList, errors=(500, 503)),
        Operation(
            "get",
            "/v1/models/{model}",
            "One model of the list: the served model or a loaded adapter.",
            ModelCard,
            errors=(404, 500, 503),
        ),
        Operation(
            "post",
            "/v1/chat/completions",
            "Generate the next assistant message of a conversation.",
            ChatCompletion,
            ChatCompletionRequest,
            ChatCompletionChunk,
            errors=generation_errors,
        ),
        Operation(
            "post",
            "/v1/completions",
            "Continue one or several text (or token-id) prompts.",
            Completion,
            CompletionRequest,
            Completion,
            errors=generation_errors,
        ),
        Operation(
            "post",
            "/v1/load_lora_adapter",
            "Load a PEFT LoRA adapter from a configured directory (vLLM's route).",
            StatusResponse,
            LoadLoraRequest,
            errors=(403, 500, 503),
        ),
        Operation(
            "post",
            "/v1/unload_lora_adapter",
            "Unload a LoRA adapter (vLLM's route).",
            StatusResponse,
            UnloadLoraRequest,
            errors=(500, 503),
        ),
    ]


def create_app(
    engine: TransformersEngine,
    *,
    load: bool = True,
    api_key: Optional[str] = None,
    adapter_dirs: Sequence[Union[str, os.PathLike[str]]] = (),
    limits: Optional[ServingLimits] = None,
) -> FastAPI:
    """Build the FastAPI application.

    Args:
        engine: The engine to serve. If it is not loaded yet and ``load`` is true, it is loaded in a background
            thread at startup while ``/health`` and the API answer 503.
        load: Start (load) the engine at application startup.
        api_key: When set, every route except ``/health`` requires ``Authorization: Bearer <api_key>``.
        adapter_dirs: Directories ``POST /v1/load_lora_adapter`` may load adapters from; none disables the route
            (403). Adapters loaded in Python (:meth:`TransformersEngine.load_adapter`) are not restricted.
        limits: Per-request work limits (defaults: :class:`ServingLimits`).

    Returns:
        The application.
    """
    handler = _Handler(engine, limits or ServingLimits(), adapter_dirs)

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

    app = FastAPI(title="agentbolt inference server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.handler = handler
    install_error_handlers(app)
    if api_key:
        app.add_middleware(
            BearerAuthMiddleware,
            api_key=api_key,
            open_paths=("/health", "/openapi.json"),
            refusal=unauthorized_response,
        )
    install_body_timeout(app, handler.limits.body_timeout)
    document = openapi_document(
        "agentbolt inference server",
        "1",
        _API_DESCRIPTION,
        _operations(),
        common_errors=(404,),
        auth=bool(api_key),
    )
    app.openapi = lambda: document  # type: ignore[method-assign]

    @app.exception_handler(EngineOverloadedError)
    async def _overloaded(_: Request, exc: EngineOverloadedError) -> Response:
        error = ApiError(429, str(exc), headers={"retry-after": "1"})
        return Response(error.body(), status_code=429, media_type="application/json", headers=error.headers)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> Response:
        if isinstance(exc, AdapterNotLoadedError):  # e.g. unloaded while the request waited for the batch
            return error_response(ApiError(404, str(exc), "not_found_error", "model", code="model_not_found"))
        if isinstance(exc, ContextOverflowError):
            param = _PROMPT_FIELDS.get(getattr(request.scope.get("route"), "path", ""))
            return error_response(ApiError(400, str(exc), param=param, code="context_length_exceeded"))
        return error_response(ApiError(400, str(exc)))

    @app.exception_handler(GenerationFailedError)
    async def _generation_failed(_: Request, exc: GenerationFailedError) -> Response:
        return Response(ApiError(500, str(exc)).body(), status_code=500, media_type="application/json")

    created = int(time.time())

    @app.api_route("/health", methods=["GET", "HEAD"], include_in_schema=False)
    async def health() -> JSONResponse:
        if handler.load_error is not None:
            return JSONResponse({"status": "error", "error": str(handler.load_error)}, status_code=500)
        if not engine.loaded:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "weight_version": engine.weight_version})

    def model_cards() -> List[Dict[str, Any]]:
        """The served model, then each loaded adapter (its parent is the served model); ``created`` is when this
        server started, the same in every answer."""
        handler.require_loaded()
        entries = [(engine.served_name, engine.model_ref, None)]
        entries += [(name, path, engine.served_name) for name, path in engine.adapters.items()]
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "agentbolt",
                "root": root,
                "parent": parent,
                "max_model_len": engine.max_model_len,
            }
            for name, root, parent in entries
        ]

    @app.api_route("/v1/models", methods=["GET", "HEAD"], include_in_schema=False)
    async def models() -> Response:
        return _json({"object": "list", "data": model_cards()})

    @app.get("/v1/models/{model:path}", include_in_schema=False)
    async def model(model: str) -> Response:
        for card in model_cards():
            if card["id"] == model:
                return _json(card)
        raise _model_not_found(model)

    @app.post("/v1/chat/completions", include_in_schema=False)
    async def chat(request: Request) -> Response:
        body, adapter, params, size = await handler.open_generation(
            request, ChatCompletionRequest, chat_sampling_params
        )
        forced, prompt = await handler.prepare(size, lambda: handler.prepare_chat(body, params, adapter))
        if body.streaming:
            stream, first = await _until_disconnected(request, lambda: _open_stream(engine, prompt, params, adapter))
            return StreamingResponse(
                handler.chat_stream(body, prompt, stream, first, forced), media_type="text/event-stream"
            )
        output = await _until_disconnected(request, lambda: engine.generate(prompt, params, adapter))
        return await off_loop_if_large(
            _logprob_entries(output.choices),
            _ANSWER_INLINE_ENTRIES,
            lambda: _json(handler.chat_response(body, output, forced)),
        )

    @app.post("/v1/completions", include_in_schema=False)
    async def completions(request: Request) -> Response:
        body, adapter, params, size = await handler.open_generation(
            request, CompletionRequest, completion_sampling_params
        )
        prompts = await handler.prepare(size, lambda: handler.prepare_completion(body, params, adapter))
        base = {
            "id": f"cmpl-{generate_id(24)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": handler.model_name(body.model),
        }
        if body.streaming:
            if len(prompts) != 1:
                raise ApiError(400, "streaming supports a single prompt per request", param="prompt")
            stream, first = await _until_disconnected(
                request, lambda: _open_stream(engine, prompts[0], params, adapter)
            )
            return StreamingResponse(
                _completion_stream(handler, body, base, prompts[0], stream, first), media_type="text/event-stream"
            )
        outputs = await _until_disconnected(
            request, lambda: _gather_or_cancel([engine.generate(prompt, params, adapter) for prompt in prompts])
        )

        def answer() -> Response:
            choices = []
            completion_tokens = prompt_tokens = 0
            for number, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
                prompt_tokens += len(prompt)
                for choice in output.choices:
                    completion_tokens += len(choice.token_ids)
                    choices.append(handler.completion_choice(body, prompt, number * params.n + choice.index, choice))
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
            return _json({**base, "choices": choices, "usage": usage})

        entries = sum(_logprob_entries(output.choices) for output in outputs)
        return await off_loop_if_large(entries, _ANSWER_INLINE_ENTRIES, answer)

    @app.post("/v1/load_lora_adapter", include_in_schema=False)
    async def load_lora(request: Request) -> Response:
        body = await handler.read(request, LoadLoraRequest)
        handler.require_loaded()
        path = handler.adapter_path(body.lora_path)
        await asyncio.to_thread(engine.load_adapter, body.lora_name, path)
        return _json(
            {"status": "ok", "lora_name": body.lora_name, "message": f"LoRA adapter '{body.lora_name}' loaded"}
        )

    @app.post("/v1/unload_lora_adapter", include_in_schema=False)
    async def unload_lora(request: Request) -> Response:
        body = await handler.read(request, UnloadLoraRequest)
        handler.require_loaded()
        await asyncio.to_thread(engine.unload_adapter, body.lora_name)
        return _json(
            {"status": "ok", "lora_name": body.lora_name, "message": f"LoRA adapter '{body.lora_name}' unloaded"}
        )

    return app


async def _gather_or_cancel(coroutines: List[Awaitable[T]]) -> List[T]:
    """``asyncio.gather`` that cancels the other tasks as soon as one fails (or the caller is cancelled)."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


async def _until_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` while watching the connection: if the client goes away first, cancel it (its sequences leave
    the batch at the next step) instead of generating an answer nobody will read."""
    task = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task not in done:
        await asyncio.wait({task})  # let the cancellation reach the engine's stream, which drops the request
        logger.info("Client disconnected from %s: generation cancelled", request.url.path)
        raise client_closed("the client closed the connection before the answer was ready")
    return task.result()


def _logprob_entries(sequences: Sequence[SequenceOutput]) -> int:
    """How many log-probability entries (tokens and their alternatives) an answer of ``sequences`` holds."""
    return sum(
        len(sequence.token_ids) + sum(len(alternatives) for alternatives in sequence.top_logprobs or ())
        for sequence in sequences
        if sequence.logprobs is not None
    )


async def _disconnected(request: Request) -> None:
    """Return once the client has disconnected (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


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


def _put_stop_reason(choice: Dict[str, Any], sequence: Union[SequenceOutput, SequenceDelta]) -> None:
    """vLLM's ``stop_reason`` on a finished choice: the stop string or stop token id that ended it, null for an EOS
    token or another end."""
    if sequence.finish_reason is not None:
        choice["stop_reason"] = sequence.stop_reason


async def _completion_stream(
    handler: _Handler,
    body: CompletionRequest,
    base: Dict[str, Any],
    prompt: List[int],
    stream: AsyncGenerator[List[SequenceDelta], None],
    first: List[SequenceDelta],
) -> AsyncIterator[bytes]:
    offsets = [0] * body.choices
    sent_prompt = False

    def to_choice(delta: SequenceDelta) -> Dict[str, Any]:
        nonlocal sent_prompt
        logprobs = handler.completion_logprobs(
            delta.token_ids, delta.logprobs, delta.top_logprobs, offsets[delta.index]
        )
        choice: Dict[str, Any] = {
            "index": delta.index,
            "text": delta.text,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason,
        }
        _put_stop_reason(choice, delta)
        if logprobs is not None:  # offsets step by the tokens' text, as in the whole answer (text may be held back)
            offsets[delta.index] += sum(len(token) for token in logprobs["tokens"])
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
) -> AsyncIterator[bytes]:
    """SSE chunks of a streamed generation: one per delta, an error event on engine failure, usage, ``[DONE]``."""
    completion_tokens = 0
    try:
        batch: Optional[List[SequenceDelta]] = first
        while batch is not None:
            for delta in batch:
                completion_tokens += len(delta.token_ids)
                yield _sse({**base, "choices": [to_choice(delta)]})
            batch = await anext(stream, None)
    except (EngineError, GenerationFailedError) as exc:
        yield b"data: " + ApiError(500, str(exc)).body() + b"\n\n"
    finally:
        await stream.aclose()
    if include_usage:
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt) + completion_tokens,
        }
        yield _sse({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


find_free_port = pick_free_port
"""A TCP port that is free on ``host`` right now (the launcher's port picker, under this module's older name)."""


class InferenceServer:
    """Run the inference server, in the foreground or in a background thread.

    Args:
        engine: Engine to serve (loaded at startup if needed).
        host: Bind address (default loopback only).
        port: TCP port; ``0`` picks a free one.
        log_level: uvicorn log level.
        api_key: Require ``Authorization: Bearer <api_key>`` on every route but ``/health``.
        adapter_dirs: Directories ``POST /v1/load_lora_adapter`` may load from (none: the route answers 403).
        limits: Per-request work limits.
    """

    def __init__(
        self,
        engine: TransformersEngine,
        host: str = "127.0.0.1",
        port: int = 8000,
        log_level: str = "warning",
        *,
        api_key: Optional[str] = None,
        adapter_dirs: Sequence[Union[str, os.PathLike[str]]] = (),
        limits: Optional[ServingLimits] = None,
    ):
        self.engine = engine
        self.host = host
        self.port = port or find_free_port(host)
        self.log_level = log_level
        self.api_key = api_key
        self.app = create_app(engine, api_key=api_key, adapter_dirs=adapter_dirs, limits=limits)
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

    def run(self, *, stop_on_load_error: bool = False) -> None:
        """Serve in the foreground until SIGINT or SIGTERM, then stop gracefully.

        Args:
            stop_on_load_error: Stop as soon as the model fails to load, instead of serving 503s that say why.

        Raises:
            RuntimeError: With ``stop_on_load_error``, the model failed to load.
        """
        launcher = self._new_launcher("asyncio")
        handler = self.app.state.handler

        async def serve() -> None:
            task = asyncio.current_task()
            assert task is not None
            # SIGINT too: a process started in the background by a non-interactive shell inherits SIGINT ignored,
            # and Python then never turns it into KeyboardInterrupt.
            for signum in (signal.SIGTERM, signal.SIGINT):
                asyncio.get_running_loop().add_signal_handler(signum, task.cancel)

            async def stop_when_load_fails() -> None:
                while handler.load_error is None:
                    await asyncio.sleep(0.2)
                task.cancel()

            watcher = asyncio.ensure_future(stop_when_load_fails()) if stop_on_load_error else None
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await launcher.run_forever()
            finally:
                if watcher is not None:
                    watcher.cancel()

        event_loop.run(serve())
        if stop_on_load_error and handler.load_error is not None:
            raise RuntimeError(f"the model failed to load: {handler.load_error}")

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
