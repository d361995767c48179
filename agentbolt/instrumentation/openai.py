"""OpenTelemetry instrumentation of the OpenAI Python SDK's completions (chat and text; sync, async, streaming, tools).

Each chat completion (``client.chat.completions.create(...)``, ``parse``, the ``stream()`` helper) becomes one
``openai.chat.completion`` span, and each legacy text completion (``client.completions.create(...)``) one
``openai.completion`` span. Their attributes (OpenTelemetry GenAI keys plus the token ids and logprobs agentbolt's
adapters read) are built by :mod:`agentbolt.llm_call_attributes`, the module the LLM gateway uses too, so a call
records the same keys whether the SDK or the gateway traced it.

The SDK is patched where every API call of every client passes: the ``request`` method of its base clients
(``SyncAPIClient`` / ``AsyncAPIClient``). A POST to ``/chat/completions`` or ``/completions`` is recorded from the JSON
body the SDK sends (its ``extra_body`` included); other calls pass through untouched. The resource methods
(``create``, ``with_raw_response.create``...) are left as they are, so a method a client bound before instrumenting
(the SDK's ``with_raw_response`` keeps the ``create`` it was first built with, as LangChain's ``ChatOpenAI`` does) is
recorded too, and nothing is recorded once uninstrumented.

Streaming responses are wrapped: chunks pass through unchanged while content, tool-call fragments, usage, token
ids and logprobs are accumulated; the span ends when the stream is exhausted, closed, or fails, or when the caller
drops a stream it stopped reading (it then ends at the time of the last chunk read).

``with_raw_response`` calls (what LangChain's ``ChatOpenAI`` makes) are recorded the same way: the response side is
read from the raw response's JSON body, without parsing it for the caller; for a raw streaming response, the stream
its ``parse()`` returns is the wrapped one. ``with_streaming_response`` too: its body is read when the call returns
(httpx keeps it for the caller's ``parse()``).

While instrumented, the SDK's default HTTP clients also share one TLS context per trust configuration. Building
one parses the system CA bundle (~20 ms of CPU), and the SDK builds a fresh one for every ``OpenAI()`` /
``AsyncOpenAI()`` client; agents commonly create a client per rollout, which made TLS setup the largest CPU cost
of a short rollout. The shared context is built by the HTTP library itself with the same settings (``trust_env``,
``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), so what is trusted does not change. Clients given their own ``verify``,
``cert``, ``http2`` or ``transport`` keep building their own.

We patch the SDK ourselves instead of using ``opentelemetry-instrumentation-openai-v2`` or the Traceloop package:
the former records message content as log events rather than the flattened span attributes the adapters need,
the latter's attribute layout changes between releases, neither records token ids or per-token logprobs (needed
for RL training), and a direct wrapper keeps the per-call overhead in the tens of microseconds.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import os
import ssl
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple, Type

from opentelemetry import trace as trace_api
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentbolt.llm_call_attributes import CompletionRecord as _Response
from agentbolt.llm_call_attributes import request_attributes
from agentbolt.semconv import LLM_AGENT_NAME, LLM_AGENT_NAME_HEADER, LLM_CALL_ID, LLM_CALL_ID_HEADER
from agentbolt.utils.otel import record_exception_event

__all__ = [
    "instrument_openai",
    "uninstrument_openai",
    "is_openai_instrumented",
    "SPAN_NAME",
    "TEXT_COMPLETION_SPAN_NAME",
]

logger = logging.getLogger(__name__)

SPAN_NAME = "openai.chat.completion"
"""Name of the span of one chat completion (``POST /chat/completions``)."""
TEXT_COMPLETION_SPAN_NAME = "openai.completion"
"""Name of the span of one legacy text completion (``POST /completions``)."""
_SCOPE = "agentbolt.instrumentation.openai"

_lock = threading.Lock()
_originals: Dict[Tuple[type, str], Callable[..., Any]] = {}
_ssl_lock = threading.Lock()
_ssl_contexts: Dict[Tuple[Any, ...], ssl.SSLContext] = {}
_tracer_cache: Optional[Tuple[Any, trace_api.Tracer]] = None


_collection = threading.local()
"""``running`` is True in a thread while the garbage collector runs in it (see :meth:`_StreamRecorder.__del__`)."""


def _track_collection(phase: str, info: Dict[str, int]) -> None:
    _collection.running = phase == "start"


def _get_tracer() -> trace_api.Tracer:
    """The instrumentation tracer of the current global provider (cached until the provider changes)."""
    global _tracer_cache
    provider = trace_api.get_tracer_provider()
    cached = _tracer_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = provider.get_tracer(_SCOPE)
    _tracer_cache = (provider, tracer)
    return tracer


# --------------------------------------------------------------------------------------------------------------------
# Span lifecycle


def _record_call_id(span: trace_api.Span, outcome: Any) -> None:
    """Record the ``x-request-id`` of the call's HTTP response (:data:`~agentbolt.semconv.LLM_CALL_ID`).

    ``outcome`` is what the SDK returned or raised: a parsed object (``_request_id``), a raw response or an API error
    (``request_id``), or a stream (the headers of its ``response``). The LLM gateway issues a unique one per call and
    records it too, which is how the adapters pair the two records of one call.
    """
    call_id = getattr(outcome, "_request_id", None) or getattr(outcome, "request_id", None)
    if not isinstance(call_id, str):
        headers = getattr(getattr(outcome, "response", None), "headers", None)
        call_id = headers.get(LLM_CALL_ID_HEADER) if headers is not None else None
    if isinstance(call_id, str) and call_id:
        span.set_attribute(LLM_CALL_ID, call_id)


def _fail(span: trace_api.Span, exc: BaseException) -> None:
    """End ``span`` as failed: ``error.type``, an ``exception`` event and an ``ERROR`` status, all writable (see
    :func:`~agentbolt.utils.otel.record_exception_event`)."""
    message = record_exception_event(span, exc)
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"))
    span.end()


_NUMBER_LISTS = ("prompt_token_ids", "response_token_ids", "response_logprobs")


def _set_attributes(span: trace_api.Span, attributes: Dict[str, Any]) -> None:
    """Set attributes, attaching the (long, already validated) number lists without per-element checks.

    OpenTelemetry validates list attributes element by element, which costs about a millisecond per thousand
    token ids; our token-id and logprob lists are built as lists of int / float above, so they are stored as
    tuples directly in the SDK span's attribute container (falling back to the public API elsewhere).
    """
    lists = {key: attributes.pop(key) for key in _NUMBER_LISTS if key in attributes}
    span.set_attributes(attributes)
    if not lists:
        return
    container = getattr(span, "_attributes", None)
    setter = getattr(container, "_setitem_locked", None)
    lock = getattr(container, "_lock", None)
    if setter is None or lock is None or getattr(container, "_immutable", True) or not span.is_recording():
        span.set_attributes(lists)
        return
    with lock:
        for key, values in lists.items():
            setter(key, tuple(values))


def _record_response(span: trace_api.Span, response: _Response) -> None:
    """Set the response's attributes on ``span``; a failure is logged, never raised into the caller."""
    try:
        _set_attributes(span, response.attributes())
    except Exception:
        logger.exception("Failed to record the LLM call's response on the span")


def _finish(span: trace_api.Span, response: _Response, end_time: Optional[int] = None) -> None:
    _record_response(span, response)
    span.set_status(Status(StatusCode.OK))
    span.end(end_time=end_time)


class _Endpoint(NamedTuple):
    """An API endpoint whose calls are recorded: the span name and ``gen_ai.operation.name`` of its calls."""

    span_name: str
    operation: str


_CHAT = _Endpoint(SPAN_NAME, "chat")
_TEXT_COMPLETION = _Endpoint(TEXT_COMPLETION_SPAN_NAME, "text_completion")


def _endpoint(options: Any) -> Optional[_Endpoint]:
    """The recorded endpoint a request of the SDK (its ``FinalRequestOptions``) calls, or None for any other call."""
    method = getattr(options, "method", None)
    url = getattr(options, "url", None)
    if not isinstance(method, str) or method.lower() != "post" or not isinstance(url, str):
        return None
    path = url.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return _CHAT
    if path.endswith("/completions"):
        return _TEXT_COMPLETION
    return None


def _request_body(options: Any) -> Mapping[str, Any]:
    """The JSON body the SDK sends: its parameters (already made JSON-ready by the SDK) and the call's ``extra_body``."""
    body = getattr(options, "json_data", None)
    extra = getattr(options, "extra_json", None)
    body = body if isinstance(body, Mapping) else {}
    return {**body, **extra} if isinstance(extra, Mapping) and extra else body


def _agent_name(client: Any, options: Any) -> Optional[str]:
    """The agent name a request carries in the :data:`~agentbolt.semconv.LLM_AGENT_NAME_HEADER` header (the call's
    ``extra_headers`` first, then the client's ``default_headers``), as the gateway reads it; None without one."""
    for headers in (getattr(options, "headers", None), getattr(client, "default_headers", None)):
        if not isinstance(headers, Mapping):
            continue
        for key, value in headers.items():
            if isinstance(key, str) and key.lower() == LLM_AGENT_NAME_HEADER and isinstance(value, str) and value:
                return value
    return None


def _start_span(endpoint: _Endpoint, body: Mapping[str, Any], agent_name: Optional[str]) -> trace_api.Span:
    span = _get_tracer().start_span(endpoint.span_name, kind=SpanKind.CLIENT)
    if span.is_recording():
        try:
            span.set_attributes(request_attributes(body, operation=endpoint.operation, provider="openai"))
            if agent_name is not None:
                span.set_attribute(LLM_AGENT_NAME, agent_name)
        except Exception:
            logger.exception("Failed to record the LLM call's request on the span")
    return span


class _StreamRecorder:
    """Accumulates a streamed response and ends its span exactly once."""

    def __init__(self, stream: Any, span: trace_api.Span) -> None:
        self._stream = stream
        self._span = span
        self._response = _Response()
        self._ended = False
        self._last_read_ns: Optional[int] = None

    def _end(self, exc: Optional[BaseException] = None, end_time: Optional[int] = None) -> None:
        if self._ended:
            return
        self._ended = True
        if exc is not None:
            _record_response(self._span, self._response)
            _fail(self._span, exc)
        else:
            _finish(self._span, self._response, end_time)

    def _received(self, chunk: Any) -> None:
        self._last_read_ns = time.time_ns()
        try:
            self._response.add_chunk(chunk)
        except Exception:  # the caller gets its chunk whatever recording it did
            logger.exception("Failed to record a completion stream chunk")

    def __del__(self) -> None:
        # A caller that stops reading early (``break`` in its loop) and never closes the stream would otherwise leave
        # the span open forever, and the call would be missing from the trace. It ends with what was received, at
        # the time the last chunk arrived.
        if self.__dict__.get("_ended", True):
            return
        self._ended = True
        end = functools.partial(_finish, self._span, self._response, self.__dict__.get("_last_read_ns"))
        with contextlib.suppress(Exception):  # never raise from a finalizer (e.g. during interpreter shutdown)
            if getattr(_collection, "running", False):
                # A garbage collection may start inside a span processor's locked section (at any allocation), and
                # ending the span here would take that lock again: end it on a thread of its own.
                threading.Thread(target=end, name="agentbolt-stream-end", daemon=True).start()
            else:  # the caller dropped its last reference: a point of its own code
                end()

    @contextlib.contextmanager
    def _reading(self, end_of_stream: Type[BaseException]) -> Iterator[None]:
        """Read one chunk: ``end_of_stream`` ends the span as complete, any other error as failed; both re-raise."""
        try:
            yield
        except end_of_stream:
            self._end()
            raise
        except BaseException as exc:
            self._end(exc)
            raise

    def __getattr__(self, name: str) -> Any:
        if name == "_stream":
            raise AttributeError(name)
        return getattr(self._stream, name)


class _TracedStream(_StreamRecorder):
    """Transparent wrapper of ``openai.Stream`` that records the accumulated response when the stream ends."""

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        with self._reading(StopIteration):
            chunk = next(self._stream)
        self._received(chunk)
        return chunk

    def __enter__(self) -> _TracedStream:
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying stream and end the span with what was received."""
        try:
            self._stream.close()
        finally:
            self._end()


class _AsyncTracedStream(_StreamRecorder):
    """Transparent wrapper of ``openai.AsyncStream`` (see :class:`_TracedStream`)."""

    def __aiter__(self) -> _AsyncTracedStream:
        return self

    async def __anext__(self) -> Any:
        with self._reading(StopAsyncIteration):
            chunk = await self._stream.__anext__()
        self._received(chunk)
        return chunk

    async def __aenter__(self) -> _AsyncTracedStream:
        return self

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the underlying stream and end the span with what was received."""
        try:
            await self._stream.close()
        finally:
            self._end()

    async def aclose(self) -> None:
        """Alias of :meth:`close`."""
        await self.close()


def _is_stream(result: Any) -> bool:
    return hasattr(result, "__next__") or hasattr(result, "__anext__")


def _is_raw_response(result: Any) -> bool:
    """Whether ``result`` is what ``with_raw_response`` returns (the SDK's ``LegacyAPIResponse``)."""
    return hasattr(result, "http_response") and callable(getattr(result, "parse", None))


def _record_raw(raw: Any, span: trace_api.Span, streaming: bool, wrapper: Callable[[Any, trace_api.Span], Any]) -> None:
    """Record a ``with_raw_response`` / ``with_streaming_response`` result on ``span`` and end it (or hand it to the
    stream wrapper).

    A complete response's body is read (``with_raw_response`` has read it already; ``with_streaming_response`` reads
    it on demand, and reading it here keeps it for the caller) and its JSON is recorded as it is, so the caller's own
    ``parse()`` is untouched. For a stream, the SDK's ``parse()`` returns the same stream object on every call (it
    caches it per target type); the wrapped stream is put in that cache, so the caller iterates the wrapper. Async
    responses must have been prepared by :func:`_read_raw_async` first.
    """
    if streaming:
        cache = getattr(raw, "_parsed_by_type", None)
        cast_to = getattr(raw, "_cast_to", None)
        if isinstance(cache, dict) and cast_to is not None:
            stream = cache.get(cast_to)
            if stream is None and not inspect.iscoroutinefunction(getattr(raw, "parse", None)):
                try:
                    stream = raw.parse()
                except Exception as exc:
                    _fail(span, exc)
                    return
            if _is_stream(stream):
                cache[cast_to] = wrapper(stream, span)
                return
        logger.debug("Cannot follow a raw streaming response of this SDK version; recording the request only")
        _finish(span, _Response())
        return
    http_response = raw.http_response
    try:
        http_response.read()  # returns the kept body when it has been read already
    except Exception as exc:  # the body could not be received: the call failed
        _fail(span, exc)
        return
    try:
        body = http_response.json()
    except Exception:  # a non-JSON body: the caller's parse() will report it
        body = None
    _finish(span, _Response.from_completion(body) if isinstance(body, dict) else _Response())


async def _read_raw_async(raw: Any, span: trace_api.Span, streaming: bool) -> bool:
    """Receive what recording an async ``with_streaming_response`` result needs before :func:`_record_raw` runs.

    Its ``parse()`` and body reads are coroutines: the body of a complete response is read (httpx keeps it for the
    caller), and a stream is parsed once (the SDK caches it for the caller's own ``parse()``).

    Returns:
        False when receiving failed (the span has been ended as failed).
    """
    try:
        if streaming:
            parse = getattr(raw, "parse", None)
            if inspect.iscoroutinefunction(parse):
                await parse()
        else:
            aread = getattr(raw.http_response, "aread", None)
            if inspect.iscoroutinefunction(aread):
                await aread()
    except Exception as exc:
        _fail(span, exc)
        return False
    return True


@contextlib.contextmanager
def _call_in_span(span: trace_api.Span) -> Iterator[None]:
    """Run the SDK call with ``span`` current; a failing call records its error on the span and re-raises."""
    try:
        with trace_api.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield
    except BaseException as exc:
        _record_call_id(span, exc)
        _fail(span, exc)
        raise


def _hand_over(
    span: trace_api.Span, result: Any, streaming: bool, stream_wrapper: Callable[[Any, trace_api.Span], Any]
) -> Any:
    """What the caller receives: a stream traced by ``stream_wrapper``, or the result (span finished)."""
    if not span.is_recording():
        return result
    _record_call_id(span, result)
    if streaming and _is_stream(result):
        return stream_wrapper(result, span)
    if _is_raw_response(result):
        _record_raw(result, span, streaming, stream_wrapper)
        return result
    _finish(span, _Response.from_completion(result) if hasattr(result, "choices") else _Response())
    return result


def _is_streaming(body: Mapping[str, Any], kwargs: Dict[str, Any]) -> bool:
    """Whether the SDK asked for a stream (``request``'s own ``stream`` argument, else the body's)."""
    return bool(kwargs.get("stream", body.get("stream") is True))


def _wrap_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrapper of ``SyncAPIClient.request``: records the calls of the recorded endpoints (see :func:`_endpoint`)."""

    @functools.wraps(original)
    def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        # ``_originals`` is empty when uninstrumented, for a method bound to a client while instrumented.
        endpoint = _endpoint(options) if _originals else None
        if endpoint is None:
            return original(self, cast_to, options, *args, **kwargs)
        body = _request_body(options)
        span = _start_span(endpoint, body, _agent_name(self, options))
        with _call_in_span(span):
            result = original(self, cast_to, options, *args, **kwargs)
        return _hand_over(span, result, _is_streaming(body, kwargs), _TracedStream)

    request.__agentbolt_original__ = original  # type: ignore[attr-defined]
    return request


def _wrap_async(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrapper of ``AsyncAPIClient.request`` (see :func:`_wrap_sync`)."""

    @functools.wraps(original)
    async def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        endpoint = _endpoint(options) if _originals else None
        if endpoint is None:
            return await original(self, cast_to, options, *args, **kwargs)
        body = _request_body(options)
        streaming = _is_streaming(body, kwargs)
        span = _start_span(endpoint, body, _agent_name(self, options))
        with _call_in_span(span):
            result = await original(self, cast_to, options, *args, **kwargs)
        received = not (span.is_recording() and _is_raw_response(result)) or await _read_raw_async(
            result, span, streaming
        )
        if not received:  # the span has been ended as failed; the caller's own reads will report the error
            return result
        return _hand_over(span, result, streaming, _AsyncTracedStream)

    request.__agentbolt_original__ = original  # type: ignore[attr-defined]
    return request


def _shared_ssl_context(library: ModuleType, trust_env: bool) -> ssl.SSLContext:
    """One default TLS context per HTTP library and trust configuration, built by the library itself."""
    environment = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else (None, None)
    key = (library.__name__, trust_env, *environment)
    with _ssl_lock:
        context = _ssl_contexts.get(key)
        if context is None:
            context = library.create_ssl_context(verify=True, trust_env=trust_env)
            _ssl_contexts[key] = context
    return context


def _http_library(client_class: type) -> Optional[ModuleType]:
    """The HTTP library (``httpx`` or ``httpx2``) a client class derives from, if it can build TLS contexts."""
    for cls in client_class.__mro__[1:]:
        library = sys.modules.get(cls.__module__.split(".", 1)[0])
        if library is not None and callable(getattr(library, "create_ssl_context", None)):
            return library
    return None


def _wrap_http_client_init(library: ModuleType) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrapper factory for the ``__init__`` of the SDK's default HTTP clients: reuse a shared TLS context."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def init(self: Any, **kwargs: Any) -> None:
            custom = any(kwargs.get(name) is not None for name in ("verify", "cert", "transport"))
            if not custom and not kwargs.get("http2"):
                kwargs["verify"] = _shared_ssl_context(library, bool(kwargs.get("trust_env", True)))
            original(self, **kwargs)

        init.__agentbolt_original__ = original  # type: ignore[attr-defined]
        return init

    return wrap


def _targets() -> List[Tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    from openai import _base_client

    targets: List[Tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        (_base_client.SyncAPIClient, "request", _wrap_sync),
        (_base_client.AsyncAPIClient, "request", _wrap_async),
    ]

    for name in ("_DefaultHttpxClient", "_DefaultAsyncHttpxClient"):
        cls = getattr(_base_client, name, None)
        library = _http_library(cls) if isinstance(cls, type) else None
        if cls is not None and library is not None:
            targets.append((cls, "__init__", _wrap_http_client_init(library)))
    return targets


def instrument_openai() -> None:
    """Patch the OpenAI SDK so chat and text completions produce spans. Idempotent.

    Raises:
        ImportError: The ``openai`` package is not installed.
    """
    with _lock:
        for cls, name, wrap in _targets():
            if (cls, name) in _originals or not hasattr(cls, name):
                continue
            original = getattr(cls, name)
            _originals[(cls, name)] = original
            setattr(cls, name, wrap(original))
        if _track_collection not in gc.callbacks:
            gc.callbacks.append(_track_collection)
    logger.debug("OpenAI chat and text completions instrumented")


def uninstrument_openai() -> None:
    """Restore the original OpenAI SDK methods. Idempotent."""
    with _lock:
        for (cls, name), original in list(_originals.items()):
            setattr(cls, name, original)
            del _originals[(cls, name)]


def is_openai_instrumented() -> bool:
    """Whether :func:`instrument_openai` is in effect."""
    return bool(_originals)
