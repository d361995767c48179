"""Upstream client: one pooled ``httpx.AsyncClient`` shared by every request, with retries and error mapping."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

import httpx
import orjson

from agentbolt.gateway.routing import Deployment

__all__ = ["GatewayError", "UpstreamClient", "UpstreamResponse", "RETRYABLE_STATUS"]

logger = logging.getLogger("agentbolt.gateway.upstream")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
"""Upstream statuses that are retried (rate limits and server errors)."""

_MAX_BACKOFF = 2.0
_MAX_RETRY_AFTER = 10.0


class GatewayError(Exception):
    """A failure the gateway reports to the client as an OpenAI-style error body.

    Attributes:
        status_code: HTTP status returned to the client (400, 404, 502, 504, ...).
        message: Human-readable explanation.
        error_type: Short machine-readable category (``upstream_timeout``, ``upstream_unavailable``...).
    """

    def __init__(self, status_code: int, message: str, error_type: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.error_type = error_type

    def to_body(self, **extra: Any) -> bytes:
        """JSON body in the OpenAI error format."""
        return orjson.dumps(
            {"error": {"message": self.message, "type": self.error_type, "code": self.status_code, **extra}}
        )


@dataclass
class UpstreamResponse:
    """An upstream response whose headers have arrived; the body may still be streaming.

    Attributes:
        response: The open httpx response (close it with :meth:`aclose`).
        deployment: The deployment that answered.
    """

    response: httpx.Response
    deployment: Deployment

    @property
    def status_code(self) -> int:
        """HTTP status of the upstream answer."""
        return self.response.status_code

    async def aclose(self) -> None:
        """Release the connection back to the pool."""
        await self.response.aclose()


def _backoff(attempt: int, response: Optional[httpx.Response]) -> float:
    delay = min(0.05 * (2**attempt), _MAX_BACKOFF)
    if response is not None and response.status_code == 429:
        retry_after = response.headers.get("retry-after")
        if retry_after and retry_after.replace(".", "", 1).isdigit():
            delay = max(delay, min(float(retry_after), _MAX_RETRY_AFTER))
    return delay


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


class UpstreamClient:
    """Sends requests to deployments over pooled keep-alive connections.

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
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._client.aclose()

    def _build(self, deployment: Deployment, endpoint: str, content: bytes) -> httpx.Request:
        headers: Dict[str, str] = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if deployment.api_key:
            headers["authorization"] = f"Bearer {deployment.api_key}"
        timeout_s = deployment.timeout or self.timeout
        return self._client.build_request(
            "POST",
            deployment.url(endpoint),
            content=content,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
        )

    async def send(
        self,
        candidates: Sequence[Deployment],
        endpoint: str,
        payloads: Sequence[bytes],
    ) -> UpstreamResponse:
        """POST to the first candidate, retrying on the next ones; returns once response headers arrive.

        Args:
            candidates: Deployments in the order to try (retries cycle through them).
            endpoint: Path under the deployment's ``api_base`` (``chat/completions`` or ``completions``).
            payloads: Request body for each candidate (same order).

        Returns:
            The open response: a success, or a non-retryable (or exhausted) 4xx the caller passes through.

        Raises:
            GatewayError: 502 after retries on 5xx / connection errors, 504 on timeouts.
        """
        attempts = self.num_retries + 1
        for attempt in range(attempts):
            index = attempt % len(candidates)
            deployment = candidates[index]
            last = attempt == attempts - 1
            request = self._build(deployment, endpoint, payloads[index])
            try:
                response = await self._client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                raise GatewayError(
                    504,
                    f"Upstream {deployment.api_base} ({deployment.upstream_model}) timed out after "
                    f"{deployment.timeout or self.timeout:g} s ({type(exc).__name__})",
                    "upstream_timeout",
                ) from exc
            except httpx.HTTPError as exc:
                if last:
                    raise GatewayError(
                        502,
                        f"Upstream {deployment.api_base} ({deployment.upstream_model}) is unreachable after "
                        f"{attempt + 1} attempt(s): {_describe(exc)}",
                        "upstream_unavailable",
                    ) from exc
                logger.info("Retrying %s after %s", deployment.api_base, _describe(exc))
                await asyncio.sleep(_backoff(attempt, None))
                continue
            status = response.status_code
            if status < 400 or status not in RETRYABLE_STATUS:
                return UpstreamResponse(response, deployment)
            # Retryable status: read the (small) error body so the connection can be reused.
            try:
                body = await response.aread()
            except httpx.HTTPError:
                body = b""
            finally:
                await response.aclose()
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
            await asyncio.sleep(_backoff(attempt, response))
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises
