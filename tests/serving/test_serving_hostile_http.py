"""The inference server against careless clients: bodies cut short, streams left midway, idle connections.

A real server on a free 127.0.0.1 port runs the tiny random Llama; the clients are raw sockets, which can stop at any
byte.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving
from support.slow_clients import trickle

from agentbolt.serving.server import InferenceServer, ServingLimits

KEY = "serving-hostile-key"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def protected(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    with serving(tiny_model_dir, max_batch_size=4, server_options={"api_key": KEY}) as server:
        yield server


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 120  # guards against a hang only
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _open(server: InferenceServer, path: str, body: bytes, declared: int) -> socket.socket:
    """A connection that has sent a request's head and ``body`` (of ``declared`` bytes announced)."""
    connection = socket.create_connection((server.host, server.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: serve\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    connection.sendall(head.encode() + body)
    return connection


def _chat(server: InferenceServer) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(f"{server.base_url}/chat/completions", json=CHAT, headers=headers, timeout=120)


def test_a_client_leaving_mid_body_is_no_server_error(
    protected: InferenceServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    connection = _open(protected, "/v1/chat/completions", b'{"model": "tiny", "messa', declared=10_000)
    connection.close()
    left = "before sending its whole body"
    _wait_for(
        lambda: any(left in r.getMessage() or r.levelno >= logging.ERROR for r in caplog.records),
        "the server noticed the client left",
    )
    errors: List[Any] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert _chat(protected).status_code == 200


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_a_stream_the_client_leaves_frees_its_engine_slot(protected: InferenceServer, route: str) -> None:
    engine = protected.engine
    before = engine.stats()["generated_tokens"]
    body: Dict[str, Any] = {"model": "tiny", "stream": True, "max_tokens": 1500, "ignore_eos": True}
    body.update({"messages": CHAT["messages"]} if route == "chat/completions" else {"prompt": "hi"})
    raw = json.dumps(body).encode()
    connection = _open(protected, f"/v1/{route}", raw, declared=len(raw))
    first = connection.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first
    connection.close()
    _wait_for(
        lambda: engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0 and engine.queued_tokens == 0,
        "the engine dropped the abandoned stream",
    )
    assert engine.stats()["generated_tokens"] - before < 1500  # it stopped long before its budget
    assert _chat(protected).status_code == 200


def test_idle_and_half_sent_connections_do_not_hold_up_others(protected: InferenceServer) -> None:
    idle = [socket.create_connection((protected.host, protected.port)) for _ in range(100)]
    stalled = [_open(protected, "/v1/chat/completions", b'{"model":', declared=1000) for _ in range(20)]
    try:
        assert _chat(protected).status_code == 200
        assert httpx.get(protected.base_url.removesuffix("/v1") + "/health").status_code == 200
    finally:
        for connection in idle + stalled:
            connection.close()
    _wait_for(lambda: protected.engine.queued_tokens == 0, "no work held for the stalled requests")


@pytest.fixture(scope="module")
def impatient(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    """A server that waits half a second for a request body."""
    options = {"api_key": KEY, "limits": ServingLimits(body_timeout=0.5)}
    with serving(tiny_model_dir, max_batch_size=4, server_options=options) as server:
        yield server


def _head(path: str, declared: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: serve\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_a_body_that_does_not_arrive_in_time_is_408_and_starts_no_work(
    impatient: InferenceServer, route: str
) -> None:
    body = json.dumps({**CHAT, "prompt": "hi"}).encode() + b" " * 10_000
    before = impatient.engine.stats()["generated_tokens"]
    slow = asyncio.ensure_future(trickle(f"http://{impatient.host}:{impatient.port}", _head(route, len(body)), body))
    async with httpx.AsyncClient(timeout=120) as client:
        other = await client.post(
            f"{impatient.base_url}/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"}
        )
    assert not slow.done()  # still in flight while the other request is answered
    answer = await slow
    assert other.status_code == 200
    assert answer.status == 408, answer
    error = answer.json()["error"]  # type: ignore[index]
    assert error["code"] == "request_timeout" and "did not arrive within 0.5 seconds" in error["message"]
    assert answer.headers["connection"] == "close" and answer.closed
    assert impatient.engine.stats()["generated_tokens"] - before == other.json()["usage"]["completion_tokens"]
    assert impatient.engine.queued_tokens == 0


def test_the_body_timeout_must_be_positive() -> None:
    for value in (0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="body_timeout"):
            ServingLimits(body_timeout=value)
