"""The gateway's ``agentbolt.gateway.*`` metrics: requests, errors, latency, time to first token, tokens in and out."""

from __future__ import annotations

from typing import Any, AsyncIterator, Dict, Optional

import httpx
import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from agentbolt.types import AttemptedRollout  # noqa: E402
from agentbolt.utils.metrics import PrometheusMetricsBackend, set_default_tracker  # noqa: E402

from .conftest import ProxyFactory  # noqa: E402


@pytest.fixture
def registry() -> AsyncIterator[Any]:
    registry = prometheus_client.CollectorRegistry()
    set_default_tracker(PrometheusMetricsBackend(registry=registry))
    try:
        yield registry
    finally:
        set_default_tracker(None)


def _value(registry: Any, name: str, labels: Optional[Dict[str, str]] = None) -> float:
    return registry.get_sample_value(name, labels or {}) or 0.0


async def test_calls_are_counted_with_latency_tokens_and_errors(
    registry: Any, make_proxy: ProxyFactory, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        base = f"{proxy.endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            messages = [{"role": "user", "content": "hello"}]
            ok = await http.post("/chat/completions", json={"model": "echo", "messages": messages})
            failed = await http.post("/chat/completions", json={"model": "fail500", "messages": messages})
            unknown = await http.post("/chat/completions", json={"model": "nope", "messages": messages})
            async with http.stream(
                "POST",
                "/chat/completions",
                json={"model": "echo", "messages": messages, "stream": True, "stream_options": {"include_usage": True}},
            ) as streamed:
                body = b"".join([chunk async for chunk in streamed.aiter_bytes()])
    assert ok.status_code == 200 and failed.status_code >= 500 and unknown.status_code == 404 and b"[DONE]" in body

    chat = {"endpoint": "chat/completions", "model": "echo"}
    assert _value(registry, "agentbolt_gateway_requests_total", {**chat, "status": "200"}) == 2
    assert _value(registry, "agentbolt_gateway_latency_count", chat) == 2
    assert _value(registry, "agentbolt_gateway_time_to_first_token_count", chat) == 1
    assert _value(registry, "agentbolt_gateway_tokens_total", {**chat, "direction": "output"}) >= 4
    assert _value(registry, "agentbolt_gateway_tokens_total", {**chat, "direction": "input"}) == len("hello")
    errors = {s.labels["model"]: s.labels["error_type"] for s in _samples(registry, "agentbolt_gateway_errors_total")}
    assert errors["unknown"] == "http_404" and errors["fail500"]


def _samples(registry: Any, name: str) -> Any:
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == name:
                yield sample


async def test_without_a_tracker_the_gateway_records_nothing(make_proxy: ProxyFactory) -> None:
    set_default_tracker(None)
    async with make_proxy() as proxy:
        assert proxy._gateway.metrics is None
