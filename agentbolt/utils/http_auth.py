"""The bearer-token check every agentbolt HTTP server makes: one comparison rule and one ASGI middleware.

The key is compared in constant time and the scheme in any case (``Bearer``, ``bearer``), as HTTP says. The check
runs before routing, so a client without the key learns nothing of the routes: an unknown path or a wrong method is
a 401 like any other. Each server answers the refusal in its own error format (``refusal``).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Tuple, Union

if TYPE_CHECKING:
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BearerAuthMiddleware", "bearer_token_matches"]


def bearer_token_matches(authorization: Union[str, bytes, None], api_key: str) -> bool:
    """Whether an ``Authorization`` header value carries ``api_key`` (scheme ``Bearer``, any case; constant time)."""
    if isinstance(authorization, str):
        authorization = authorization.encode()
    scheme, _, token = (authorization or b"").strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), api_key.encode())


class BearerAuthMiddleware:
    """Require ``Authorization: Bearer <api_key>`` on every HTTP request except to ``open_paths`` (ASGI middleware).

    Args:
        app: The wrapped ASGI app.
        api_key: The key (not empty).
        open_paths: Paths served without the key.
        refusal: The answer to a request of ``scope`` without the key (a 401 in the server's error format).
        x_api_key: Also accept the key in an ``x-api-key`` header (what Anthropic's SDK sends).

    Raises:
        ValueError: ``api_key`` is empty.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str,
        open_paths: Iterable[str],
        refusal: Callable[[Scope], Response],
        *,
        x_api_key: bool = False,
    ) -> None:
        if not api_key:
            raise ValueError("api_key must not be empty")
        self.app = app
        self.api_key = api_key
        self.open_paths = frozenset(open_paths)
        self.refusal = refusal
        self.x_api_key = x_api_key

    def _authorized(self, headers: Iterable[Tuple[bytes, bytes]]) -> bool:
        authorization: Optional[bytes] = None
        x_api_key: Optional[bytes] = None
        for key, value in headers:
            if key == b"authorization":
                authorization = value
            elif key == b"x-api-key":
                x_api_key = value
        if bearer_token_matches(authorization, self.api_key):
            return True
        return (
            self.x_api_key and x_api_key is not None and hmac.compare_digest(x_api_key.strip(), self.api_key.encode())
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths and not self._authorized(scope["headers"]):
            await self.refusal(scope)(scope, receive, send)
            return
        await self.app(scope, receive, send)
