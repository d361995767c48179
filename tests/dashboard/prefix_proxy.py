"""A minimal reverse proxy for the path-prefix test: serves UPSTREAM under PREFIX, stripping it like nginx would.

Usage: ``python prefix_proxy.py UPSTREAM_URL PORT PREFIX``.
"""

from __future__ import annotations

import sys

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def build(upstream: str, prefix: str) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=60)

    async def forward(request: Request) -> Response:
        path = request.url.path
        if not path.startswith(prefix + "/"):
            return Response("not under the prefix", status_code=404)
        answer = await client.request(
            request.method,
            path[len(prefix) :] or "/",
            params=request.query_params,
            content=await request.body(),
            headers={k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")},
        )
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return Response(answer.content, status_code=answer.status_code, headers=headers)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "HEAD"])])


if __name__ == "__main__":
    upstream_url, port, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3].rstrip("/")
    uvicorn.run(build(upstream_url, prefix), host="127.0.0.1", port=port, log_level="warning")
