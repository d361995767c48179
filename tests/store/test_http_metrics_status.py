"""The status label of the store server's ``agl.http.*`` metrics for requests that never complete: a body that does
not arrive in time is counted as the 408 its client gets, a client that goes away as 499.

Every test runs a real LightningStoreServer on a free 127.0.0.1 port, records into its own Prometheus registry and
sends its request over a raw socket.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest
from support.slow_clients import GIVE_UP_SECONDS, trickle

from agentbolt.store.memory import InMemoryLightningStore

from .test_http import PREFIX, serve

ENQUEUE = PREFIX + "/queues/rollouts/enqueue"
BODY = b'{"rollouts": [{"input": "never whole"}]}' + b" " * 1_000


def _head(length: int) -> bytes:
    return (
        f"POST {ENQUEUE} HTTP/1.1\r\nHost: store\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _tracker() -> Any:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from agentbolt.utils.metrics import PrometheusMetricsBackend

    return PrometheusMetricsBackend(registry=CollectorRegistry())  # the global registry may hold other servers' series


def _enqueue_counts(tracker: Any) -> List[Dict[str, Any]]:
    """The ``agl_http_total`` samples of the enqueue route: their labels and value."""
    return [
        {**sample.labels, "value": sample.value}
        for family in tracker._registry.collect()
        for sample in family.samples
        if sample.name == "agl_http_total" and sample.labels.get("path") == ENQUEUE
    ]


async def _recorded(tracker: Any) -> List[Dict[str, Any]]:
    """The enqueue route's samples, once there are any (the server records a request after answering it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GIVE_UP_SECONDS  # guards against a hang only
    while not (counts := _enqueue_counts(tracker)):
        assert loop.time() < deadline, "the server recorded no metric for the request"
        await asyncio.sleep(0.01)
    return counts


async def test_a_body_that_does_not_arrive_in_time_is_counted_as_408() -> None:
    tracker = _tracker()
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, tracker=tracker, body_timeout=0.5) as running:
        # The headers and half the body, then nothing more: the client waits for an answer.
        answer = await trickle(running.base, _head(len(BODY)) + BODY[: len(BODY) // 2], b"")
        assert answer.status == 408, answer
        assert await _recorded(tracker) == [{"path": ENQUEUE, "method": "POST", "status": "408", "value": 1.0}]


async def test_a_client_that_leaves_mid_body_is_counted_as_499() -> None:
    tracker = _tracker()
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, tracker=tracker, body_timeout=60) as running:
        host, port = running.base.split("//", 1)[1].rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(_head(len(BODY)) + BODY[: len(BODY) // 2])
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        assert await _recorded(tracker) == [{"path": ENQUEUE, "method": "POST", "status": "499", "value": 1.0}]
        assert not await store.query_rollouts()


async def test_a_body_refused_as_too_large_is_counted_as_413() -> None:
    tracker = _tracker()
    store = InMemoryLightningStore(thread_safe=True)
    async with serve(store, tracker=tracker, max_request_bytes=len(BODY) - 1) as running:
        answer = await trickle(running.base, _head(len(BODY)), BODY)
        assert answer.status == 413, answer
        assert await _recorded(tracker) == [{"path": ENQUEUE, "method": "POST", "status": "413", "value": 1.0}]
