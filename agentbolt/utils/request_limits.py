"""What a request to an agentbolt server may be: how large its body, and how long it may take to send.

:data:`DEFAULT_MAX_REQUEST_BYTES` is the body size limit every server applies by default. As for time, uvicorn bounds
neither part of a request: a client may open a connection and send its request head one byte at a time, or send its
headers and then trickle the body (staying within the body size limit), and hold a connection and a request task
for as long as it likes. agentbolt's servers bound both:

* :func:`header_timeout_protocol` gives uvicorn's HTTP protocol a deadline for the request head, counted from the
  connection's opening (or, on a kept-alive connection, from the request's first byte). A client that misses it
  gets a plain-text 408, as it gets uvicorn's own plain-text 400 for a malformed head, and the connection is closed.
  :class:`~agentbolt.utils.server_launcher.PythonServerLauncher` serves every app with it.
* :class:`BodyTimeoutMiddleware` gives the body a deadline counted from the end of the headers. It is one deadline
  for the whole body, not an idle timeout per chunk: a client sending one byte every few seconds never idles long,
  yet would hold its request open for hours. A client that misses it gets a 408 in the JSON error format of the
  server (the app, told that the client went away, applies nothing of the request), and the connection is closed.
  Each server that reads request bodies (the store server, the LLM gateway, ``agentbolt serve``) installs it.

An answer sent before the request was whole (a 413 from the Content-Length header, a 401, a 408) closes the
connection while the client may still be sending. Closing a socket with unread input makes the kernel reset the
connection instead of closing it in order, and a client still writing its body then sees the reset (and may lose the
answer already on its way) instead of the answer. So the protocol of :func:`header_timeout_protocol` closes such a
connection by *lingering*: it sends the answer, shuts down its sending side, and reads and discards what the client
still sends until the client closes its side too, for at most :data:`LINGER_SECONDS` and
:data:`LINGER_MAX_BYTES`, and only then closes. A connection closed between requests (keep-alive timeout, shutdown)
closes at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Type

from agentbolt.utils.checks import check_positive

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "LINGER_SECONDS",
    "LINGER_MAX_BYTES",
    "BodyTimeoutMiddleware",
    "header_timeout_protocol",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
"""Largest request body accepted by default (32 MiB)."""
DEFAULT_BODY_TIMEOUT = 60.0
"""Seconds a request body may take to arrive, counted from the end of its headers (32 MiB, the default body limit,
at about 560 KB/s)."""
DEFAULT_HEADER_TIMEOUT = 30.0
"""Seconds a request head (request line and headers) may take to arrive."""
LINGER_SECONDS = 2.0
"""Longest a connection answered before its request was whole keeps reading (and discarding) the client's input
before it closes, so that the client reads the answer instead of a connection reset."""
LINGER_MAX_BYTES = 2 * DEFAULT_MAX_REQUEST_BYTES
"""Most bytes such a connection reads and discards before it closes all the same."""

Scope = Dict[str, Any]
ErrorBody = Callable[[Scope, str], bytes]
"""The JSON body of the 408 answering the request of ``scope``, given the message saying what went wrong."""


def _has_body(headers: Iterable[Tuple[bytes, bytes]]) -> bool:
    """Whether a request with these headers has a body (HTTP/1.1: a non-zero Content-Length or a Transfer-Encoding)."""
    for key, value in headers:
        if key == b"transfer-encoding" or (key == b"content-length" and value.strip() != b"0"):
            return True
    return False


class BodyTimeoutMiddleware:
    """Answer 408 and close the connection when a request body is not whole within ``timeout`` seconds of its headers.

    The deadline applies while the app waits for the body. When it passes, the app receives ``http.disconnect``
    (ASGI's word for a client that went away: the request is incomplete and nothing of it is applied), whatever it
    answers is dropped, and the client gets the 408 with ``Connection: close``. An answer that starts before the
    body has been read (a 401, a 413) also carries ``Connection: close``: the server does not wait for the rest
    (the protocol of :func:`header_timeout_protocol` discards it while the connection closes).

    Args:
        app: The wrapped ASGI app.
        timeout: Seconds the whole body may take.
        error_body: The JSON body of the 408, in the server's error format.
        extra_headers: More headers of the 408.
    """

    def __init__(
        self,
        app: Any,
        timeout: float,
        error_body: ErrorBody,
        extra_headers: Sequence[Tuple[bytes, bytes]] = (),
    ) -> None:
        self.app = app
        self.timeout = check_positive(timeout, "timeout")
        self.error_body = error_body
        self.extra_headers = list(extra_headers)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _has_body(scope["headers"]):
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout
        reading = True
        timed_out = False
        started = False

        async def receive_in_time() -> Dict[str, Any]:
            nonlocal reading, timed_out
            if timed_out:
                return {"type": "http.disconnect"}
            if not reading:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                reading, timed_out = False, True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                reading = False
            return message

        async def send_in_time(message: Dict[str, Any]) -> None:
            nonlocal started
            if timed_out:
                return  # the answer to a request whose body never came is the 408
            if message["type"] == "http.response.start":
                started = True
                if reading:
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive_in_time, send_in_time)
        except Exception:
            if not timed_out:
                raise
            # The app failed on the body that never came (told the client went away): the 408 says what happened.
            logger.debug("%s %s failed after its body timed out", scope["method"], scope["path"], exc_info=True)
        if timed_out:
            logger.warning(
                "The body of %s %s from %s did not arrive within %g s: answered 408 and closed the connection",
                scope["method"],
                scope["path"],
                _client(scope),
                self.timeout,
            )
            if not started:
                await self._send_timeout(scope, send)

    async def _send_timeout(self, scope: Scope, send: Any) -> None:
        message = f"The request body did not arrive within {self.timeout:g} seconds of the request headers"
        body = self.error_body(scope, message)
        headers: List[Tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *self.extra_headers,
        ]
        await send({"type": "http.response.start", "status": 408, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "an unknown client"


class _LingeringTransport:
    """The transport uvicorn's protocol writes to and closes: closing it lingers while the client is still sending.

    Everything but :meth:`close` and :meth:`is_closing` goes to the socket's own transport.
    """

    def __init__(self, transport: asyncio.Transport, protocol: _LingeringClose) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if self._protocol._lingering or self._transport.is_closing() or not self._protocol._client_is_sending():
            self._transport.close()
        else:
            self._protocol._linger()

    def is_closing(self) -> bool:
        # Lingering counts as closing: uvicorn starts no keep-alive timer, no next request and no 100 Continue.
        return self._protocol._lingering or self._transport.is_closing()


class _LingeringClose:
    """Mixin of a uvicorn HTTP protocol: a connection answered before its request was whole closes by lingering
    (see the module's documentation).

    The linger is bounded per connection (:data:`LINGER_SECONDS`, :data:`LINGER_MAX_BYTES`), runs on the event loop
    (a timer, no thread or task), and ends at once when the server shuts down.
    """

    _lingering: bool = False
    _linger_bytes: int = 0
    _linger_timer: Optional[asyncio.TimerHandle] = None
    _socket_transport: asyncio.Transport
    _idle_close: bool = False
    # Attributes of uvicorn's protocols.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._socket_transport = transport
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[misc]

    def _client_is_sending(self) -> bool:
        """Whether the request in progress has not arrived whole (its body, or more of it, may still come)."""
        return (
            not self._idle_close
            and self.cycle is not None
            and self.cycle.more_body
            and self._socket_transport.get_protocol() is self  # not handed over to a WebSocket protocol
        )

    def _linger(self) -> None:
        """Send what is buffered, shut down the sending side, and close once the client stops sending (or the
        linger's bounds are reached)."""
        transport = self._socket_transport
        if self._lingering or transport.is_closing():
            return
        if not transport.can_write_eof():  # TLS cannot half-close
            transport.close()
            return
        self._lingering = True
        transport.write_eof()  # after the buffered answer
        transport.resume_reading()  # uvicorn pauses reading while a request body waits for the app
        self._linger_timer = self.loop.call_later(LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        if not self._lingering:
            super().data_received(data)  # type: ignore[misc]
            return
        self._linger_bytes += len(data)
        if self._linger_bytes > LINGER_MAX_BYTES:
            self._socket_transport.close()

    def shutdown(self) -> None:
        self._idle_close = True  # the server is stopping: closes from now on are immediate
        if self._lingering:
            self._socket_transport.close()
        else:
            super().shutdown()  # type: ignore[misc]

    def timeout_keep_alive_handler(self) -> None:
        self._idle_close = True  # between requests, whatever the last request left behind
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)  # type: ignore[misc]


class _HeaderDeadline(_LingeringClose):
    """Mixin of a uvicorn HTTP protocol: a deadline for each request head (see :func:`header_timeout_protocol`)."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    _header_timer: Optional[asyncio.TimerHandle] = None
    client: Optional[Tuple[str, int]]  # an attribute of uvicorn's protocols

    def _arm_header_deadline(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline_passed)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline_passed(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "an unknown client"
        logger.warning(
            "The request headers from %s did not arrive within %g s: closed the connection", client, self.header_timeout
        )
        if self.cycle is None or self.cycle.response_complete:  # never in the middle of another answer
            message = f"The request headers did not arrive within {self.header_timeout:g} seconds".encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(message), message)
            )
            self._linger()  # the client may still be sending its head
        else:
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_deadline()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)  # type: ignore[misc]


class _HttpToolsHeaderDeadline(_HeaderDeadline):
    """The deadline on httptools' parser events: from a request's first byte to the end of its headers."""

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_header_deadline()
        super().on_headers_complete()  # type: ignore[misc]


class _H11HeaderDeadline(_HeaderDeadline):
    """The deadline on h11's state: running while the client has not finished a request head it began."""

    conn: Any

    def data_received(self, data: bytes) -> None:
        import h11

        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()
        else:
            self._disarm_header_deadline()


def header_timeout_protocol(timeout: float, base: Optional[Type[asyncio.Protocol]] = None) -> Type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` (default: the one uvicorn picks, httptools when installed, else h11), with
    a deadline of ``timeout`` seconds for each request head, and a lingering close of a connection answered before
    its request was whole (see the module's documentation).

    The deadline runs from the connection's opening and, on a kept-alive connection, from a request's first byte
    (uvicorn's keep-alive timeout bounds the idle time between requests) to the end of the request's headers.

    Raises:
        TypeError: ``timeout`` is not a number.
        ValueError: ``timeout`` is not positive and finite, or ``base`` is another protocol.
    """
    timeout = check_positive(timeout, "header timeout")
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol
    mixin: Type[_HeaderDeadline]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools not installed
        HttpToolsProtocol = None  # type: ignore[assignment,misc]
    from uvicorn.protocols.http.h11_impl import H11Protocol

    if HttpToolsProtocol is not None and issubclass(base, HttpToolsProtocol):
        mixin = _HttpToolsHeaderDeadline
    elif issubclass(base, H11Protocol):
        mixin = _H11HeaderDeadline
    else:
        raise ValueError(f"no header deadline for the HTTP protocol {base.__name__}")
    return type(f"HeaderDeadline{base.__name__}", (mixin, base), {"header_timeout": timeout})
