"""The gateway's FastAPI application: OpenAI-compatible routes that forward to backends and record each call.

Routes (each also under ``/v1`` and under ``/rollout/{rollout_id}/attempt/{attempt_id}[/v1]``):
``POST /chat/completions``, ``POST /completions``, ``GET /models``, and Anthropic's ``POST /messages`` (translated
to a chat completion for OpenAI-compatible backends, see :mod:`agentbolt.gateway.anthropic`); plus ``GET /health``
and ``POST /flush``.

The hot path parses the request JSON once (orjson), picks a deployment, rewrites ``model`` (and adds the token-id
extensions for backends that support them), and relays the answer: complete bodies as they are, streams event by
event as they arrive. Everything needed to build the span is handed to the span writer
(:class:`~agentbolt.store.span_writer.SpanWriter`), which builds and stores spans in batches on a background task
and rides out store outages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
)

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.background import BackgroundTask
from starlette.types import Scope

from agentbolt.gateway import anthropic
from agentbolt.gateway.metrics import CallOutcome, GatewayMetrics
from agentbolt.gateway.recording import CallRecord, decode_answer
from agentbolt.gateway.routing import Deployment, ModelRouter, UnknownModelError
from agentbolt.gateway.sampling import SamplingDefaults, with_sampling_defaults
from agentbolt.gateway.sequence import SequenceAllocator
from agentbolt.gateway.upstream import GatewayError, UpstreamClient, UpstreamResponse, upstream_error_message
from agentbolt.openai_api.errors import ApiError
from agentbolt.openai_api.http import (
    BearerAuthMiddleware,
    body_timeout_error,
    error_response,
    install_body_timeout,
    install_error_handlers,
    off_loop_if_large,
    parse_json_object,
    read_body,
    unauthorized,
    validate_request,
)
from agentbolt.openai_api.openapi import Operation, openapi_document
from agentbolt.openai_api.responses import ChatCompletion, ChatCompletionChunk, Completion, ModelList, StatusResponse
from agentbolt.openai_api.schema import ChatCompletionRequest, CompletionRequest
from agentbolt.semconv import LLM_AGENT_NAME_HEADER, LLM_CALL_ID_HEADER
from agentbolt.store.base import LightningStore
from agentbolt.store.span_writer import SpanWriter
from agentbolt.utils.request_limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from agentbolt.utils.server_launcher import on_shutdown_start

__all__ = ["GatewaySettings", "Gateway", "create_app"]

logger = logging.getLogger("agentbolt.gateway.app")
T = TypeVar("T")
_writer_logger = logging.getLogger("agentbolt.gateway.writer")

_JSON = "application/json"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_DONE_EVENT = (b"data: [DONE]", b"data:[DONE]")
_MESSAGE_STOP_EVENT = (b"event: message_stop", b"event:message_stop")
"""How the last event of a stream starts, with and without the space a server-sent event line may have after its
colon."""
_ANTHROPIC_VERSION = "2023-06-01"
_PREFIXES = ("", "/v1", "/rollout/{rollout_id}/attempt/{attempt_id}", "/rollout/{rollout_id}/attempt/{attempt_id}/v1")


@dataclass
class GatewaySettings:
    """Behaviour switches of the gateway.

    Attributes:
        num_retries: Extra attempts after a 429, a 500-504 answer or a connection that failed before the answer
            began (see ``docs/gateway.md``, Errors).
        timeout: Default seconds allowed for connecting to a backend and for each wait for data.
        return_token_ids: Ask token-id capable backends for prompt and response token ids.
        logprobs: Ask token-id capable backends for the log-probability of each generated token.
        record_spans: Write one span per call bound to a rollout to the store.
        rollout_routes: Serve the ``/rollout/{rollout_id}/attempt/{attempt_id}`` prefixed routes.
        log_messages: Log request and response bodies at DEBUG level.
        api_key: When set, every request except to ``/health`` and ``/openapi.json`` requires
            ``Authorization: Bearer <api_key>`` (or Anthropic's ``x-api-key: <api_key>``); it is checked before
            routing, so without the key an unknown route or a wrong method is a 401 too.
        max_queued_spans: Most calls waiting to be written (while the store is slow or down); beyond that new
            spans are dropped, counted and logged.
        sequence_wait: Longest time an answer is held back waiting for the store's sequence id; past it the answer
            is sent anyway (a slow or unreachable store must not stall agents) and the span keeps the id it gets.
            While the store is known to be unreachable, answers are sent without waiting.
        stop_timeout: Longest time stopping the gateway waits for buffered spans to reach the store.
        tracker: Metrics backend recording the ``agentbolt.gateway.*`` metrics; None uses the process default
            (``AGENTBOLT_METRICS``), which is no metrics unless configured.
        sampling_defaults: For a call bound to a rollout, add the ``sampling_parameters`` of the rollout's LLM
            resource that the request does not set (see :mod:`agentbolt.gateway.sampling`).
        max_request_bytes: Largest request body accepted (413 beyond).
        body_timeout: Seconds a request body may take to arrive after its headers (408 beyond, and the connection
            is closed).
    """

    num_retries: int = 0
    timeout: float = 600.0
    return_token_ids: bool = True
    logprobs: bool = True
    record_spans: bool = True
    rollout_routes: bool = True
    log_messages: bool = False
    api_key: Optional[str] = None
    max_queued_spans: int = 10000
    sequence_wait: float = 3.0
    stop_timeout: float = 10.0
    tracker: Any = None
    sampling_defaults: bool = True
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT


class Gateway:
    """State of one gateway: routing table, settings, store, and (while serving) the upstream client and writer.

    Args:
        model_list: LiteLLM-style ``model_list`` entries.
        store: Where spans go; ``None`` disables recording.
        settings: Behaviour switches.
    """

    def __init__(
        self,
        model_list: Sequence[Mapping[str, Any]],
        store: Optional[LightningStore] = None,
        settings: Optional[GatewaySettings] = None,
    ) -> None:
        self.router = ModelRouter(model_list)
        self.store = store
        self.settings = settings or GatewaySettings()
        self.upstream: Optional[UpstreamClient] = None
        self.writer: Optional[SpanWriter] = None
        self.sequences: Optional[SequenceAllocator] = None
        self.sampling: Optional[SamplingDefaults] = None
        self._users = 0
        self._cutoff: Optional[asyncio.Future[None]] = None
        self._open_streams: Set[UpstreamResponse] = set()
        from agentbolt.utils.metrics import default_tracker

        tracker = self.settings.tracker if self.settings.tracker is not None else default_tracker()
        self.metrics: Optional[GatewayMetrics] = GatewayMetrics(tracker) if tracker is not None else None

    def update_model_list(self, model_list: Sequence[Mapping[str, Any]]) -> None:
        """Replace the routing table; requests already in flight keep their deployment."""
        self.router = ModelRouter(model_list)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Gateway]:
        """Open the upstream connection pool and the span writer for the duration of serving.

        Re-entrant: when both an ASGI lifespan and a launcher context wrap the same server, only the outermost
        opens and closes the resources.
        """
        self._users += 1
        if self._users == 1:
            self._cutoff = asyncio.get_running_loop().create_future()
            self.upstream = UpstreamClient(num_retries=self.settings.num_retries, timeout=self.settings.timeout)
            if self.store is not None and self.settings.record_spans:
                self.writer = SpanWriter(
                    self.store, max_buffered=self.settings.max_queued_spans, max_batch=512, logger=_writer_logger
                )
                self.writer.start()
                self.sequences = SequenceAllocator(self.store)
            if self.store is not None and self.settings.sampling_defaults:
                self.sampling = SamplingDefaults(self.store)
        try:
            yield self
        finally:
            self._users -= 1
            if self._users == 0:
                if self.writer is not None:
                    await self.writer.close(self.settings.stop_timeout)
                    self.writer = None
                if self.sequences is not None:
                    await self.sequences.close()
                    self.sequences = None
                self.sampling = None
                if self.upstream is not None:
                    await self.upstream.aclose()
                    self.upstream = None
                self._cutoff = None

    def cut_off_calls(self, after: float) -> None:
        """End, ``after`` seconds from now, every call still waiting on a backend (the server is stopping).

        Each such call is answered with a 503 ``gateway_shutdown`` error (a stream ends with an error event) and
        recorded as failed, while the span writer still runs: a call cut off by a shutdown leaves a span, like any
        other failed call, instead of vanishing with the cancelled request.
        """
        if self._cutoff is None or self._cutoff.done() or math.isinf(after):
            return
        asyncio.get_running_loop().call_later(max(0.0, after), self._cut_off)

    def _cut_off(self) -> None:
        if self._cutoff is None or self._cutoff.done():
            return
        self._cutoff.set_result(None)
        if self._open_streams:
            logger.warning("Stopping: ending %d stream(s) still open to a backend", len(self._open_streams))
        for stream in list(self._open_streams):
            stream.abort()

    @property
    def cut_off(self) -> bool:
        """Whether calls still waiting on a backend have been ended because the server is stopping."""
        return self._cutoff is not None and self._cutoff.done()

    async def before_cutoff(self, wait: Awaitable[T], discard: Callable[[T], None]) -> T:
        """Await ``wait``, unless the server's cut-off comes first: then raise the ``gateway_shutdown`` error.

        ``discard`` releases a result that arrives after the cut-off (an open upstream response).
        """
        cutoff = self._cutoff
        if cutoff is None:
            return await wait
        task = asyncio.ensure_future(wait)
        if not cutoff.done():
            try:
                await asyncio.wait((task, cutoff), return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                task.cancel()
                raise
        if task.done() and not cutoff.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            discard(await task)
        raise shutdown_error()

    def stream_opened(self, stream: UpstreamResponse) -> None:
        """Track ``stream`` until :meth:`stream_closed`, so a cut-off can end it."""
        self._open_streams.add(stream)
        if self.cut_off:
            stream.abort()

    def stream_closed(self, stream: UpstreamResponse) -> None:
        """Stop tracking ``stream``."""
        self._open_streams.discard(stream)

    def prepare_payload(self, body: Dict[str, Any], deployment: Deployment, endpoint: str) -> bytes:
        """Request body for ``deployment``: upstream model name and, where supported, token ids and logprobs."""
        payload = dict(body)
        payload["model"] = deployment.upstream_model
        if deployment.token_ids:
            if self.settings.return_token_ids:
                payload["return_token_ids"] = True
            if self.settings.logprobs:
                # Chat completions take a boolean; legacy completions take the number of alternatives, and 0 already
                # returns each sampled token's log-probability.
                if endpoint == "chat/completions" and not payload.get("logprobs"):
                    payload["logprobs"] = True
                elif endpoint != "chat/completions" and payload.get("logprobs") is None:
                    payload["logprobs"] = 1
        return orjson.dumps(payload)

    def health(self) -> Dict[str, Any]:
        """Gateway status: configured models and span-writer counters; backends are not contacted."""
        report: Dict[str, Any] = {"status": "ok", "models": self.router.model_names}
        if self.writer is not None:
            report["spans"] = self.writer.stats()
        return report

    async def flush(self, timeout: Optional[float]) -> bool:
        """Wait until the span of every call answered so far is in the store (True) or ``timeout`` passes (False)."""
        if self.writer is None:
            return True
        return await self.writer.flush(timeout)


_LARGE_BODY_BYTES = 1 << 20
"""Bodies (of requests and answers) from this size on are decoded, and requests checked, on a worker thread."""


def _ignore(_: object) -> None:
    """Nothing to release."""


def shutdown_error() -> GatewayError:
    """The error of a call the gateway ended because it is stopping."""
    return GatewayError(
        503, "The gateway is stopping: the call was ended before the backend finished answering", "gateway_shutdown"
    )


def _error_response(error: ApiError, **extra: Any) -> Response:
    return error_response(error, **extra)


_REQUEST_MODELS = {"chat/completions": ChatCompletionRequest, "completions": CompletionRequest}
_Model = TypeVar("_Model", str, Optional[str])
"""The model a request names: a Messages request must name one; an OpenAI one is checked after reading."""


def _stream_usage(received: List[bytes]) -> Optional[Dict[str, Any]]:
    """The ``usage`` of a streamed answer: backends send it in one of the last events (when asked to)."""
    tail = b"".join(received[-4:])
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    start = tail.rfind(b"data:", 0, at)
    end = tail.find(b"\n", at)
    try:
        event = orjson.loads(tail[start + 5 : end if end >= 0 else len(tail)])
    except orjson.JSONDecodeError:
        return None
    usage = event.get("usage") if isinstance(event, dict) else None
    return usage if isinstance(usage, dict) else None


def _has_event(events: bytes, markers: Tuple[bytes, ...]) -> bool:
    """Whether one of the complete server-sent ``events`` starts with one of ``markers``.

    Only at the start of a line: the marker's text inside an event's JSON (an answer quoting ``data: [DONE]``) is
    escaped content, and JSON strings hold no raw line break.
    """
    return any(events.startswith(marker) or b"\n" + marker in events for marker in markers)


def _complete_events(buffer: bytes) -> int:
    """Length of the prefix of ``buffer`` made of complete server-sent events."""
    lf = buffer.rfind(b"\n\n")
    crlf = buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _ended(event: bytes) -> bytes:
    """``event``, the last of a stream, with the blank line that ends a server-sent event (clients drop an event
    without it, and an error event sent after it would be read as part of it)."""
    return event + (b"\n" if event.endswith(b"\n") else b"\n\n")


_OPEN_PATHS = ("/health", "/openapi.json")
"""Paths served without the API key."""


def _is_messages_path(path: str) -> bool:
    """Whether ``path`` is one of the Anthropic Messages routes (whose errors are in Anthropic's shape)."""
    return path.endswith("/messages")


def _refusal(scope: Scope) -> Response:
    """The 401 for a request without the API key: Anthropic's shape on the Messages routes, OpenAI's elsewhere."""
    if _is_messages_path(scope["path"]):
        message = "Missing or wrong API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'"
        return _anthropic_error(401, message)
    return _error_response(unauthorized())


def _body_timeout_error(scope: Dict[str, Any], message: str) -> bytes:
    """The 408's body for a request whose body did not arrive in time, in the shape of its route's errors."""
    if _is_messages_path(scope["path"]):
        return anthropic.anthropic_error_body(408, message)
    return body_timeout_error(scope, message)


def _anthropic_error(status: int, message: str) -> Response:
    """An error response in Anthropic's shape."""
    return Response(anthropic.anthropic_error_body(status, message), status_code=status, media_type=_JSON)


def _as_anthropic_error(response: Response) -> Response:
    """``response`` with an error body in Anthropic's shape (successes and streams are returned as they are)."""
    if response.status_code < 400 or isinstance(response, StreamingResponse):
        return response
    body = anthropic.anthropic_error_from_openai(response.status_code, bytes(response.body))
    headers = {k: v for k, v in response.headers.items() if k in ("retry-after", "www-authenticate")}
    return Response(body, status_code=response.status_code, media_type=_JSON, headers=headers)


def _anthropic_error_event(error: GatewayError) -> bytes:
    return anthropic.anthropic_error_event(error.status_code, error.message)


def _translatable_error_event(error: GatewayError) -> bytes:
    """A chat stream's error event that also carries its HTTP status (read by the Messages translation)."""
    return b"data: " + error.to_body(http_status=error.status_code) + b"\n\n"


_NOT_A_CHUNK = "The backend sent a stream event that is not a chat chunk"


@contextlib.contextmanager
def _untranslatable(what: str) -> Iterator[None]:
    """Turn what translating a backend's answer that is not a chat completion (or a stream event that is not a chunk)
    raises into a 502 ``upstream_malformed_response`` saying ``what``."""
    try:
        yield
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise GatewayError(502, f"{what}: {exc}", "upstream_malformed_response") from exc


@dataclass
class _MessagesTranslation:
    """How the chat answer to a ``/v1/messages`` call becomes the Messages answer its client asked for.

    Translating happens before the call is recorded: an answer the client cannot be given (a 502 instead) is
    recorded as failed, not as a sample the agent saw.
    """

    model: str
    stop_sequences: List[str]

    def answer(self, completion: Dict[str, Any]) -> bytes:
        """The Messages response for a complete chat answer.

        Raises:
            GatewayError: 502 when ``completion`` is not a chat completion the translation can read.
        """
        with _untranslatable("The backend's answer is not a chat completion the gateway can translate"):
            return orjson.dumps(anthropic.chat_to_message(completion, self.model, self.stop_sequences))

    def stream(self) -> _StreamTranslation:
        """A translator for one streamed answer."""
        return _StreamTranslation(anthropic.ChatStreamTranslator(self.model, self.stop_sequences))


class _StreamTranslation:
    """A chat completion stream turned into a Messages event stream, as the relay forwards it."""

    def __init__(self, translator: anthropic.ChatStreamTranslator) -> None:
        self._translator = translator

    def feed(self, events: bytes) -> bytes:
        """The Messages events for complete chat ``events``.

        Raises:
            GatewayError: 502 when an event is not a chat chunk the translation can read.
        """
        with _untranslatable(_NOT_A_CHUNK):
            return self._translator.feed(events)

    def close(self) -> bytes:
        """The events still owed once the chat stream ended (see :meth:`ChatStreamTranslator.close`).

        Raises:
            GatewayError: 502 when the stream's last event is not a chat chunk the translation can read.
        """
        with _untranslatable(_NOT_A_CHUNK):
            return self._translator.close()

    def fail(self, error: GatewayError, partial: bytes) -> bytes:
        """The events ending a stream broken by ``error``: ``partial`` (the lines of an event whose blank line never
        came) if it translates, then Anthropic's ``error`` event (nothing once the message was complete)."""
        out = b""
        if partial:
            with contextlib.suppress(GatewayError):
                out = self.feed(partial)
        # Once an error event is fed the translator is finished and translates nothing more: these cannot fail.
        return out + self._translator.feed(_translatable_error_event(error)) + self._translator.close()


@dataclass
class _IncomingCall:
    """One call as it reached the gateway: its HTTP request, the rollout attempt it belongs to (both ids None outside
    one), the id its answer and span carry, and its metrics record (None without metrics)."""

    request: Request
    rollout_id: Optional[str]
    attempt_id: Optional[str]
    call_id: str
    outcome: Optional[CallOutcome] = None


class _Handler:
    """Request handling bound to one :class:`Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def _submit(self, call: Optional[CallRecord]) -> None:
        writer = self.gateway.writer
        if call is None or writer is None:
            return
        if not writer.submit(call) and call.sequence_id is not None:
            call.sequence_id.cancel()  # the span was dropped (buffer full): no sequence id is needed for it

    async def _await_sequence_id(self, call: Optional[CallRecord]) -> None:
        """Wait for the sequence id requested at request start, so calls made after this answer sort after it."""
        if call is None or call.sequence_id is None or call.sequence_id.done():
            return
        sequences = self.gateway.sequences
        if sequences is not None and sequences.unreachable:
            return  # the id comes once the store is back; holding the answer until then would stall the agent
        try:
            await asyncio.wait_for(asyncio.shield(call.sequence_id), self.gateway.settings.sequence_wait)
        except asyncio.TimeoutError:
            logger.warning(
                "The store did not issue a sequence id within %g s (rollout %s); answering without waiting.",
                self.gateway.settings.sequence_wait,
                call.rollout_id,
            )
        except Exception:  # failures are logged by the writer, which drops the span
            pass

    def _start_call(self, incoming: _IncomingCall, endpoint: str, body: Dict[str, Any]) -> Optional[CallRecord]:
        gateway = self.gateway
        rollout_id, attempt_id = incoming.rollout_id, incoming.attempt_id
        if rollout_id is None or attempt_id is None or gateway.sequences is None:
            return None
        # The sequence id is taken when the request starts; the store call overlaps with the upstream call.
        sequence_id = gateway.sequences.allocate(rollout_id, attempt_id)
        return CallRecord(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            endpoint=endpoint,
            request=body,
            start_time=time.time(),
            agent_name=incoming.request.headers.get(LLM_AGENT_NAME_HEADER),
            call_id=incoming.call_id,
        )

    async def models(self, request: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "agentbolt"}
            for name in self.gateway.router.model_names
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=_JSON)

    async def health(self, request: Request) -> Response:
        return Response(orjson.dumps(self.gateway.health()), media_type=_JSON)

    async def flush(self, request: Request) -> Response:
        try:
            raw = await read_body(request, self.gateway.settings.max_request_bytes)
            body = parse_json_object(raw, request.headers.get("content-type")) if raw.strip() else {}
        except ApiError as exc:
            return _error_response(exc)
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            return _error_response(
                GatewayError(
                    400, f"'timeout' must be a non-negative number of seconds, got {timeout!r}", "invalid_request_error"
                )
            )
        flushed = await self.gateway.flush(timeout)
        return Response(
            orjson.dumps({"flushed": flushed, "spans": self.gateway.health().get("spans")}), media_type=_JSON
        )

    async def completion(
        self, request: Request, endpoint: str, rollout_id: Optional[str] = None, attempt_id: Optional[str] = None
    ) -> Response:
        """Answer one completion request; every answer carries the call's id in the ``x-request-id`` header.

        The id is what the span of the call records as ``agentbolt.llm.call_id``; the OpenAI SDK exposes it to the
        caller (and to agentbolt's SDK instrumentation) as the response's request id, which lets the adapters tell
        that the gateway's span and the SDK's span record the same call.
        """
        return await self._answer(self._completion, request, endpoint, rollout_id, attempt_id)

    async def messages(
        self, request: Request, rollout_id: Optional[str] = None, attempt_id: Optional[str] = None
    ) -> Response:
        """Answer one Anthropic Messages request; the call's id is also in the ``request-id`` header (Anthropic's)."""
        response = await self._answer(self._messages, request, "messages", rollout_id, attempt_id)
        response.headers["request-id"] = response.headers[LLM_CALL_ID_HEADER]
        return response

    async def _answer(
        self,
        handle: Callable[[_IncomingCall, str], Awaitable[Response]],
        request: Request,
        endpoint: str,
        rollout_id: Optional[str],
        attempt_id: Optional[str],
    ) -> Response:
        """Run ``handle`` for one call with its id and metrics."""
        call_id = f"agentbolt-{secrets.token_hex(12)}"
        metrics = self.gateway.metrics
        outcome = CallOutcome(endpoint, time.perf_counter()) if metrics is not None else None
        response = await handle(_IncomingCall(request, rollout_id, attempt_id, call_id, outcome), endpoint)
        response.headers[LLM_CALL_ID_HEADER] = call_id
        if metrics is not None and outcome is not None and not isinstance(response, StreamingResponse):
            outcome.status = response.status_code
            # Recorded once the answer is sent, off the caller's latency.
            response.background = BackgroundTask(metrics.record, outcome, time.perf_counter())
        return response

    async def _checked_body(
        self, request: Request, validate: Callable[[Dict[str, Any]], _Model]
    ) -> Tuple[Dict[str, Any], _Model, int]:
        """The request's JSON object, the model ``validate`` reads from it, and the body's size in bytes.

        The same door as agentbolt serve's: size, content type, JSON, nesting, then ``validate`` (the strict schema);
        off the event loop for a large body.

        Raises:
            ApiError: The body fails one of the checks.
        """
        raw = await read_body(request, self.gateway.settings.max_request_bytes)
        content_type = request.headers.get("content-type")

        def checked() -> Tuple[Dict[str, Any], _Model]:
            body = parse_json_object(raw, content_type)
            return body, validate(body)

        body, model = await off_loop_if_large(len(raw), _LARGE_BODY_BYTES, checked)
        return body, model, len(raw)

    async def _completion(self, incoming: _IncomingCall, endpoint: str) -> Response:
        gateway = self.gateway
        try:
            body, model, _ = await self._checked_body(
                incoming.request, lambda body: validate_request(_REQUEST_MODELS[endpoint], body).model
            )
        except ApiError as exc:
            return _error_response(exc)
        if model is None:
            return _error_response(
                GatewayError(
                    400, "The request must name a model in the 'model' field", "invalid_request_error", "model"
                )
            )
        try:
            candidates = gateway.router.candidates(model)
        except UnknownModelError as exc:
            error = ApiError(404, str(exc), "not_found_error", "model", code="model_not_found")
            return _error_response(error, available_models=exc.available)
        if candidates[0].speaks_messages:
            message = f"Model {model!r} is served by an Anthropic Messages API backend: call POST /v1/messages"
            return _error_response(GatewayError(400, message, "invalid_request_error", "model"))
        return await self._forward(incoming, endpoint, body, model, candidates)

    async def _messages(self, incoming: _IncomingCall, endpoint: str) -> Response:
        """A Messages call: passed through to Anthropic-compatible backends, translated for the others."""
        request = incoming.request
        try:
            body, model, size = await self._checked_body(request, anthropic.validate_messages_request)
            candidates = self.gateway.router.candidates(model)
            if candidates[0].speaks_messages:
                headers = {
                    "anthropic-version": request.headers.get("anthropic-version", _ANTHROPIC_VERSION),
                    **(
                        {"anthropic-beta": request.headers["anthropic-beta"]}
                        if "anthropic-beta" in request.headers
                        else {}
                    ),
                }
                response = await self._forward(incoming, "v1/messages", body, model, candidates, headers)
                return _as_anthropic_error(response)
            stops = body.get("stop_sequences") or []
            chat = await off_loop_if_large(size, _LARGE_BODY_BYTES, lambda: anthropic.messages_to_chat(body))
        except UnknownModelError as exc:
            return _anthropic_error(404, str(exc))
        except ApiError as exc:
            return _anthropic_error(exc.status, exc.message)
        translation = _MessagesTranslation(model, list(stops))
        response = await self._forward(incoming, "chat/completions", chat, model, candidates, translation=translation)
        return _as_anthropic_error(response)

    async def _forward(
        self,
        incoming: _IncomingCall,
        endpoint: str,
        body: Dict[str, Any],
        model: str,
        candidates: Sequence[Deployment],
        headers: Optional[Mapping[str, str]] = None,
        translation: Optional[_MessagesTranslation] = None,
    ) -> Response:
        """Send a checked request to ``candidates``, record the call, and relay the answer.

        ``translation``: the chat answer is for a ``/v1/messages`` client, and is translated before the call is
        recorded (an answer that cannot be translated fails the call).
        """
        gateway = self.gateway
        rollout_id, outcome = incoming.rollout_id, incoming.outcome
        messages_api = candidates[0].speaks_messages
        if outcome is not None:
            outcome.model = model
        upstream_client = gateway.upstream
        if upstream_client is None:
            return _error_response(GatewayError(503, "The gateway is not serving yet", "gateway_not_ready"))
        if gateway.settings.log_messages:
            logger.debug("Request to %s: %s", endpoint, orjson.dumps(body)[:4000])

        recorded = body
        if messages_api:
            if rollout_id is not None:  # recorded as the chat call it is equivalent to, like every other call
                recorded = anthropic.messages_to_chat(body, strict=False)
        elif rollout_id is not None and gateway.sampling is not None:
            body = recorded = with_sampling_defaults(body, await gateway.sampling.for_call(rollout_id, model))
        call = self._start_call(incoming, endpoint, recorded)
        if call is not None:
            call.messages_api = messages_api
        payloads = [gateway.prepare_payload(body, d, endpoint) for d in candidates[: upstream_client.num_retries + 1]]
        try:
            upstream = await gateway.before_cutoff(
                upstream_client.send(candidates, endpoint, payloads, headers), UpstreamResponse.close
            )
        except GatewayError as exc:
            if call is not None:
                call.fail(exc.status_code, exc.message, exc.error_type)
            if outcome is not None:
                outcome.error_type = exc.error_type
            self._submit(call)
            await self._await_sequence_id(call)
            return _error_response(exc)
        if call is not None:
            call.deployment = upstream.deployment
        if body.get("stream") is True and upstream.status_code < 400 and "text/event-stream" in upstream.content_type:
            await self._await_sequence_id(call)
            if messages_api:
                relay = self._relay(upstream, call, outcome, _MESSAGE_STOP_EVENT, _anthropic_error_event)
            elif translation is not None:
                relay = self._relay(upstream, call, outcome, translation=translation.stream())
            else:
                relay = self._relay(upstream, call, outcome)
            return StreamingResponse(
                relay,
                status_code=upstream.status_code,
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        return await self._complete(upstream, call, outcome, incoming.request, translation)

    async def _complete(
        self,
        upstream: UpstreamResponse,
        call: Optional[CallRecord],
        outcome: Optional[CallOutcome] = None,
        request: Optional[Request] = None,
        translation: Optional[_MessagesTranslation] = None,
    ) -> Response:
        """Read a whole upstream body, check it, record it, and answer with it unchanged (or translated for a
        Messages client: an answer that cannot be translated is a 502, recorded with the answer but as failed).

        A client that went away while the backend answered (it timed out, say) never saw the answer: the call is
        recorded with its answer but as failed (499 ``client_closed``), as a stream the client left is, so that a
        retried call does not leave a successful sample behind that the agent never read.
        """
        deployment = upstream.deployment
        try:
            data = await self.gateway.before_cutoff(upstream.read(), _ignore)
        except GatewayError as exc:
            return await self._fail(call, exc, outcome)
        finally:
            upstream.close()
        status = upstream.status_code
        if status >= 400:
            # Client errors (bad parameters, context too long...) and the server errors that are not retried (see
            # RETRYABLE_STATUS) are passed through as the backend wrote them.
            if call is not None:
                kind = "upstream_client_error" if status < 500 else "upstream_server_error"
                call.fail(status, upstream_error_message(data), kind)
            self._submit(call)
            await self._await_sequence_id(call)
            return Response(data, status_code=status, media_type=upstream.content_type or _JSON)
        try:
            parsed = await off_loop_if_large(len(data), _LARGE_BODY_BYTES, lambda: decode_answer(data))
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            error = GatewayError(
                502,
                f"Upstream {deployment.shown_base} returned malformed JSON (HTTP {status}, expected an object): "
                f"{data[:200].decode('utf-8', errors='replace')!r}",
                "upstream_malformed_response",
            )
            return await self._fail(call, error, outcome)
        if self.gateway.settings.log_messages:
            logger.debug("Response from %s: %s", deployment.shown_base, data[:4000])
        if translation is not None:
            try:
                data = translation.answer(parsed)
            except GatewayError as error:
                if call is not None:
                    call.succeed(status, parsed)
                return await self._fail(call, error, outcome)
        if call is not None:
            call.succeed(status, parsed)
            if request is not None and await request.is_disconnected():
                call.fail(499, "The client closed the connection before the answer arrived", "client_closed")
        if outcome is not None:
            outcome.usage = parsed.get("usage")
        self._submit(call)
        await self._await_sequence_id(call)
        return Response(data, status_code=status, media_type=_JSON)

    async def _fail(
        self, call: Optional[CallRecord], error: GatewayError, outcome: Optional[CallOutcome] = None
    ) -> Response:
        logger.warning("%s", error.message)
        if outcome is not None:
            outcome.error_type = error.error_type
        if call is not None:
            call.fail(error.status_code, error.message, error.error_type)
        self._submit(call)
        await self._await_sequence_id(call)
        return _error_response(error)

    async def _relay(
        self,
        upstream: UpstreamResponse,
        call: Optional[CallRecord],
        outcome: Optional[CallOutcome] = None,
        done_marker: Tuple[bytes, ...] = _DONE_EVENT,
        error_event: Callable[[GatewayError], bytes] = lambda error: b"data: " + error.to_body() + b"\n\n",
        translation: Optional[_StreamTranslation] = None,
    ) -> AsyncIterator[bytes]:
        """Forward complete server-sent events as they arrive; keep a copy for the span.

        ``done_marker`` is how the stream's last event starts; ``error_event`` writes the event that ends a stream
        broken by the backend. With ``translation`` the client gets the events translated (for a Messages client);
        an event that cannot be translated breaks the stream like a backend failure, before the span is handed
        over.
        """
        received: List[bytes] = []
        pending = b""
        error: Optional[GatewayError] = None
        submitted = False
        finished = False

        def relayed(events: bytes) -> bytes:
            return events if translation is None else translation.feed(events)

        self.gateway.stream_opened(upstream)
        try:
            try:
                async for chunk in upstream.iter_chunks():
                    if outcome is not None and outcome.first_token is None:
                        outcome.first_token = time.perf_counter()
                    received.append(chunk)
                    pending += chunk
                    cut = _complete_events(pending)
                    if cut:
                        out, pending = pending[:cut], pending[cut:]
                        sent = relayed(out)
                        if not finished and _has_event(out, done_marker):
                            finished = True
                            if call is not None:
                                # Hand the span over before the client reads the end of the stream: once the agent
                                # is done with the answer, a flush covers this call.
                                call.stream_finished(b"".join(received), None)
                                self._submit(call)
                                submitted = True
                        if sent:
                            yield sent
                if pending:  # a last event without its blank line: ended here, so that it reaches the client
                    finished = finished or _has_event(pending, done_marker)
                    sent, pending = relayed(_ended(pending)), b""
                    if sent:
                        yield sent
                if not finished:
                    raise GatewayError(502, "The backend's stream ended before its last event", "stream_incomplete")
                if translation is not None:
                    tail = translation.close()
                    if tail:
                        yield tail
            except GatewayError as exc:
                # Events already sent cannot be taken back: end the stream with an error event the SDKs raise.
                error = shutdown_error() if self.gateway.cut_off else exc
                logger.warning("%s", error.message)
                # A last event whose lines are whole but whose blank line never came: ended here, so that the
                # error event stays an event of its own.
                partial = pending + b"\n" if pending.endswith(b"\n") else b""
                if translation is not None:
                    yield translation.fail(error, partial)
                else:
                    if partial:
                        yield partial
                    yield error_event(error)
        except BaseException:
            # The client went away (or the server is shutting down) before the stream ended.
            if error is None:
                error = GatewayError(499, "The client closed the connection before the stream ended", "client_closed")
            raise
        finally:
            if call is not None and not submitted:
                call.stream_finished(b"".join(received), error)
                self._submit(call)
            self.gateway.stream_closed(upstream)
            upstream.close()
            metrics = self.gateway.metrics
            if metrics is not None and outcome is not None:
                outcome.status = error.status_code if error is not None else upstream.status_code
                outcome.error_type = error.error_type if error is not None else None
                outcome.usage = _stream_usage(received)
                await metrics.record(outcome, time.perf_counter())


def create_app(gateway: Gateway) -> FastAPI:
    """Build the FastAPI application serving ``gateway``.

    The app's lifespan opens the gateway's resources; launchers that disable lifespans enter
    :meth:`Gateway.serving` themselves.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with gateway.serving():
            yield

    app = FastAPI(title="agentbolt LLM gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    # Calls still waiting on a backend end a little before the server's grace period does, so their answers go
    # out and their spans reach the writer before it closes.
    on_shutdown_start(app, lambda grace: gateway.cut_off_calls(grace - min(1.0, grace / 4)))
    handler = _Handler(gateway)
    install_error_handlers(app)
    if gateway.settings.api_key is not None:
        app.add_middleware(
            BearerAuthMiddleware,
            api_key=gateway.settings.api_key,
            open_paths=_OPEN_PATHS,
            x_api_key=True,
            refusal=_refusal,
        )
    install_body_timeout(app, gateway.settings.body_timeout, _body_timeout_error)
    document = openapi_document(
        "agentbolt LLM gateway",
        "1",
        "OpenAI-compatible gateway: forwards each call to its backend and records it (token ids included) in the "
        "store when the call is made under /rollout/{rollout_id}/attempt/{attempt_id}. Every route also exists "
        "without /v1. Backend answers and client errors (4xx) are passed through unchanged.",
        _operations(gateway.settings.rollout_routes),
        common_errors=(404,),
        auth=gateway.settings.api_key is not None,
    )
    app.openapi = lambda: document  # type: ignore[method-assign]

    # Plain Starlette routes: the handlers read the request themselves, so FastAPI's per-request dependency
    # resolution is not needed on the hot path.
    async def chat(request: Request) -> Response:
        params = request.path_params
        return await handler.completion(request, "chat/completions", params.get("rollout_id"), params.get("attempt_id"))

    async def text(request: Request) -> Response:
        params = request.path_params
        return await handler.completion(request, "completions", params.get("rollout_id"), params.get("attempt_id"))

    async def messages(request: Request) -> Response:
        params = request.path_params
        return await handler.messages(request, params.get("rollout_id"), params.get("attempt_id"))

    prefixes = _PREFIXES if gateway.settings.rollout_routes else _PREFIXES[:2]
    for prefix in prefixes:
        app.add_route(f"{prefix}/messages", messages, methods=["POST"], include_in_schema=False)
        app.add_route(f"{prefix}/chat/completions", chat, methods=["POST"], include_in_schema=False)
        app.add_route(f"{prefix}/completions", text, methods=["POST"], include_in_schema=False)
        app.add_route(f"{prefix}/models", handler.models, methods=["GET"], include_in_schema=False)
    app.add_route("/health", handler.health, methods=["GET"], include_in_schema=False)
    app.add_route("/flush", handler.flush, methods=["POST"], include_in_schema=False)
    return app


class FlushResponse(BaseModel):
    """Answer of ``POST /flush``."""

    model_config = ConfigDict(extra="allow")

    flushed: bool
    spans: Optional[Dict[str, Any]] = None


def _operations(rollout_routes: bool) -> List[Operation]:
    """The gateway's documented routes (each also exists without ``/v1``)."""
    forwarding_errors = (404, 429, 502, 503, 504)
    prefixes = ["/v1", "/rollout/{rollout_id}/attempt/{attempt_id}/v1"] if rollout_routes else ["/v1"]
    operations = [
        Operation(
            "get",
            "/health",
            "Gateway status: configured models and span-writer counters (never contacts a backend).",
            StatusResponse,
            public=True,
        ),
        Operation(
            "post",
            "/flush",
            'Wait until the span of every call answered so far is in the store (optional body {"timeout": s}).',
            FlushResponse,
            errors=(400,),
        ),
    ]
    for prefix in prefixes:
        bound = " (recorded as a span of the rollout's attempt)" if "rollout" in prefix else ""
        operations += [
            Operation(
                "post",
                f"{prefix}/chat/completions",
                f"Forward a chat completion to the model's backend{bound}.",
                ChatCompletion,
                ChatCompletionRequest,
                ChatCompletionChunk,
                errors=forwarding_errors,
            ),
            Operation(
                "post",
                f"{prefix}/completions",
                f"Forward a text completion to the model's backend{bound}.",
                Completion,
                CompletionRequest,
                Completion,
                errors=forwarding_errors,
            ),
            Operation("get", f"{prefix}/models", "The configured model names.", ModelList),
        ]
    return operations
