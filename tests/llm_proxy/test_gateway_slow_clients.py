"""The gateway against clients that send their request bodies too slowly: a 408 in the route's error shape, the
connection closed, nothing forwarded or recorded, and other calls unaffected. And against clients still sending a
large body when the gateway answers early (a 401 for a missing key, a 413 for a body over the limit): an httpx client
that sends its whole body before it reads still reads the answer.

Each test runs a real gateway on a free 127.0.0.1 port in front of the fake backend, with a body deadline of half a
second, and trickles bodies over raw sockets or posts bodies far larger than the socket buffers (8 MB against a
1 KB limit).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Dict, Optional

import httpx
import orjson
import pytest
from support.slow_clients import trickle

from agentbolt.gateway import Gateway, GatewaySettings, create_app
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout
from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

from .conftest import model_list_for
from .fake_backend import FakeBackend

KEY = "gateway-key"
LARGE_BODY = b'{"model": "echo", "messages": []' + b" " * (8 * 1024 * 1024) + b"}"
TRIES = 10
CHAT: Dict[str, Any] = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.asynccontextmanager
async def _gateway(backend: FakeBackend, store: InMemoryLightningStore, **settings: Any) -> AsyncIterator[str]:
    settings.setdefault("body_timeout", 0.5)
    gateway = Gateway(model_list_for(backend), store, GatewaySettings(**settings))
    launcher = PythonServerLauncher(
        create_app(gateway), PythonServerLauncherArgs(launch_mode="asyncio"), serve_context=gateway.serving
    )
    await launcher.start()
    try:
        yield launcher.access_endpoint
    finally:
        await launcher.stop()


def _head(path: str, length: int, key: Optional[str] = None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _slow_body(body: Dict[str, Any]) -> bytes:
    return orjson.dumps(body) + b" " * 10_000


@pytest.mark.parametrize("key", [None, KEY])
async def test_a_chat_body_that_does_not_arrive_in_time_is_408_and_not_forwarded(
    backend: FakeBackend, store: InMemoryLightningStore, rollout: AttemptedRollout, key: Optional[str]
) -> None:
    async with _gateway(backend, store, api_key=key) as endpoint:
        path = f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"
        body = _slow_body(CHAT)
        answer = await trickle(endpoint, _head(path, len(body), key), body)
    assert answer.status == 408, answer
    assert answer.json() == {
        "error": {
            "message": "The request body did not arrive within 0.5 seconds of the request headers",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }
    assert answer.headers["connection"] == "close" and answer.closed
    assert backend.count("echo") == 0
    assert not await store.query_spans(rollout.rollout_id)


async def test_a_messages_body_that_does_not_arrive_in_time_is_408_in_anthropic_shape(
    backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    async with _gateway(backend, store) as endpoint:
        body = _slow_body({"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        answer = await trickle(endpoint, _head("/v1/messages", len(body)), body)
    assert answer.status == 408 and answer.closed, answer
    assert answer.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "The request body did not arrive within 0.5 seconds of the request headers",
        },
    }
    assert backend.count("echo") == 0


async def test_a_slow_body_does_not_hold_up_other_calls(backend: FakeBackend, store: InMemoryLightningStore) -> None:
    async with _gateway(backend, store) as endpoint, httpx.AsyncClient(timeout=30) as client:
        body = _slow_body(CHAT)
        slow = asyncio.ensure_future(trickle(endpoint, _head("/v1/chat/completions", len(body)), body))
        answers = [await client.post(f"{endpoint}/v1/chat/completions", json=CHAT) for _ in range(3)]
        assert not slow.done()  # still in flight while the others are answered
        assert (await slow).status == 408
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert backend.count("echo") == 3


async def test_a_refusal_before_the_body_arrives_closes_the_connection(
    backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    """A client without the key is refused at once; trickling the rest of its body cannot hold the connection."""
    async with _gateway(backend, store, api_key=KEY, body_timeout=60) as endpoint:
        body = _slow_body(CHAT)
        answer = await trickle(endpoint, _head("/v1/chat/completions", len(body)), body)
    assert answer.status == 401 and answer.headers["connection"] == "close" and answer.closed


def test_the_body_timeout_must_be_positive() -> None:
    for value in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="body_timeout"):
            create_app(Gateway([], None, GatewaySettings(body_timeout=value)))


async def test_httpx_reads_the_413_of_an_oversized_body(backend: FakeBackend, store: InMemoryLightningStore) -> None:
    async with (
        _gateway(backend, store, max_request_bytes=1024) as endpoint,
        httpx.AsyncClient(timeout=60) as client,
    ):
        for _ in range(TRIES):
            answer = await client.post(f"{endpoint}/v1/chat/completions", content=LARGE_BODY)
            assert answer.status_code == 413 and "limit of 1024 bytes" in answer.text, answer.text

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused once the limit is passed
                for start in range(0, len(LARGE_BODY), 64 * 1024):
                    yield LARGE_BODY[start : start + 64 * 1024]

            answer = await client.post(f"{endpoint}/v1/chat/completions", content=chunks())
            assert answer.status_code == 413 and "limit of 1024 bytes" in answer.text, answer.text
    assert backend.count("echo") == 0


async def test_httpx_reads_the_401_of_a_large_body_without_the_key(
    backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    async with _gateway(backend, store, api_key=KEY) as endpoint, httpx.AsyncClient(timeout=60) as client:
        for _ in range(TRIES):
            answer = await client.post(f"{endpoint}/v1/chat/completions", content=LARGE_BODY)
            assert answer.status_code == 401, answer.text
    assert backend.count("echo") == 0
