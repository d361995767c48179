"""LightningStoreClient during a server outage: the contract's retries by default, riding it out on request.

The server is a real LightningStoreServer on 127.0.0.1 that starts only after the client's first call failed (a port
where nothing listens yet is a server being restarted).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import aiohttp
import pytest
from support.flaky_proxy import FlakyProxy
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreClient, LightningStoreHTTPError, LightningStoreServer
from agentbolt.store.http.errors import NOT_APPLIED_HEADER
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.outage import StoreUnreachableError, outage_tolerance, ride_out_outages, without_retries
from agentbolt.types import PromptTemplate

RESOURCES: Any = {"prompt": PromptTemplate(template="{x}", engine="f-string")}


@pytest.fixture
async def client() -> AsyncIterator[LightningStoreClient]:
    client = LightningStoreClient(f"http://127.0.0.1:{free_port()}", retry_delays=(0.1, 0.2))
    try:
        yield client
    finally:
        await client.close()


async def _serve_later(client: LightningStoreClient, delay: float) -> LightningStoreServer:
    await asyncio.sleep(delay)
    port = int(client.server_address_root.rsplit(":", 1)[1])
    server = LightningStoreServer(InMemoryLightningStore(), "127.0.0.1", port, launch_mode="asyncio")
    await server.start()
    return server


async def test_outside_the_block_reads_give_up_with_none_as_the_contract_says(client: LightningStoreClient) -> None:
    assert outage_tolerance() is None
    assert await client.get_rollout_by_id("ro-any") is None
    with pytest.raises(aiohttp.ClientConnectorError):
        await client.query_resources()


async def test_inside_the_block_calls_wait_for_the_server_to_come_back(client: LightningStoreClient) -> None:
    starting = asyncio.create_task(_serve_later(client, 1.5))
    try:
        with ride_out_outages(30.0):
            # Not idempotent, but a refused connection sent nothing: it is retried too.
            added = await client.add_resources(RESOURCES)
            fetched = await client.get_resources_by_id(added.resources_id)
        assert fetched is not None and fetched.resources_id == added.resources_id
    finally:
        await (await starting).stop()


async def test_inside_the_block_a_call_still_failing_raises_a_typed_error(client: LightningStoreClient) -> None:
    with ride_out_outages(0.5):
        with pytest.raises(StoreUnreachableError, match="stayed unreachable") as caught:
            await client.get_resources_by_id("rs-any")
        assert isinstance(caught.value.__cause__, aiohttp.ClientConnectorError)
        # Dequeues are never retried and report failure as nothing to do, inside the block too.
        assert await client.dequeue_rollout() is None
    assert outage_tolerance() is None


async def test_inside_the_block_a_server_failure_gets_only_the_usual_retries() -> None:
    server = LightningStoreServer(InMemoryLightningStore(), "127.0.0.1", free_port(), launch_mode="asyncio")
    await server.start()
    try:
        async with FlakyProxy(int(server.endpoint.rsplit(":", 1)[1])) as proxy:
            client = LightningStoreClient(proxy.endpoint, retry_delays=(0.01, 0.01), health_retry_delays=())
            try:
                with ride_out_outages(30.0):
                    # 503 (storage unreachable, nothing applied): waited for however many times the server says so.
                    not_applied = [f"{NOT_APPLIED_HEADER}: 1"]
                    proxy.fail_next("status", "/resources", count=5, status=503, headers=not_applied)
                    added = await client.add_resources(RESOURCES)
                    assert proxy.count("/resources") == 6
                    # 500: the server failed; after 1 + len(retry_delays) tries the error is raised as it is.
                    proxy.fail_next("status", "/resources/", count=10, status=500)
                    with pytest.raises(LightningStoreHTTPError) as caught:
                        await client.get_resources_by_id(added.resources_id)
                    assert caught.value.status == 500
                    assert proxy.count("/resources/") == 3
            finally:
                await client.close()
    finally:
        await server.stop()


def test_the_block_refuses_a_negative_time() -> None:
    with pytest.raises(ValueError, match="at least 0"), ride_out_outages(-1.0):
        pass


async def test_without_retries_a_call_fails_at_once_even_inside_a_block_riding_out_outages(
    client: LightningStoreClient,
) -> None:
    starting = asyncio.create_task(_serve_later(client, 0.5))  # the store comes back: a retry would reach it
    try:
        with ride_out_outages(30.0), without_retries():
            assert outage_tolerance() == 0
            with pytest.raises(StoreUnreachableError):  # a read too: "no answer" is not taken for "none"
                await client.get_rollout_by_id("ro-1")
        assert outage_tolerance() is None
    finally:
        server = await starting
    try:
        with without_retries():  # a store that answers takes the call as usual
            assert (await client.add_resources(RESOURCES)).resources_id
    finally:
        await server.stop()


async def test_an_outage_is_logged_when_it_starts_and_when_it_ends_not_per_call(
    client: LightningStoreClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("DEBUG", logger="agentbolt.store.client"):
        for _ in range(3):
            assert await client.get_rollout_by_id("ro-any") is None
        warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
        # The first call's failure and its giving up; the calls after it log at DEBUG level only.
        assert len(warnings) == 2 and "not healthy" in warnings[1], warnings
        server = await _serve_later(client, 0.0)
        try:
            await client.query_resources()
        finally:
            await server.stop()
    back = [record.getMessage() for record in caplog.records if "answers again" in record.getMessage()]
    assert len(back) == 1, caplog.text
