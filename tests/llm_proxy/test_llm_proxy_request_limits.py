"""``LLMProxy(body_timeout=..., max_request_bytes=...)``: the limits reach the gateway it serves, and bad values are
refused when the proxy is made.

Each serving test starts a real proxy (asyncio mode, free 127.0.0.1 port) in front of the fake backend.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from support.slow_clients import trickle

from agentbolt.llm_proxy import LLMProxy
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout

from .conftest import ProxyFactory

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_body_beyond_max_request_bytes_is_refused_with_413(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    async with make_proxy(max_request_bytes=2_000) as proxy:
        url = f"{proxy.endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=60) as client:
            large = {**CHAT, "messages": [{"role": "user", "content": "x" * 3_000}]}
            assert (await client.post(url, json=large)).status_code == 413
            assert (await client.post(url, json=CHAT)).status_code == 200
    assert len(await store.query_spans(rollout.rollout_id)) == 1  # only the call within the limit


async def test_a_body_not_whole_within_body_timeout_is_refused_with_408(make_proxy: ProxyFactory) -> None:
    body = orjson.dumps(CHAT) + b" " * 10_000
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    async with make_proxy(body_timeout=0.5) as proxy:
        answer = await trickle(proxy.endpoint, head + body[:100], b"")  # then silence: the rest never comes
    assert answer.status == 408 and answer.closed, answer
    assert "0.5 seconds" in str(answer.json())


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"body_timeout": 0}, ValueError, "body_timeout must be greater than 0, got 0"),
        ({"body_timeout": float("inf")}, ValueError, "body_timeout must be a finite number, got inf"),
        ({"body_timeout": True}, TypeError, "body_timeout must be a number, got bool True"),
        ({"body_timeout": "5"}, TypeError, "body_timeout must be a number, got str '5'"),
        ({"max_request_bytes": 0}, ValueError, "max_request_bytes must be at least 1, got 0"),
        ({"max_request_bytes": 1.5}, TypeError, "max_request_bytes must be an integer, got float 1.5"),
        ({"max_request_bytes": True}, TypeError, "max_request_bytes must be an integer, got bool True"),
    ],
)
def test_bad_limits_are_refused(options: Any, error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment.replace(".", r"\.")):
        LLMProxy(launch_mode="asyncio", **options)


def test_the_limits_are_keyword_only_after_the_contract_parameters() -> None:
    import inspect

    parameters = inspect.signature(LLMProxy).parameters
    assert list(parameters)[:11] == [
        "port", "model_list", "store", "host", "litellm_config", "num_retries", "num_workers", "launch_mode",
        "launcher_args", "middlewares", "callbacks",
    ]  # fmt: skip
    for name in ("body_timeout", "max_request_bytes"):
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
