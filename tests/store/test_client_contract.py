"""The client's retry contract, against a real server behind a real flaky TCP proxy (a stand-in for a bad network).

Rules (api-contract.md §4.7, LightningStoreClient): retries on 5xx/408 and network errors after each of
``retry_delays`` (1 + len(retry_delays) attempts); health probing with ``health_retry_delays`` between a failure and
its retry (an empty tuple skips it); other 4xx raised at once as ``aiohttp.ClientResponseError``; dequeue never
retried; a retry never applies a non-idempotent call twice.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Tuple

import aiohttp
import pytest
from support.flaky_proxy import FlakyProxy
from support.servers import free_port, taken_port

from agentbolt.store.http import LightningStoreClient, LightningStoreHTTPError, LightningStoreServer
from agentbolt.store.http.errors import NOT_APPLIED_HEADER
from agentbolt.store.memory import InMemoryLightningStore

from .conftest import make_span

FAST = (0.01, 0.01, 0.01)


@pytest.fixture
async def proxied() -> AsyncIterator[Tuple[InMemoryLightningStore, LightningStoreServer, FlakyProxy]]:
    store = InMemoryLightningStore(thread_safe=True)
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="asyncio")
    await server.start()
    try:
        async with FlakyProxy(int(server.endpoint.rsplit(":", 1)[1])) as proxy:
            yield store, server, proxy
    finally:
        await server.stop()


def client_for(proxy: FlakyProxy, **kwargs: object) -> LightningStoreClient:
    options: dict[str, object] = {"retry_delays": FAST, "health_retry_delays": (0.01,)}
    options.update(kwargs)
    return LightningStoreClient(proxy.endpoint, **options)  # type: ignore[arg-type]


async def test_5xx_and_408_are_retried_until_success(proxied) -> None:  # type: ignore[no-untyped-def]
    _, _, proxy = proxied
    client = client_for(proxy)
    try:
        proxy.fail_next("status", "/statistics", count=1, status=503)
        proxy.fail_next("status", "/statistics", count=1, status=408)
        proxy.fail_next("status", "/statistics", count=1, status=502)
        assert (await client.statistics())["total_rollouts"] == 0
        assert proxy.count("/statistics") == 4  # three failures, then the answer
        assert proxy.count("/health") == 3  # one probe before each retry
    finally:
        await client.close()


async def test_attempts_are_one_plus_retry_delays(proxied) -> None:  # type: ignore[no-untyped-def]
    _, _, proxy = proxied
    client = client_for(proxy, retry_delays=(0.01, 0.01))
    try:
        proxy.fail_next("status", "/statistics", count=100, status=500)
        with pytest.raises(LightningStoreHTTPError) as info:
            await client.statistics()
        assert info.value.status == 500 and isinstance(info.value, aiohttp.ClientResponseError)
        assert proxy.count("/statistics") == 3
    finally:
        await client.close()


async def test_unhealthy_server_stops_the_retries(proxied) -> None:  # type: ignore[no-untyped-def]
    _, _, proxy = proxied
    client = client_for(proxy, health_retry_delays=(0.01, 0.01))
    try:
        proxy.fail_next("status", "/statistics", count=100, status=503)
        proxy.fail_next("status", "/health", count=100, status=503)
        with pytest.raises(LightningStoreHTTPError):
            await client.statistics()
        assert proxy.count("/statistics") == 1  # no retry: the server never answered its health check
        assert proxy.count("/health") == 3  # one probe per health delay plus a final one
    finally:
        await client.close()


async def test_empty_health_delays_skip_probing(proxied) -> None:  # type: ignore[no-untyped-def]
    _, _, proxy = proxied
    client = client_for(proxy, health_retry_delays=())
    try:
        proxy.fail_next("status", "/statistics", count=2, status=503)
        proxy.fail_next("status", "/health", count=100, status=503)
        assert (await client.statistics())["total_rollouts"] == 0
        assert proxy.count("/health") == 0 and proxy.count("/statistics") == 3
    finally:
        await client.close()


async def test_other_4xx_raise_at_once_with_the_server_message(proxied) -> None:  # type: ignore[no-untyped-def]
    _, _, proxy = proxied
    client = client_for(proxy)
    try:
        with pytest.raises(aiohttp.ClientResponseError) as info:
            await client.update_rollout("ro-missing", status="failed")
        assert info.value.status == 404 and "ro-missing" in info.value.message
        assert isinstance(info.value, ValueError)  # also what an in-process store raises
        assert proxy.count("/rollouts/ro-missing") == 1 and proxy.count("/health") == 0
        proxy.fail_next("status", "/statistics", count=1, status=429)
        with pytest.raises(aiohttp.ClientResponseError) as info:
            await client.statistics()
        assert info.value.status == 429 and proxy.count("/statistics") == 1
    finally:
        await client.close()


async def test_network_errors_are_retried_for_idempotent_calls(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy, request_timeout=1.0)
    try:
        rollout = await store.start_rollout("x")
        proxy.fail_next("reset", f"/rollouts/{rollout.rollout_id}", count=1)  # ServerDisconnectedError
        proxy.fail_next("drop_answer", f"/rollouts/{rollout.rollout_id}", count=1)  # applied, answer lost
        proxy.fail_next("delay", f"/rollouts/{rollout.rollout_id}", count=1, delay=1.5)  # asyncio.TimeoutError
        updated = await client.update_rollout(rollout.rollout_id, metadata={"k": 1})
        assert updated.metadata == {"k": 1}
        assert proxy.count(f"/rollouts/{rollout.rollout_id}") == 4
    finally:
        await client.close()


async def test_refused_connections_are_retried_until_the_server_is_back(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy, retry_delays=(0.2, 0.2, 0.5, 1.0), health_retry_delays=(0.2, 0.2, 0.5))
    try:
        await proxy.refuse()

        async def back_later() -> None:
            await asyncio.sleep(0.3)
            await proxy.accept()

        returning = asyncio.ensure_future(back_later())
        # Not idempotent, yet retried: a refused connection never carried the request.
        rollout = await client.start_rollout("after the outage")
        await returning
        assert (await store.get_rollout_by_id(rollout.rollout_id)) is not None
        assert len(await store.query_rollouts()) == 1
    finally:
        await client.close()


async def test_ambiguous_failures_never_apply_a_call_twice(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy)
    try:
        proxy.fail_next("drop_answer", "POST /v1/agl/rollouts ", count=1)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await client.start_rollout("applied, answer lost")
        proxy.fail_next("drop_answer", "/queues/rollouts/enqueue", count=1)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await client.enqueue_rollout("applied, answer lost")
        proxy.fail_next("status", "/queues/rollouts/enqueue", count=1, status=502)  # from a proxy: outcome unknown
        with pytest.raises(LightningStoreHTTPError):
            await client.enqueue_rollout("maybe applied")
        # Each call was sent once: the server holds exactly what reached it.
        assert proxy.count("POST /v1/agl/rollouts ") == 1 and proxy.count("/queues/rollouts/enqueue") == 2
        assert sorted(r.input for r in await store.query_rollouts()) == ["applied, answer lost"] * 2
    finally:
        await client.close()


async def test_updates_a_second_send_could_apply_elsewhere_are_not_resent(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy)
    try:
        first = await store.start_rollout("x")
        rid = first.rollout_id
        # "latest" names another attempt once a worker has claimed the rollout again: not resent.
        proxy.fail_next("drop_answer", f"/rollouts/{rid}/attempts/latest", count=1)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await client.update_attempt(rid, "latest", status="failed")
        assert proxy.count(f"/rollouts/{rid}/attempts/latest") == 1
        # A status that queues the rollout would queue it again beside a worker that claimed it: not resent.
        proxy.fail_next("drop_answer", f"/rollouts/{rid}", count=1)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await client.update_rollout(rid, status="requeuing")
        claimed = await store.dequeue_rollout(worker_id="w")
        assert claimed is not None and claimed.attempt.sequence_id == 2
        assert await store.dequeue_rollout(worker_id="w") is None  # queued once
        # An update naming its attempt, or setting a final status, is resent.
        proxy.fail_next("drop_answer", f"/rollouts/{rid}/attempts/{claimed.attempt.attempt_id}", count=1)
        updated = await client.update_attempt(rid, claimed.attempt.attempt_id, status="succeeded")
        assert updated.status == "succeeded" and proxy.count(f"/attempts/{claimed.attempt.attempt_id}") == 2
        proxy.fail_next("drop_answer", f"/rollouts/{rid}", count=1)
        assert (await client.update_rollout(rid, status="cancelled")).status == "cancelled"
    finally:
        await client.close()


async def test_a_resent_span_returns_the_span_its_first_send_stored(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy)
    try:
        rollout = await store.start_rollout("x")
        span = make_span(rollout.rollout_id, rollout.attempt.attempt_id, 1, "s-1")
        proxy.fail_next("drop_answer", "POST /v1/agl/spans ", count=1)  # stored, answer lost, sent again
        stored = await client.add_span(span)
        assert stored is not None and stored.span_id == span.span_id
        assert proxy.count("POST /v1/agl/spans ") == 2
        assert len(await store.query_spans(rollout.rollout_id)) == 1
        assert await client.add_span(span) is None  # a true duplicate stays None
    finally:
        await client.close()


async def test_answers_that_guarantee_nothing_was_applied_are_retried(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy)
    try:
        proxy.fail_next("status", "/queues/rollouts/enqueue", count=2, status=503, headers=[f"{NOT_APPLIED_HEADER}: 1"])
        rollout = await client.enqueue_rollout("stored once")
        assert proxy.count("/queues/rollouts/enqueue") == 3
        assert [r.rollout_id for r in await store.query_rollouts()] == [rollout.rollout_id]
    finally:
        await client.close()


async def test_dequeue_is_never_retried(proxied) -> None:  # type: ignore[no-untyped-def]
    store, _, proxy = proxied
    client = client_for(proxy)
    try:
        await store.enqueue_rollout("waiting")
        proxy.fail_next("status", "/queues/rollouts/dequeue", count=1, status=503)
        assert await client.dequeue_rollout(worker_id="w") is None
        proxy.fail_next("reset", "/queues/rollouts/dequeue", count=1)
        assert await client.dequeue_many_rollouts(limit=2, worker_id="w") == []
        assert proxy.count("/queues/rollouts/dequeue") == 2 and proxy.count("/health") == 0
        claimed = await client.dequeue_rollout(worker_id="w")
        assert claimed is not None and claimed.input == "waiting"
    finally:
        await client.close()


async def test_getters_return_none_after_failures(proxied) -> None:  # type: ignore[no-untyped-def]
    _, _, proxy = proxied
    client = client_for(proxy, retry_delays=(0.01,))
    try:
        proxy.fail_next("status", "/resources/latest", count=2, status=500)
        assert await client.get_latest_resources() is None
        assert proxy.count("/resources/latest") == 2
    finally:
        await client.close()


@pytest.mark.parametrize("launch_mode", ["asyncio", "thread"])
async def test_port_conflict_is_a_runtime_error(launch_mode: str) -> None:
    with taken_port() as port:
        server = LightningStoreServer(
            InMemoryLightningStore(thread_safe=True), "127.0.0.1", port, launch_mode=launch_mode
        )  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="did not start up within"):
            await server.start()
        assert not server.is_running()
