"""The gateway against careless or hostile clients: bodies cut short and streams left midway, in front of a real
inference server (the tiny random Llama), both requiring a key; and error answers that must not carry what a
backend's URL holds.

The clients are raw sockets, which can stop at any byte, and httpx.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Tuple

import httpx
import pytest
from support.models import serving

from agentbolt.llm_proxy import LLMProxy
from agentbolt.serving.server import InferenceServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout

from .conftest import ProxyFactory, wait_for_spans
from .fake_backend import FakeBackend

GATEWAY_KEY = "gateway-hostile-key"
SERVE_KEY = "serve-hostile-key"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def serve(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    with serving(tiny_model_dir, server_options={"api_key": SERVE_KEY}) as server:
        yield server


@pytest.fixture
async def proxy(serve: InferenceServer, store: InMemoryLightningStore) -> AsyncIterator[LLMProxy]:
    params = {"model": "hosted_vllm/tiny", "api_base": serve.base_url, "api_key": SERVE_KEY}
    gateway = LLMProxy(
        model_list=[{"model_name": "tiny", "litellm_params": params}],
        store=store,
        launch_mode="asyncio",
        api_key=GATEWAY_KEY,
    )
    await gateway.start()
    yield gateway
    await gateway.stop()


async def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 120  # guards against a hang only
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def _open(
    proxy: LLMProxy, path: str, body: bytes, declared: int
) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has sent a request's head and ``body`` (of ``declared`` bytes announced)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {GATEWAY_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


async def _chat(proxy: LLMProxy) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120) as client:
        return await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "max_tokens": 3},
            headers={"Authorization": f"Bearer {GATEWAY_KEY}"},
        )


async def test_a_client_leaving_mid_body_is_no_server_error(proxy: LLMProxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _, writer = await _open(proxy, "/v1/chat/completions", b'{"model": "tiny", "messa', declared=10_000)
    writer.close()
    left = "before sending its whole body"
    await _wait_for(
        lambda: any(left in r.getMessage() or r.levelno >= logging.ERROR for r in caplog.records),
        "the gateway noticed the client left",
    )
    errors: List[Any] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert (await _chat(proxy)).status_code == 200


async def test_a_stream_the_client_leaves_frees_the_engine_slot_behind_the_gateway(
    proxy: LLMProxy, serve: InferenceServer, rollout: AttemptedRollout
) -> None:
    engine = serve.engine
    before = engine.stats()["generated_tokens"]
    body: Dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "stream": True, "max_tokens": 1500}
    body["ignore_eos"] = True
    raw = json.dumps(body).encode()
    path = f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"
    reader, writer = await _open(proxy, path, raw, declared=len(raw))
    first = await reader.readuntil(b"data: ")
    assert first.startswith(b"HTTP/1.1 200"), first
    writer.close()
    await _wait_for(
        lambda: engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0 and engine.queued_tokens == 0,
        "the engine dropped the stream the gateway's client left",
    )
    assert engine.stats()["generated_tokens"] - before < 1500  # it stopped long before its budget
    assert (await _chat(proxy)).status_code == 200


@pytest.mark.parametrize(
    ("api_base", "shown"),
    [
        ("http://agent:pass-in-url@127.0.0.1:9/v1", "http://***@127.0.0.1:9/v1"),
        ("http://127.0.0.1:9/v1?key=key-in-query", "http://127.0.0.1:9/v1?***"),
    ],
)
async def test_credentials_in_a_backend_url_are_not_in_error_answers(
    make_proxy: ProxyFactory, api_base: str, shown: str
) -> None:
    dead = [{"model_name": "dead", "litellm_params": {"model": "openai/x", "api_base": api_base}}]
    async with make_proxy(model_list=dead) as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "dead", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 502
    assert f"Upstream {shown} (x) is unreachable" in response.json()["error"]["message"]
    assert "pass-in-url" not in response.text and "key-in-query" not in response.text


async def test_credentials_in_a_backend_url_are_not_recorded_in_spans(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    model = "echo"
    api_base = backend.base_url.replace("http://", "http://agent:pass-in-url@")
    models = [{"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": api_base}}]
    async with make_proxy(model_list=models) as proxy, httpx.AsyncClient() as client:
        base = proxy.as_resource().get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)  # type: ignore[call-arg]
        response = await client.post(
            f"{base}/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]}
        )
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert "pass-in-url" not in response.text
    assert span.attributes["server.address"] == backend.base_url.replace("http://", "http://***@")
    assert "pass-in-url" not in str(span.attributes)
