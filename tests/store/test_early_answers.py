"""Answers the store server sends before a request's body has arrived (a 413 from the Content-Length header, a 408
for a body too slow) reach a client that is still sending its body, and the connection then closes in order.

Every test runs a real LightningStoreServer on a free 127.0.0.1 port, with uvicorn's httptools protocol and with
its h11 one, and sends bodies far larger than the socket buffers (8 MB against a 1 KB limit) with raw sockets,
aiohttp, httpx and the store client, each many times over.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Iterator, List, Optional, Tuple

import httpx
import orjson
import pytest
from support.servers import free_port
from support.slow_clients import trickle

from agentbolt.store.client_server import LightningStoreServer, LightningStoreValueError
from agentbolt.store.memory import InMemoryLightningStore

from .conftest import make_span
from .test_http import PREFIX, serve

LIMIT = 1024
BODY = b"[" + b" " * (8 * 1024 * 1024) + b"]"
TRIES = 20
GIVE_UP_SECONDS = 60.0
"""Longest a raw client waits on its socket: guards against a hang only."""
ENQUEUE = PREFIX + "/queues/rollouts/enqueue"


@pytest.fixture(params=["httptools", "h11"], autouse=True)
def http_protocol(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The uvicorn HTTP protocol the servers run on (h11 is the one uvicorn picks where httptools is missing)."""
    if request.param == "h11":
        from uvicorn.protocols.http import auto
        from uvicorn.protocols.http.h11_impl import H11Protocol

        monkeypatch.setattr(auto, "AutoHTTPProtocol", H11Protocol)
    yield request.param


def _address(endpoint: str) -> Tuple[str, int]:
    host, port = endpoint.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def _head(path: str, length: int, *, keep_alive: bool = False) -> bytes:
    connection = "" if keep_alive else "Connection: close\r\n"
    return (
        f"POST {path} HTTP/1.1\r\nHost: store\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{connection}\r\n"
    ).encode()


def _split_answer(raw: bytes) -> Tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _send_and_read(endpoint: str, request: bytes) -> Tuple[Optional[OSError], bytes]:
    """Send ``request`` whole from one thread while reading the answer until the server closes the connection in
    another; the error sending met (None when every byte was sent) and all that was read."""
    sent: List[Optional[OSError]] = [None]
    with socket.create_connection(_address(endpoint), timeout=GIVE_UP_SECONDS) as sock:

        def send() -> None:
            try:
                sock.sendall(request)
            except OSError as exc:
                sent[0] = exc

        sender = threading.Thread(target=send)
        sender.start()
        received = bytearray()
        try:
            while chunk := sock.recv(64 * 1024):
                received += chunk
        finally:
            sender.join(GIVE_UP_SECONDS)
    return sent[0], bytes(received)


async def test_a_raw_client_sends_its_whole_oversized_body_and_reads_the_413() -> None:
    async with serve(InMemoryLightningStore(thread_safe=True), max_request_bytes=LIMIT) as running:
        for _ in range(TRIES):
            error, raw = await asyncio.to_thread(_send_and_read, running.base, _head(ENQUEUE, len(BODY)) + BODY)
            assert error is None, f"sending the body failed: {error!r}"
            status, body = _split_answer(raw)
            assert status == 413 and b"the limit is 1024 bytes" in body, raw[:300]
        assert not await running.store.query_rollouts()


async def test_aiohttp_reads_the_413_of_an_oversized_body() -> None:
    async with serve(InMemoryLightningStore(thread_safe=True), max_request_bytes=LIMIT) as running:
        for _ in range(TRIES):
            status, answer = await running.request(
                "POST", ENQUEUE, data=BODY, headers={"content-type": "application/json"}
            )
            assert status == 413 and answer["error_type"] == "RequestTooLarge", answer


async def test_httpx_reads_the_413_of_an_oversized_body() -> None:
    """httpx sends the whole body before it reads the answer: the connection must still be open to receive it."""
    async with (
        serve(InMemoryLightningStore(thread_safe=True), max_request_bytes=LIMIT) as running,
        httpx.AsyncClient(timeout=GIVE_UP_SECONDS) as client,
    ):
        for _ in range(TRIES):
            answer = await client.post(
                running.base + ENQUEUE, content=BODY, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 413 and "the limit is 1024 bytes" in answer.json()["detail"]


async def test_the_store_client_raises_the_servers_413_for_an_oversized_call() -> None:
    async with serve(InMemoryLightningStore(thread_safe=True), max_request_bytes=LIMIT) as running:
        for _ in range(5):
            with pytest.raises(LightningStoreValueError, match="the limit is 1024 bytes") as raised:
                await running.client.enqueue_rollout(input="x" * len(BODY))
            assert raised.value.status == 413
            spans = [make_span("ro-1", "at-1", 1, "sp-1", attributes={"big": "x" * len(BODY)})]
            with pytest.raises(LightningStoreValueError, match="the limit is 1024 bytes") as raised:
                await running.client.add_many_spans(spans)
            assert raised.value.status == 413
        assert not await running.store.query_rollouts()


async def test_a_client_that_never_stops_sending_is_cut_off() -> None:
    """After an early answer the server reads what the client still sends for a bounded time only."""
    async with serve(InMemoryLightningStore(thread_safe=True), max_request_bytes=LIMIT) as running:

        def send_forever() -> Tuple[bytes, OSError]:
            with socket.create_connection(_address(running.base), timeout=GIVE_UP_SECONDS) as sock:
                sock.sendall(_head(ENQUEUE, 1 << 40))
                received = bytearray()
                while chunk := sock.recv(64 * 1024):  # the answer, then the end of the server's sending side
                    received += chunk
                try:
                    while True:
                        sock.sendall(b" " * 64 * 1024)
                        time.sleep(0.02)
                except OSError as exc:
                    return bytes(received), exc

        received, error = await asyncio.wait_for(asyncio.to_thread(send_forever), GIVE_UP_SECONDS)
        assert _split_answer(received)[0] == 413
        assert isinstance(error, (ConnectionResetError, BrokenPipeError)), error


async def test_a_body_that_does_not_arrive_in_time_is_408_and_the_connection_closes() -> None:
    async with serve(InMemoryLightningStore(thread_safe=True), body_timeout=0.5) as running:
        body = orjson.dumps({"rollouts": [{"input": "slow"}]}) + b" " * 10_000
        answer = await trickle(running.base, _head(ENQUEUE, len(body), keep_alive=True), body)
        assert answer.status == 408 and answer.headers["connection"] == "close" and answer.closed, answer
        assert not await running.store.query_rollouts()


async def test_a_kept_alive_connection_answers_one_request_after_another() -> None:
    """Connections whose requests arrive whole are not closed: several answers come over one connection."""
    async with serve(InMemoryLightningStore(thread_safe=True), max_request_bytes=LIMIT) as running:
        reader, writer = await asyncio.open_connection(*_address(running.base))
        try:
            for index in range(4):
                body = orjson.dumps({"rollouts": [{"input": f"kept-{index}"}]})
                writer.write(_head(ENQUEUE, len(body), keep_alive=True) + body)
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GIVE_UP_SECONDS)
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await asyncio.wait_for(reader.readexactly(length), GIVE_UP_SECONDS)
                assert head.startswith(b"HTTP/1.1 201") and b"connection: close" not in head.lower(), head
        finally:
            writer.close()
        assert sorted(rollout.input for rollout in await running.store.query_rollouts()) == [
            f"kept-{index}" for index in range(4)
        ]


async def test_a_server_on_its_own_event_loop_thread_lets_httpx_read_the_413() -> None:
    """The thread launch mode runs the server on the event loop agentbolt picks (uvloop where it is installed)."""
    server = LightningStoreServer(
        InMemoryLightningStore(thread_safe=True),
        "127.0.0.1",
        free_port(),
        launch_mode="thread",
        max_request_bytes=LIMIT,
    )
    await server.start()
    try:
        async with httpx.AsyncClient(timeout=GIVE_UP_SECONDS) as client:
            for _ in range(TRIES):
                answer = await client.post(server.endpoint + ENQUEUE, content=BODY)
                assert answer.status_code == 413 and "the limit is 1024 bytes" in answer.json()["detail"]
    finally:
        await server.stop()
