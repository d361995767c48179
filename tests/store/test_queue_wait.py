"""``wait_for_queued_rollouts``: a runner that found the queue empty waits for a rollout to be queued instead of
sleeping its poll interval, on every backend (in process and over HTTP)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.store.threading import LightningStoreThreaded
from agentbolt.types import RolloutConfig

from .conftest import make_store


async def test_an_empty_queue_waits_out_the_timeout(store: LightningStore) -> None:
    assert await store.wait_for_queued_rollouts(0) is False
    assert await store.wait_for_queued_rollouts(0.2) is False


async def test_a_queued_rollout_answers_at_once_and_a_claimed_one_no_longer_counts(store: LightningStore) -> None:
    await store.enqueue_rollout("x")
    assert await asyncio.wait_for(store.wait_for_queued_rollouts(120), 30) is True
    assert await store.dequeue_rollout() is not None
    assert await store.wait_for_queued_rollouts(0) is False


async def test_a_rollout_queued_during_the_wait_wakes_it(store: LightningStore) -> None:
    waiting = asyncio.ensure_future(store.wait_for_queued_rollouts(120))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await store.enqueue_many_rollouts([{"input": "a"}, {"input": "b"}])  # type: ignore[list-item]
    assert await asyncio.wait_for(waiting, 30) is True


@pytest.mark.parametrize("timeout", [-1, math.inf, math.nan, 301, "soon", True])
async def test_timeouts_that_are_not_seconds_in_range_are_refused(store: LightningStore, timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout must be"):  # the client refuses it before sending anything
        await store.wait_for_queued_rollouts(timeout)


@pytest.mark.parametrize("timeout", [-1, 301, "soon"])
async def test_the_server_refuses_timeouts_out_of_range(tmp_path: Path, timeout: Any) -> None:
    async with make_store("http_memory", tmp_path) as client:
        status, body = await _post(client, "/waits/queue", {"timeout": timeout})
        assert 400 <= status < 500 and b"timeout" in body


async def test_waiters_are_woken_by_enqueues_and_requeues_without_polling(inproc_backend: str, tmp_path: Path) -> None:
    async with make_store(inproc_backend, tmp_path) as store:
        inner = store.store if isinstance(store, LightningStoreThreaded) else store
        inner._wait_poll_interval = 600.0  # type: ignore[attr-defined]  # only a notification can wake it in time

        waiting = asyncio.ensure_future(store.wait_for_queued_rollouts(120))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await store.enqueue_rollout("x", config=RolloutConfig(max_attempts=2, retry_condition=["failed"]))
        assert await asyncio.wait_for(waiting, 30) is True

        claimed = await store.dequeue_rollout()
        assert claimed is not None
        waiting = asyncio.ensure_future(store.wait_for_queued_rollouts(120))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="failed")  # requeued
        assert await asyncio.wait_for(waiting, 30) is True
        assert (await store.get_rollout_by_id(claimed.rollout_id)).status == "requeuing"  # type: ignore[union-attr]


async def _post(client: Any, path: str, body: Any) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(client.server_address + path, json=body) as response:
        return response.status, await response.read()


async def test_a_server_without_the_route_is_waited_out_by_sleeping(tmp_path: Path) -> None:
    """Another implementation of the store API answers 404: the client sleeps the timeout, and asks only once."""
    from aiohttp import web
    from support.servers import free_port

    from agentbolt.store.http import LightningStoreClient

    seen: list = []

    async def not_found(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    client = LightningStoreClient(f"http://127.0.0.1:{port}", retry_delays=(), health_retry_delays=())
    try:
        for _ in range(2):
            assert await client.wait_for_queued_rollouts(0.2) is False
        assert seen == ["/v1/agl/waits/queue"]
    finally:
        await client.close()
        await runner.cleanup()


async def test_a_server_shutting_down_ends_long_waits_with_a_retryable_503() -> None:
    """Waits outlasting the shutdown's grace period would hold it up, then fail with a 500: they end at once. A
    wait that ends within the grace period answers as usual."""
    import aiohttp
    from support.servers import free_port

    from agentbolt.store.http import LightningStoreServer
    from agentbolt.store.http.errors import NOT_APPLIED_HEADER
    from agentbolt.store.memory import InMemoryLightningStore

    inner = InMemoryLightningStore(thread_safe=True)
    running = await inner.start_rollout("x")
    server = LightningStoreServer(inner, host="127.0.0.1", port=free_port())  # a grace period of 5 s
    await server.start()

    async def wait(session: aiohttp.ClientSession, path: str, body: Any) -> Any:
        async with session.post(server.endpoint + "/v1/agl" + path, json=body) as response:
            return response.status, response.headers.get(NOT_APPLIED_HEADER), await response.json()

    async with aiohttp.ClientSession() as session:
        long_waits = asyncio.gather(
            wait(session, "/waits/queue", {"timeout": 120}),
            wait(session, "/waits/rollouts", {"rollout_ids": [running.rollout_id], "timeout": 120}),
            wait(session, "/waits/rollouts", {"rollout_ids": [running.rollout_id], "timeout": None}),
        )
        short_wait = asyncio.ensure_future(
            wait(session, "/waits/rollouts", {"rollout_ids": [running.rollout_id], "timeout": 2})
        )
        await asyncio.sleep(0.5)
        assert not long_waits.done() and not short_wait.done()
        await server.stop()
        answers = await asyncio.wait_for(long_waits, 60)
        assert await short_wait == (200, None, [])
    for status, not_applied, body in answers:
        assert (status, not_applied, body["error_type"]) == (503, "1", "ServerShuttingDownError")
        assert "shutting down" in body["detail"]


async def test_a_client_waiting_across_a_server_restart_keeps_waiting() -> None:
    from support.servers import free_port

    from agentbolt.store.http import LightningStoreClient, LightningStoreServer
    from agentbolt.store.memory import InMemoryLightningStore

    inner = InMemoryLightningStore(thread_safe=True)
    running = await inner.start_rollout("x")
    server = LightningStoreServer(inner, host="127.0.0.1", port=free_port())
    await server.start()
    client = LightningStoreClient(
        server.endpoint, retry_delays=(0.5, 1.0, 2.0, 4.0), health_retry_delays=(), long_waits=True
    )
    try:
        waiting = asyncio.ensure_future(client.wait_for_rollouts(rollout_ids=[running.rollout_id], timeout=120))
        await asyncio.sleep(0.5)
        await server.stop()
        await server.start()
        await inner.update_attempt(running.rollout_id, running.attempt.attempt_id, status="succeeded")
        (finished,) = await asyncio.wait_for(waiting, 60)
        assert (finished.rollout_id, finished.status) == (running.rollout_id, "succeeded")
    finally:
        await client.close()
        await server.stop()
