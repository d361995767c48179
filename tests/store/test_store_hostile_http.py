"""The store server against hostile or careless HTTP clients: methods that skip the key, bodies that skip the size
limit, and requests the client abandons half-sent.

Every test runs a real LightningStoreServer on a free 127.0.0.1 port and talks to it over raw sockets, which send
what HTTP clients refuse to (chunked bodies on GET, bodies cut short).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Tuple

import aiohttp
import pytest
from support.servers import free_port
from support.slow_clients import trickle

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.utils.server_launcher import PythonServerLauncherArgs

from .test_http import PREFIX, serve

KEY = "hostile-test-key"


async def _exchange(endpoint: str, request: bytes) -> Tuple[int, bytes]:
    """Send ``request`` as raw bytes on a new connection, reading the answer while sending (the server may answer
    and close the connection before reading all of ``request``); the answer's status and body."""
    host, port = endpoint.split("//", 1)[1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            for start in range(0, len(request), 16 * 1024):
                writer.write(request[start : start + 16 * 1024])
                await writer.drain()

    sending = asyncio.ensure_future(send())
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        body = await reader.readexactly(length)
    finally:
        sending.cancel()
        writer.close()
    return int(head.split(b" ", 2)[1]), body


def _chunked(method: str, path: str, body: bytes, *, chunk_size: int, last_chunk: bool = True) -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: store\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + chunk_size]), body[i : i + chunk_size])
        for i in range(0, len(body), chunk_size)
    )
    return head + chunks + (b"0\r\n\r\n" if last_chunk else b"")


async def test_options_requests_need_the_key_like_any_other(tmp_path: Path) -> None:
    """The Prometheus mount answers every method: OPTIONS must not read the metrics without the key."""
    pytest.importorskip("prometheus_client")
    from agentbolt.utils.metrics import PrometheusMetricsBackend

    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, tracker=PrometheusMetricsBackend()) as running:
        for path in ("/v1/prometheus/", PREFIX + "/rollouts", "/openapi.json"):
            status, body = await running.request("OPTIONS", path)
            assert status == 401, (path, body)
            assert body["error_type"] == "Unauthorized" and KEY not in str(body)
        status, _ = await running.request("OPTIONS", "/health")
        assert status != 401


async def test_cors_preflights_of_the_allowed_origin_still_pass_without_the_key() -> None:
    origin = "http://dashboard.example"
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, cors_allow_origins=[origin]) as running:
        preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        status, _ = await running.request("OPTIONS", PREFIX + "/rollouts/search", headers=preflight)
        assert status == 200
        async with running.http.options(
            running.base + PREFIX + "/rollouts/search", headers={**preflight, "Origin": "http://elsewhere.example"}
        ) as response:
            assert response.status == 400 and "access-control-allow-origin" not in response.headers


async def test_without_a_cors_origin_no_cors_headers_are_sent() -> None:
    async with (
        serve(InMemoryLightningStore(thread_safe=True)) as running,
        running.http.get(
            running.base + PREFIX + "/rollouts", headers={"Origin": "http://elsewhere.example"}
        ) as response,
    ):
        assert response.status == 200
        assert not [name for name in response.headers if name.lower().startswith("access-control-")]


@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
async def test_a_chunked_body_beyond_the_limit_is_refused_whatever_the_method(method: str) -> None:
    limit = 64 * 1024
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, max_request_bytes=limit) as running:
        request = _chunked(method, PREFIX + "/rollouts", b" " * (4 * limit), chunk_size=8 * 1024)
        status, body = await _exchange(running.base, request)
        assert status == 413, body
        assert b"limit is 65536 bytes" in body
        assert not await running.client.query_rollouts()


async def test_a_chunked_request_the_client_abandons_is_not_applied(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agentbolt.store.server")
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY) as running:
        # A whole JSON body, but the last chunk never comes: the client went away mid-request.
        body = b'{"rollouts": [{"input": "half-sent"}]}'
        host, port = running.base.split("//", 1)[1].rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            _chunked("POST", PREFIX + "/queues/rollouts/enqueue", body, chunk_size=len(body), last_chunk=False)
        )
        await writer.drain()
        writer.close()
        deadline = time.monotonic() + 60  # guards against a hang only
        while not any("before the end of its chunked body" in r.getMessage() for r in caplog.records):
            assert not await store.query_rollouts(), "the abandoned request was applied"
            assert time.monotonic() < deadline, "the server never noticed the client left"
            await asyncio.sleep(0.01)
        assert not await store.query_rollouts()
        # The server goes on answering.
        rollout = await running.client.enqueue_rollout("after")
        assert [r.rollout_id for r in await running.client.query_rollouts()] == [rollout.rollout_id]


def _head(method: str, path: str, *, length: int, key: str = KEY) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: store\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


async def test_a_body_that_does_not_arrive_in_time_is_refused_with_408_and_not_applied() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, body_timeout=0.5) as running:
        body = b'{"rollouts": [{"input": "trickled"}]}' + b" " * 10_000
        answer = await trickle(running.base, _head("POST", PREFIX + "/queues/rollouts/enqueue", length=len(body)), body)
        assert answer.status == 408, answer
        assert answer.json() == {
            "detail": "The request body did not arrive within 0.5 seconds of the request headers",
            "error_type": "RequestTimeout",
            "error_kind": "TimeoutError",
        }
        assert answer.headers["x-agentbolt-not-applied"] == "1"
        assert answer.headers["connection"] == "close" and answer.closed
        assert not await store.query_rollouts()
        # The server goes on answering.
        assert (await running.client.enqueue_rollout("after")).input == "after"


async def test_a_chunked_body_that_does_not_arrive_in_time_is_refused_with_408() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, body_timeout=0.5) as running:
        body = b'{"rollouts": [{"input": "trickled"}]}'
        request = _chunked("POST", PREFIX + "/queues/rollouts/enqueue", body, chunk_size=1, last_chunk=False)
        head, chunks = request.split(b"\r\n\r\n", 1)
        answer = await trickle(running.base, head + b"\r\n\r\n", chunks * 100)
        assert answer.status == 408 and answer.json()["error_type"] == "RequestTimeout", answer
        assert answer.closed
        assert not await store.query_rollouts()


async def test_a_slow_body_does_not_hold_up_other_requests() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, body_timeout=0.5) as running:
        body = b'{"rollouts": [{"input": "trickled"}]}' + b" " * 10_000
        slow = asyncio.ensure_future(
            trickle(running.base, _head("POST", PREFIX + "/queues/rollouts/enqueue", length=len(body)), body)
        )
        fast = [await running.client.enqueue_rollout(f"fast-{index}") for index in range(5)]
        assert not slow.done()  # the slow request is still in flight while the others are answered
        assert (await slow).status == 408
        assert sorted(r.input for r in await store.query_rollouts()) == sorted(r.input for r in fast)


async def test_an_answer_given_before_the_body_arrives_closes_the_connection() -> None:
    """A client without the key is refused at once; trickling the rest of its body cannot hold the connection."""
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, api_key=KEY, body_timeout=60) as running:
        body = b" " * 10_000
        answer = await trickle(
            running.base, _head("POST", PREFIX + "/queues/rollouts/enqueue", length=len(body), key="wrong"), body
        )
        assert answer.status == 401 and answer.headers["connection"] == "close" and answer.closed


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_request_headers_that_do_not_arrive_in_time_close_the_connection(
    http: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if http == "h11":  # the protocol uvicorn picks where httptools is not installed
        from uvicorn.protocols.http import auto
        from uvicorn.protocols.http.h11_impl import H11Protocol

        monkeypatch.setattr(auto, "AutoHTTPProtocol", H11Protocol)
    store = InMemoryLightningStore(thread_safe=True)
    args = PythonServerLauncherArgs(
        host="127.0.0.1",
        port=free_port(),
        launch_mode="asyncio",
        healthcheck_url=PREFIX + "/health",
        timeout_request_headers=0.5,
    )
    server = LightningStoreServer(store, launcher_args=args, api_key=KEY)
    await server.start()
    try:
        head = _head("POST", PREFIX + "/queues/rollouts/enqueue", length=2)
        answer = await trickle(server.endpoint, head[:20], head[20:] * 100)
        assert answer.status == 408 and answer.closed, answer
        assert b"request headers did not arrive within 0.5 seconds" in answer.body
        silent = await trickle(server.endpoint, b"", b"")  # connects and sends nothing
        assert silent.status == 408 and silent.closed
        # The server goes on answering.
        async with (
            aiohttp.ClientSession() as http_session,
            http_session.get(server.endpoint + PREFIX + "/health") as response,
        ):
            assert response.status == 200
    finally:
        await server.stop()
    assert not await store.query_rollouts()
