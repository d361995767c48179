"""Answers the gateway sends before a request's body has arrived (a 401 for a missing key, a 413 for a body over the
limit) reach an httpx client that sends its whole body before it reads the answer.

Each test runs a real gateway on a free 127.0.0.1 port in front of the fake backend, and posts bodies far larger
than the socket buffers (8 MB against a 1 KB limit).
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import httpx

from agentbolt.gateway import Gateway, GatewaySettings, create_app
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

from .conftest import model_list_for
from .fake_backend import FakeBackend

KEY = "gateway-key"
BODY = b'{"model": "echo", "messages": []' + b" " * (8 * 1024 * 1024) + b"}"
TRIES = 10


@contextlib.asynccontextmanager
async def _gateway(backend: FakeBackend, store: InMemoryLightningStore, **settings: Any) -> AsyncIterator[str]:
    gateway = Gateway(model_list_for(backend), store, GatewaySettings(**settings))
    launcher = PythonServerLauncher(
        create_app(gateway), PythonServerLauncherArgs(launch_mode="asyncio"), serve_context=gateway.serving
    )
    await launcher.start()
    try:
        yield launcher.access_endpoint
    finally:
        await launcher.stop()


async def test_httpx_reads_the_413_of_an_oversized_body(backend: FakeBackend, store: InMemoryLightningStore) -> None:
    async with (
        _gateway(backend, store, max_request_bytes=1024) as endpoint,
        httpx.AsyncClient(timeout=60) as client,
    ):
        for _ in range(TRIES):
            answer = await client.post(f"{endpoint}/v1/chat/completions", content=BODY)
            assert answer.status_code == 413 and "limit of 1024 bytes" in answer.text, answer.text

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused once the limit is passed
                for start in range(0, len(BODY), 64 * 1024):
                    yield BODY[start : start + 64 * 1024]

            answer = await client.post(f"{endpoint}/v1/chat/completions", content=chunks())
            assert answer.status_code == 413 and "limit of 1024 bytes" in answer.text, answer.text
    assert backend.count("echo") == 0


async def test_httpx_reads_the_401_of_a_large_body_without_the_key(
    backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    async with _gateway(backend, store, api_key=KEY) as endpoint, httpx.AsyncClient(timeout=60) as client:
        for _ in range(TRIES):
            answer = await client.post(f"{endpoint}/v1/chat/completions", content=BODY)
            assert answer.status_code == 401, answer.text
    assert backend.count("echo") == 0
