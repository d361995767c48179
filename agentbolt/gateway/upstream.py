"""Upstream client: one pooled keep-alive HTTP session shared by every request, with retries and error mapping.

The transport is aiohttp, the library the store client uses too. The gateway's figures are in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Dict, Mapping, Optional, Sequence

import aiohttp
import orjson

from agentbolt.gateway.routing import Deployment
from agentbolt.openai_api.errors import ApiError

__all__ = ["GatewayError", "UpstreamClient", "UpstreamResponse", "RETRYABLE_STATUS", "upstream_error_message"]

logger = logging.getLogger("agentbolt.gateway.upstream")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
"""Upstream statuses that are retried: rate limits and the server errors that mean "try again".

Every other status (other 4xx, and 5xx such as 501, 505, 507 or an Anthropic backend's 529) is passed through to the
client unchanged: the client's SDK then sees the provider's own status and error body, and decides itself whether to
retry (the OpenAI and Anthropic SDKs retry 5xx answers).
"""

_MAX_BACKOFF = 2.0
_MAX_RETRY_AFTER = 10.0
_READ_CHUNK = 64 * 1024


class GatewayError(ApiError):
    """A failure the gateway reports to the client as an OpenAI-style error body.

    Attributes:
        status_code: HTTP status returned to the client (400, 404, 502, 504, ...).
        message: Human-readable explanation.
        error_type: Short machine-readable category (``upstream_timeout``, ``upstream_unavailable``...).
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        error_type: str,
        param: Optional[str] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        super().__init__(status_code, message, error_type, param, headers)

    @property
    def status_code(self) -> int:
        """The HTTP status."""
        return self.status

    @property
    def error_type(self) -> str:
        """The error's ``type``."""
        return self.type

    def to_body(self, **extra: object) -> bytes:
        """JSON body in the OpenAI error format."""
        return self.body(**extra)


_NOT_RETRIED = "not retried, as the backend may already have generated the answer"


def _cut_answer(message: str) -> GatewayError:
    """The 502 of a call whose answer began and was cut: not retried here, and ``x-should-retry: false`` asks the
    OpenAI and Anthropic SDKs, which retry a 502 by default, not to retry it either."""
    return GatewayError(502, f"{message}; {_NOT_RETRIED}", "upstream_error", headers={"x-should-retry": "false"})


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _partial_head(exc: aiohttp.ClientError) -> Optional[Any]:
    """The part of the answer's status line and headers that arrived before ``exc`` ended the request, if any.

    aiohttp attaches it to the :class:`aiohttp.ServerDisconnectedError` of a connection the backend closed in the
    middle of its headers.
    """
    if isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(exc.message, str):
        return exc.message
    return None


def _failed_before_answer(exc: aiohttp.ClientError) -> bool:
    """Whether ``exc`` ended a request before any byte of the backend's answer arrived: the failures retried.

    That is a connection that could not be opened (refused, unreachable, DNS, TLS) or one closed or reset before
    the answer began, which is also how a pooled keep-alive connection the backend had already closed fails. Once
    the answer began (part of its headers, or all of them), the backend may have generated it, and a retry could
    make it generate a second, different answer. aiohttp keeps the part of the headers it received only when the
    backend closes the connection; after a reset it reports a bare ``ClientOSError``, so a reset that interrupts
    the headers is taken for one before them.
    """
    return isinstance(exc, aiohttp.ClientConnectionError) and _partial_head(exc) is None


def _send_error(exc: aiohttp.ClientError, deployment: Deployment, attempts: int) -> GatewayError:
    """The 502 reporting ``exc``, raised by :meth:`UpstreamClient.send` after ``attempts`` attempt(s)."""
    where = f"Upstream {deployment.shown_base} ({deployment.upstream_model})"
    if _failed_before_answer(exc):
        reached = not isinstance(exc, aiohttp.ClientConnectorError)
        what = "closed the connection without answering" if reached else "is unreachable"
        return GatewayError(
            502, f"{where} {what} after {attempts} attempt(s): {_describe(exc)}", "upstream_unavailable"
        )
    head = _partial_head(exc)
    if head is not None:
        detail = f"its HTTP {head.code} answer ended within the headers"
    elif isinstance(exc, aiohttp.ClientResponseError):
        detail = f"its answer is not valid HTTP ({exc.status}, {exc.message})"
    else:
        return GatewayError(502, f"{where} failed: {_describe(exc)}", "upstream_error")
    return _cut_answer(f"{where} dropped the connection while answering: {detail}")


def _unread(content: aiohttp.StreamReader) -> bytes:
    """What ``content`` received but did not hand out because its connection failed before it was read.

    aiohttp's readers raise a connection's error before returning the data buffered ahead of it (the last events
    of a stream whose backend reset the connection right after sending them), and no public method returns that
    data, hence the private read. Empty when nothing is left, or when this aiohttp's reader keeps no such buffer.
    """
    read_buffered = getattr(content, "_read_nowait", None)
    if read_buffered is None or not getattr(content, "_buffer", None):
        return b""
    try:
        return bytes(read_buffered(-1))
    except Exception:  # a reader whose internals differ: nothing can be recovered from it
        return b""


def upstream_error_message(response_body: bytes) -> str:
    """Best-effort extraction of the error message from an upstream error body."""
    try:
        parsed = orjson.loads(response_body)
    except orjson.JSONDecodeError:
        return response_body[:500].decode("utf-8", errors="replace").strip()
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed.get("detail", parsed))
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
    return orjson.dumps(parsed)[:500].decode()


class UpstreamResponse:
    """An upstream answer whose headers have arrived; the body is read with :meth:`read` or :meth:`iter_chunks`.

    Transport failures while reading surface as :class:`GatewayError` (504 on timeouts, 502 otherwise).

    Args:
        response: The open aiohttp response.
        deployment: The deployment that answered.
        timeout: The timeout that applied, for error messages.
    """

    def __init__(self, response: aiohttp.ClientResponse, deployment: Deployment, timeout: float) -> None:
        self._response = response
        self.deployment = deployment
        self._timeout = timeout

    @property
    def status_code(self) -> int:
        """HTTP status of the upstream answer."""
        return self._response.status

    @property
    def content_type(self) -> str:
        """The ``content-type`` header (empty when absent)."""
        return self._response.headers.get("content-type", "")

    def _read_error(self, exc: BaseException, streaming: bool) -> GatewayError:
        where = f"Upstream {self.deployment.shown_base}"
        if isinstance(exc, asyncio.TimeoutError):
            what = "stopped sending stream data" if streaming else "did not finish its answer"
            return GatewayError(504, f"{where} {what} within the {self._timeout:g} s timeout", "upstream_timeout")
        if streaming:
            return GatewayError(502, f"{where} dropped the stream connection: {_describe(exc)}", "upstream_error")
        return _cut_answer(
            f"{where} ({self.deployment.upstream_model}) dropped the connection while answering: its HTTP "
            f"{self.status_code} answer is incomplete ({_describe(exc)})"
        )

    async def read(self) -> bytes:
        """The whole body.

        Raises:
            GatewayError: The connection failed or timed out before the body was complete.
        """
        try:
            return await self._response.read()
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            raise self._read_error(exc, streaming=False) from exc

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body in pieces, as they arrive; every byte received is yielded, also when the connection then fails.

        Raises:
            GatewayError: The connection failed or timed out before the body was complete (after the last piece
                received was yielded).
        """
        content = self._response.content
        try:
            async for chunk in content.iter_any():
                yield chunk
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            rest = _unread(content)
            if rest:
                yield rest
            raise self._read_error(exc, streaming=True) from exc

    def close(self) -> None:
        """Give the connection back to the pool (or drop it if the body was not read to the end)."""
        self._response.release()

    def abort(self) -> None:
        """Drop the connection now: a read in progress ends with an error."""
        self._response.close()


def _backoff(attempt: int, status: Optional[int], retry_after: Optional[str]) -> float:
    delay = min(0.05 * (2**attempt), _MAX_BACKOFF)
    if status == 429 and retry_after and retry_after.replace(".", "", 1).isdigit():
        delay = max(delay, min(float(retry_after), _MAX_RETRY_AFTER))
    return delay


class UpstreamClient:
    """Sends requests to deployments over pooled keep-alive connections.

    Must be created and used inside the event loop that serves the gateway.

    Args:
        num_retries: Extra attempts after a 429, a 500-504 answer or a connection that failed before the answer
            began (timeouts are not retried).
        timeout: Default seconds allowed for connecting and for each wait for data.
        max_connections: Upper bound of pooled connections over all backends.
    """

    def __init__(self, *, num_retries: int = 0, timeout: float = 600.0, max_connections: int = 1000) -> None:
        if num_retries < 0:
            raise ValueError("num_retries must be >= 0")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.num_retries = num_retries
        self.timeout = timeout
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(timeout, 10.0), sock_read=timeout),
            skip_auto_headers=("User-Agent",),
        )

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._session.close()

    def _headers(self, deployment: Deployment, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if extra:
            headers.update(extra)
        if deployment.api_key:
            if deployment.speaks_messages:
                headers["x-api-key"] = deployment.api_key
            else:
                headers["authorization"] = f"Bearer {deployment.api_key}"
        return headers

    async def send(
        self,
        candidates: Sequence[Deployment],
        endpoint: str,
        payloads: Sequence[bytes],
        headers: Optional[Mapping[str, str]] = None,
    ) -> UpstreamResponse:
        """POST to the first candidate, retrying on the next ones; returns once response headers arrive.

        Args:
            candidates: Deployments in the order to try (retries cycle through them).
            endpoint: Path under the deployment's ``api_base`` (``chat/completions`` or ``completions``).
            payloads: Request body for each candidate (same order; retries cycle through them too).
            headers: Extra request headers (such as ``anthropic-version``); the deployment's key is added to them.

        Returns:
            The open response: a success, or a non-retryable (or exhausted) 4xx the caller passes through.

        Raises:
            GatewayError: 502 after retries on 500-504 / connection errors (or at once when the connection failed
                after the answer began, see :func:`_failed_before_answer`), 429 after retried rate limits, 504 on
                timeouts.
        """
        attempts = self.num_retries + 1
        for attempt in range(attempts):
            index = attempt % min(len(candidates), len(payloads))
            deployment = candidates[index]
            last = attempt == attempts - 1
            timeout = deployment.timeout or self.timeout
            try:
                response = await self._session.post(
                    deployment.url(endpoint),
                    data=payloads[index],
                    headers=self._headers(deployment, headers),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(timeout, 10.0), sock_read=timeout),
                )
            except asyncio.TimeoutError as exc:
                raise GatewayError(
                    504,
                    f"Upstream {deployment.shown_base} ({deployment.upstream_model}) timed out after {timeout:g} s",
                    "upstream_timeout",
                ) from exc
            except aiohttp.ClientError as exc:
                if last or not _failed_before_answer(exc):
                    raise _send_error(exc, deployment, attempt + 1) from exc
                logger.info("Retrying %s after %s", deployment.shown_base, _describe(exc))
                await asyncio.sleep(_backoff(attempt, None, None))
                continue
            status = response.status
            if status not in RETRYABLE_STATUS:
                return UpstreamResponse(response, deployment, timeout)
            # Retryable status: read the (small) error body so the connection can be reused.
            try:
                body = await response.read()
            except (asyncio.TimeoutError, aiohttp.ClientError):
                body = b""
            finally:
                response.release()
            if last:
                detail = upstream_error_message(body)
                if status == 429:
                    raise GatewayError(
                        429,
                        f"Upstream {deployment.shown_base} kept rate-limiting after {attempt + 1} attempt(s): {detail}",
                        "upstream_rate_limited",
                    )
                raise GatewayError(
                    502,
                    f"Upstream {deployment.shown_base} ({deployment.upstream_model}) answered HTTP {status} after "
                    f"{attempt + 1} attempt(s): {detail}",
                    "upstream_error",
                )
            logger.info("Retrying %s after HTTP %d", deployment.shown_base, status)
            await asyncio.sleep(_backoff(attempt, status, response.headers.get("retry-after")))
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises
