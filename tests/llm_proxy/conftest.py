"""Fixtures: a fake backend on a free port, an in-memory store with one rollout, and a gateway in front of them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Dict, List, Sequence

import pytest

from agentbolt.llm_proxy import LLMProxy
from agentbolt.store.base import LightningStore
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout, Span

from .fake_backend import FakeBackend, running_backend

BEHAVIOURS = [
    "echo",
    "slow",
    "fail500",
    "flaky",
    "ratelimit",
    "badrequest",
    "malformed",
    "drop",
    "gated",
    "quotes_done",
    "nodone",
    "compact",
    "oddchoices",
    "surrogate",
]


def model_list_for(backend: FakeBackend, provider: str = "hosted_vllm") -> List[Dict[str, Any]]:
    """One entry per fake behaviour, named after it."""
    return [
        {"model_name": name, "litellm_params": {"model": f"{provider}/{name}", "api_base": backend.base_url}}
        for name in BEHAVIOURS
    ]


async def wait_for_spans(store: LightningStore, rollout_id: str, count: int, timeout: float = 10.0) -> Sequence[Span]:
    """Poll the store until the rollout has ``count`` spans (the gateway writes them in the background)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        spans = await store.query_spans(rollout_id)
        if len(spans) >= count or asyncio.get_running_loop().time() > deadline:
            return spans
        await asyncio.sleep(0.02)


@pytest.fixture
async def backend() -> AsyncIterator[FakeBackend]:
    async with running_backend(slow_seconds=1.0) as fake:
        yield fake


@pytest.fixture
def store() -> InMemoryLightningStore:
    return InMemoryLightningStore()


@pytest.fixture
async def rollout(store: InMemoryLightningStore) -> AttemptedRollout:
    return await store.start_rollout(input={"task": "gateway test"})


ProxyFactory = Callable[..., "contextlib.AbstractAsyncContextManager[LLMProxy]"]


@pytest.fixture
def make_proxy(backend: FakeBackend, store: InMemoryLightningStore) -> ProxyFactory:
    """Start an in-loop (asyncio mode) proxy over the fake backend; keyword arguments go to ``LLMProxy``."""

    @contextlib.asynccontextmanager
    async def factory(**kwargs: Any) -> AsyncIterator[LLMProxy]:
        kwargs.setdefault("model_list", model_list_for(backend))
        kwargs.setdefault("store", store)
        kwargs.setdefault("launch_mode", "asyncio")
        proxy = LLMProxy(**kwargs)
        await proxy.start()
        try:
            yield proxy
        finally:
            await proxy.stop()

    return factory
