"""Upstream client: one pooled keep-alive HTTP session shared by every request, with retries and error mapping.

The transport is aiohttp rather than httpx: measured on the 2-core machines this project targets, httpx's
connection pool spends ~5 ms of CPU per request at 32 concurrent requests (its pool scans every connection on
each request), which capped the gateway at ~150 requests/s; aiohttp sustains >2000 requests/s there. See
``docs/gateway.md``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Dict, Mapping, Optional, Sequence

import aiohttp
import orjson

from agentbolt.gateway.routing import Deployment
from agentbolt.openai_api.errors import ApiError

__all__ = ["GatewayError", "UpstreamClient", "UpstreamResponse", "RETRYABLE_STATUS", "upstream_error_message"]

logger = logging.getLogger("agentbolt.gateway.upstream")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
"""Upstream statuses that are retried (rate limits and server errors)."""

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

    def __init__(self, status_code: int, message: str, error_type: str, param: Optional[str] = None) -> None:
        super().__init__(status_code, message, error_type, param)

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


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        where = f"Upstream {self.deployment.api_base}"
        if isinstance(exc, asyncio.TimeoutError):
            what = "stopped sending stream data" if streaming else "did not finish its answer"
            return GatewayError(504, f"{where} {what} within the {self._timeout:g} s timeout", "upstream_timeout")
        what = "dropped the stream connection" if streaming else "dropped the connection while answering"
        return GatewayError(502, f"{where} {what}: {_describe(exc)}", "upstream_error")

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
        """The body in pieces, as they arrive.

        Raises:
            GatewayError: The connection failed or timed out before the body was complete.
        """
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
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
        num_retries: Extra attempts after a 429, a 5xx or a connection error (timeouts are not retried).
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
            GatewayError: 502 after retries on 5xx / connection errors, 429 after retried rate limits, 504 on
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
                    f"Upstream {deployment.api_base} ({deployment.upstream_model}) timed out after {timeout:g} s",
                    "upstream_timeout",
                ) from exc
            except aiohttp.ClientError as exc:
                if last:
                    raise GatewayError(
                        502,
                        f"Upstream {deployment.api_base} ({deployment.upstream_model}) is unreachable after "
                        f"{attempt + 1} attempt(s): {_describe(exc)}",
                        "upstream_unavailable",
                    ) from exc
                logger.info("Retrying %s after %s", deployment.api_base, _describe(exc))
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
                        f"Upstream {deployment.api_base} kept rate-limiting after {attempt + 1} attempt(s): {detail}",
                        "upstream_rate_limited",
                    )
                raise GatewayError(
                    502,
                    f"Upstream {deployment.api_base} ({deployment.upstream_model}) answered HTTP {status} after "
                    f"{attempt + 1} attempt(s): {detail}",
                    "upstream_error",
                )
            logger.info("Retrying %s after HTTP %d", deployment.api_base, status)
            await asyncio.sleep(_backoff(attempt, status, response.headers.get("retry-after")))
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises
