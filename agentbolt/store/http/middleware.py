"""ASGI middlewares of the store server: the guard (token, store identity, body size) and HTTP metrics; and the
store's 401 (:func:`unauthorized_response`), which other servers answering refusals as the store does give
:class:`~agentbolt.utils.http_auth.BearerAuthMiddleware`.

Both are plain ASGI callables rather than Starlette ``BaseHTTPMiddleware`` subclasses: they cost a few attribute
reads per request, which matters at thousands of requests per second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from starlette.responses import Response

from agentbolt.store.dashboard import is_public_page
from agentbolt.store.http.errors import error_body
from agentbolt.store.http.routes import API_V1_AGL_PREFIX, STORE_ID_HEADER
from agentbolt.utils.http_auth import bearer_token_matches

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = [
    "GuardMiddleware",
    "MetricsMiddleware",
    "UNMATCHED_PATH_LABEL",
    "DASHBOARD_PAGE_LABEL",
    "OTHER_METHOD_LABEL",
    "body_timeout_error",
    "unauthorized_response",
]

logger = logging.getLogger("agentbolt.store.server")

_PUBLIC_PATHS = frozenset({"/health", API_V1_AGL_PREFIX + "/health"})
_STORE_ID_HEADER_BYTES = STORE_ID_HEADER.encode()


class GuardMiddleware:
    """Bearer-token check, store identity check and request-size limit, as a lean ASGI middleware."""

    def __init__(self, app: Any, api_key: Optional[str], max_request_bytes: int, server_id: str) -> None:
        self.app = app
        self.api_key = api_key or None
        self.max_request_bytes = max_request_bytes
        self.server_id = server_id.encode()

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_length: Optional[bytes] = None
        chunked = False
        authorization: Optional[bytes] = None
        expected_id: Optional[bytes] = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                content_length = value
            elif key == b"transfer-encoding":
                chunked = True
            elif key == b"authorization":
                authorization = value
            elif key == _STORE_ID_HEADER_BYTES:
                expected_id = value
        if expected_id is not None and expected_id != self.server_id and scope["path"] not in _PUBLIC_PATHS:
            detail = (
                f"This store server ({self.server_id.decode()}) is not the one the client was started with "
                f"({expected_id.decode(errors='replace')}): another store holds this address."
            )
            await _send_error(send, 409, detail, "StoreIdentityMismatch", "")
            return
        # No method is exempt: CORS preflights are answered by the CORS middleware, which runs before this one, and
        # an OPTIONS request reaching this far would otherwise be served unguarded (the Prometheus mount answers
        # every method).
        if (
            self.api_key is not None
            and scope["path"] not in _PUBLIC_PATHS
            and not is_public_page(scope["path"])
            and not bearer_token_matches(authorization, self.api_key)
        ):
            await unauthorized_response(scope)(scope, receive, send)
            return
        if content_length is not None:
            try:
                length = int(content_length)
            except ValueError:
                await _send_error(send, 400, "Invalid Content-Length header.", "BadRequest", "ValueError")
                return
            if length > self.max_request_bytes:
                await _send_error(send, 413, *_too_large(self.max_request_bytes))
                return
            await self.app(scope, receive, send)
            return
        if not chunked:  # HTTP/1.1 has a body only with a Content-Length or a Transfer-Encoding, whatever the method
            await self.app(scope, receive, send)
            return
        # Body without a declared length (chunked): read it up to the limit before handing it on.
        chunks: List[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away before the last chunk: its request is incomplete, so nothing of it is applied.
                logger.debug("Client left %s %s before the end of its chunked body", scope["method"], scope["path"])
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                await _send_error(send, 413, *_too_large(self.max_request_bytes))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def unauthorized_response(scope: Dict[str, Any]) -> Response:
    """The store's 401 for a request without the API key (``WWW-Authenticate: Bearer``, the store's error body)."""
    body = error_body("Missing or invalid API key.", "Unauthorized", "")
    return Response(body, 401, headers={"www-authenticate": "Bearer"}, media_type="application/json")


def body_timeout_error(scope: Dict[str, Any], message: str) -> bytes:
    """The store's error body for a request whose body did not arrive in time (answered 408, nothing applied)."""
    return error_body(message, "RequestTimeout", "TimeoutError")


def _too_large(limit: int) -> Tuple[str, str, str]:
    return f"Request body too large: the limit is {limit} bytes.", "RequestTooLarge", "ValueError"


async def _send_error(
    send: Any,
    status: int,
    detail: str,
    error_type: str,
    error_kind: str,
) -> None:
    """Send an error response from ASGI middleware, in the common error format."""
    body = error_body(detail, error_type, error_kind)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


UNMATCHED_PATH_LABEL = "{unmatched}"
"""Path label of requests to no route of the server (a 404): one label for them all."""
DASHBOARD_PAGE_LABEL = "{dashboard_page}"
"""Path label of the dashboard's pages, whose paths (``/rollouts/...``) are the page app's own."""
OTHER_METHOD_LABEL = "OTHER"
"""Method label of requests with a method outside :data:`_METHOD_LABELS` (WebDAV's, made-up ones)."""
_METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _templated_path(path: str) -> str:
    """Path label for metrics: ids replaced by their parameter names."""
    parts = path.split("/")
    names = {
        "rollouts": "{rollout_id}",
        "attempts": "{attempt_id}",
        "resources": "{resources_id}",
        "workers": "{worker_id}",
    }
    literal = {"search", "latest", "enqueue", "dequeue", "batch", "next"}
    for i in range(1, len(parts)):
        if parts[i - 1] in names and parts[i] and parts[i] not in literal:
            if parts[i - 1] == "rollouts" and i >= 2 and parts[i - 2] == "queues":
                continue
            parts[i] = names[parts[i - 1]]
    return "/".join(parts)


class MetricsMiddleware:
    """Records ``agl.http.total`` and ``agl.http.latency`` per templated path, method and status.

    The path label is a route's template (``/v1/agl/rollouts/{rollout_id}``), a mount's path followed by ``/``, or,
    for any other path, :data:`DASHBOARD_PAGE_LABEL` or :data:`UNMATCHED_PATH_LABEL`: the labels a client can cause
    are bounded by the server's routes, so requests to made-up paths never grow the metrics without end. Likewise
    the method label is the method for the common ones, else :data:`OTHER_METHOD_LABEL`.

    Args:
        app: The wrapped ASGI app.
        tracker: Where the metrics go.
        route_paths: Templates of the server's routes.
        mount_paths: Paths of the apps mounted on the server (``/v1/prometheus``).
    """

    def __init__(
        self,
        app: Any,
        tracker: MetricsBackend,
        route_paths: Iterable[str] = (),
        mount_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.tracker = tracker
        self.route_paths = frozenset(route_paths)
        self.mount_paths = tuple(mount_paths)

    def path_label(self, path: str, raw_path: Optional[bytes] = None) -> str:
        """The path label of a request to ``path`` (sent as ``raw_path``, whose escaped ``/`` stay within an id)."""
        templated = _templated_path(raw_path.decode("latin-1") if raw_path else path)
        if templated in self.route_paths:
            return templated
        for mount in self.mount_paths:
            if path == mount or path.startswith(mount + "/"):
                return mount + "/"
        return DASHBOARD_PAGE_LABEL if is_public_page(path) else UNMATCHED_PATH_LABEL

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = "499"
        start = time.perf_counter()

        async def send_wrapper(message: Dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except asyncio.CancelledError:
            status = "499"
            raise
        except Exception as exc:
            status = type(exc).__name__
            raise
        finally:
            path = self.path_label(scope["path"], scope.get("raw_path"))
            method = scope["method"] if scope["method"] in _METHOD_LABELS else OTHER_METHOD_LABEL
            labels = {"path": path, "method": method, "status": status}
            elapsed = time.perf_counter() - start
            try:
                await self.tracker.inc_counter("agl.http.total", labels=labels)
                await self.tracker.observe_histogram("agl.http.latency", elapsed, labels=labels)
            except Exception:
                logger.debug("Failed to record HTTP metrics", exc_info=True)
