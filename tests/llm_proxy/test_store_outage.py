"""The gateway's spans ride out a store outage under load: a paused store, a store killed and restarted.

A real ``agentbolt store`` server (SQLite file) runs as a subprocess; it is paused with SIGSTOP/SIGCONT or killed
with SIGKILL and started again on the same file while concurrent clients keep calling the gateway. Afterwards every
call that succeeded for its client has exactly one span in the store, in the order the client made its calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
from pathlib import Path
from typing import AsyncIterator, Dict, List

import httpx
import pytest
from support.servers import StoreServerProcess

from agentbolt.gateway.app import Gateway, GatewaySettings, create_app
from agentbolt.llm_proxy import LLMProxy
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

from .conftest import model_list_for
from .fake_backend import FakeBackend

ROLLOUTS = 6


def _send(store: StoreServerProcess, signum: int) -> None:
    assert store.process is not None
    store.process.send_signal(signum)


@pytest.fixture
async def store_process(tmp_path: Path) -> AsyncIterator[StoreServerProcess]:
    server = StoreServerProcess(tmp_path / "store.db")
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


class Load:
    """One sequential client per rollout calling the gateway until stopped; records what each client got."""

    def __init__(self, endpoint: str, rollouts: List[tuple[str, str]]) -> None:
        self.endpoint = endpoint
        self.rollouts = rollouts
        self.answered: Dict[str, List[str]] = {rollout_id: [] for rollout_id, _ in rollouts}
        self.failed = 0
        self._stop = asyncio.Event()
        self._tasks: List[asyncio.Task[None]] = []

    async def _client(self, rollout_id: str, attempt_id: str, index: int) -> None:
        url = f"{self.endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=60) as client:
            i = 0
            while not self._stop.is_set():
                body = {"model": "echo", "messages": [{"role": "user", "content": f"call {i}"}]}
                if index % 2:
                    body["stream"] = True
                response = await client.post(url, json=body)
                if response.status_code == 200 and index % 2:
                    # Every event of the stream carries the completion id; the last one is [DONE].
                    first = next(line for line in response.text.splitlines() if line.startswith("data: {"))
                    self.answered[rollout_id].append(json.loads(first[len("data: ") :])["id"])
                elif response.status_code == 200:
                    self.answered[rollout_id].append(response.json()["id"])
                else:
                    self.failed += 1
                i += 1

    def start(self) -> None:
        self._tasks = [
            asyncio.get_running_loop().create_task(self._client(rollout_id, attempt_id, index))
            for index, (rollout_id, attempt_id) in enumerate(self.rollouts)
        ]

    async def wait_until_each_answered(self, timeout: float) -> None:
        """Return once every client has had at least one call answered."""
        async with asyncio.timeout(timeout):
            while not all(self.answered.values()):
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    @property
    def calls(self) -> int:
        return sum(len(ids) for ids in self.answered.values())


async def _rollouts(endpoint: str, count: int) -> List[tuple[str, str]]:
    client = LightningStoreClient(endpoint)
    try:
        started = [await client.start_rollout(input={"client": i}) for i in range(count)]
    finally:
        await client.close()
    return [(r.rollout_id, r.attempt.attempt_id) for r in started]


async def _assert_each_answered_call_has_one_span_in_order(endpoint: str, load: Load) -> None:
    client = LightningStoreClient(endpoint)
    try:
        for rollout_id, answered in load.answered.items():
            spans = sorted(await client.query_spans(rollout_id), key=lambda span: span.sequence_id)
            recorded = [span.attributes["gen_ai.response.id"] for span in spans]
            # Exactly the answered calls, each once, in the order the client made them.
            assert recorded == answered, rollout_id
            assert len({span.sequence_id for span in spans}) == len(spans)
    finally:
        await client.close()


async def _answered_during_outage(load: Load, before: int, seconds: float) -> int:
    """Keep the store out for ``seconds``, longer (up to 30 s more) until some call was answered meanwhile; how many
    were. On a loaded machine the first answers (each held ``sequence_wait`` for its id) can come late."""
    await asyncio.sleep(seconds)
    deadline = asyncio.get_running_loop().time() + 30.0
    while load.calls == before and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    return load.calls - before


async def _outage_under_load(backend: FakeBackend, store: StoreServerProcess, action: str) -> None:
    rollouts = await _rollouts(store.endpoint, ROLLOUTS)
    gateway_store = LightningStoreClient(store.endpoint)
    proxy = LLMProxy(model_list=model_list_for(backend), store=gateway_store, launch_mode="asyncio")  # type: ignore[arg-type]
    await proxy.start()
    load = Load(proxy.endpoint, rollouts)
    try:
        load.start()
        # Every client's first call looks its rollout up in the store; wait until each is past it (a fixed delay was
        # too short on a loaded machine, and clients still waiting on the store when it pauses answer nothing).
        await load.wait_until_each_answered(timeout=60.0)
        await asyncio.sleep(0.5)
        before = load.calls
        if action == "pause":
            _send(store, signal.SIGSTOP)
            during = await _answered_during_outage(load, before, seconds=5.0)
            _send(store, signal.SIGCONT)
        else:
            store.stop(signal.SIGKILL)
            during = await _answered_during_outage(load, before, seconds=4.0)
            await asyncio.to_thread(store.start)
        await asyncio.sleep(1.5)
        await load.stop()
        assert await proxy.flush(120.0)
        async with httpx.AsyncClient() as client:
            health = (await client.get(f"{proxy.endpoint}/health")).json()["spans"]
    finally:
        await load.stop()
        await proxy.stop()
        await gateway_store.close()
    assert load.failed == 0
    assert during > 0  # calls were answered while the store was out
    assert health["written"] == load.calls
    assert health["dropped"] == health["failed"] == health["queued"] == 0
    await _assert_each_answered_call_has_one_span_in_order(store.endpoint, load)


async def test_store_paused_under_load_loses_no_span(backend: FakeBackend, store_process: StoreServerProcess) -> None:
    await _outage_under_load(backend, store_process, "pause")


async def test_store_killed_and_restarted_under_load_loses_no_span(
    backend: FakeBackend, store_process: StoreServerProcess
) -> None:
    await _outage_under_load(backend, store_process, "kill")


async def test_full_buffer_drops_are_counted_and_reported(
    backend: FakeBackend, store_process: StoreServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    [(rollout_id, attempt_id)] = await _rollouts(store_process.endpoint, 1)
    store = LightningStoreClient(store_process.endpoint)
    gateway = Gateway(model_list_for(backend)[:1], store, GatewaySettings(max_queued_spans=3, sequence_wait=0.1))
    launcher = PythonServerLauncher(
        create_app(gateway), PythonServerLauncherArgs(launch_mode="asyncio"), serve_context=gateway.serving
    )
    await launcher.start()
    url = f"{launcher.access_endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            _send(store_process, signal.SIGSTOP)
            try:
                with caplog.at_level(logging.WARNING, logger="agentbolt.gateway.writer"):
                    ids = []
                    for i in range(10):
                        response = await client.post(
                            url, json={"model": "echo", "messages": [{"role": "user", "content": str(i)}]}
                        )
                        assert response.status_code == 200  # the client is served while the span is dropped
                        ids.append(response.json()["id"])
                    paused = (await client.get(f"{launcher.access_endpoint}/health")).json()["spans"]
            finally:
                _send(store_process, signal.SIGCONT)
            assert await gateway.flush(60.0)
            after = (await client.get(f"{launcher.access_endpoint}/health")).json()["spans"]
    finally:
        await launcher.stop()
        await store.close()
    assert paused == {"queued": 3, "written": 0, "dropped": 7, "failed": 0, "repaired": 0, "lost": 0}
    assert after == {"queued": 0, "written": 3, "dropped": 7, "failed": 0, "repaired": 0, "lost": 0}
    assert caplog.text.count("Span buffer full") == 1  # the first drop is logged, the next ones counted
    reader = LightningStoreClient(store_process.endpoint)
    try:
        spans = sorted(await reader.query_spans(rollout_id), key=lambda span: span.sequence_id)
    finally:
        await reader.close()
    assert [span.attributes["gen_ai.response.id"] for span in spans] == ids[:3]
    assert [span.sequence_id for span in spans] == [1, 2, 3]  # dropped calls took no sequence id


async def test_flush_waits_for_the_store_and_times_out_cleanly(
    backend: FakeBackend, store_process: StoreServerProcess
) -> None:
    [(rollout_id, attempt_id)] = await _rollouts(store_process.endpoint, 1)
    store = LightningStoreClient(store_process.endpoint)
    proxy = LLMProxy(model_list=model_list_for(backend), store=store, launch_mode="asyncio", api_key="k")  # type: ignore[arg-type]
    assert await proxy.flush(1.0)  # not running: nothing to wait for
    for wrong in (-1.0, math.nan):
        with pytest.raises(ValueError, match="timeout"):
            await proxy.flush(wrong)
    await proxy.start()
    try:
        url = f"{proxy.endpoint}/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
        headers = {"authorization": "Bearer k"}
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            _send(store_process, signal.SIGSTOP)
            try:
                response = await client.post(
                    url, json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
                )
                assert response.status_code == 200
                assert not await proxy.flush(0.5)  # the store cannot take the span: flush gives up after 0.5 s
            finally:
                _send(store_process, signal.SIGCONT)
            assert await asyncio.wait_for(proxy.flush(math.inf), 60.0)  # no limit: until the store took the span
            # No polling: once flush returned, the span is in the store.
            spans = await store.query_spans(rollout_id)
            assert [span.attributes["gen_ai.response.id"] for span in spans] == [response.json()["id"]]
            assert (await client.post(f"{proxy.endpoint}/flush", json={"timeout": "soon"})).status_code == 400
            assert (
                await client.post(f"{proxy.endpoint}/flush", headers={"authorization": "Bearer x"})
            ).status_code == 401
    finally:
        await proxy.stop()
        await store.close()
