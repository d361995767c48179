"""A runner works only for the store it was started with, even when another store holds its address."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from support.servers import free_port

import agentbolt as agl
from agentbolt.execution import ClientServerExecutionStrategy
from agentbolt.store.client_server import LightningStoreClient, LightningStoreHTTPError, LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore

FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0}


@contextlib.contextmanager
def other_run_store(port: int) -> Iterator[Tuple[LightningStoreServer, InMemoryLightningStore]]:
    """The store server of another run on ``port``, with one rollout waiting for a runner."""
    store = InMemoryLightningStore(thread_safe=True)
    server = LightningStoreServer(store, "127.0.0.1", port, launch_mode="thread")
    asyncio.run(server.start())
    asyncio.run(store.enqueue_rollout(input={"task": "belongs to the other run"}))
    try:
        yield server, store
    finally:
        asyncio.run(server.stop())


def marking_agent(marker: Path) -> Any:
    @agl.rollout
    def agent(task: Dict[str, Any], llm: agl.LLM) -> float:
        marker.write_text(repr(task))
        return 1.0

    return agent


def _untouched(store: InMemoryLightningStore) -> None:
    async def check() -> None:
        [rollout] = await store.query_rollouts()
        assert rollout.status == "queuing"
        assert list(await store.query_attempts(rollout.rollout_id)) == []
        assert list(await store.query_workers()) == []

    asyncio.run(check())


def _trainer(port: int) -> agl.Trainer:
    return agl.Trainer(
        initial_resources={"llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")},
        strategy={"type": "cs", "server_host": "127.0.0.1", "server_port": port, "n_runners": 1, "startup_timeout": 30},
        runner=FAST_RUNNER,
        algorithm=agl.Baseline(polling_interval=0.1, span_verbosity="none"),
    )


def test_a_trainer_on_a_taken_port_fails_and_its_runner_never_works_for_the_other_store(tmp_path: Path) -> None:
    port = free_port()
    marker = tmp_path / "ran"
    with other_run_store(port) as (_, store):
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port}"):
            _trainer(port).dev(marking_agent(marker), [{"task": "mine"}])
        _untouched(store)
    assert not marker.exists()


def test_if_the_port_is_taken_after_the_check_the_runner_still_refuses_the_other_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another store server may take the port between the check and this run's own server binding it; this run's
    # server is slow to start, so its runner finds the other one first.
    monkeypatch.setattr("agentbolt.execution.client_server.check_store_port_free", lambda *args, **kwargs: None)
    start = LightningStoreServer.start

    async def slow_start(self: LightningStoreServer) -> None:
        await asyncio.sleep(3.0)
        await start(self)

    monkeypatch.setattr(LightningStoreServer, "start", slow_start)
    port = free_port()
    marker = tmp_path / "ran"
    with other_run_store(port) as (_, store):
        with pytest.raises(RuntimeError, match="did not start up"):
            _trainer(port).dev(marking_agent(marker), [{"task": "mine"}])
        _untouched(store)
    assert not marker.exists()


async def test_a_client_expecting_another_server_id_is_refused_with_409() -> None:
    store = InMemoryLightningStore()
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="asyncio", server_id="run-a")
    await server.start()
    clients: List[LightningStoreClient] = []
    try:
        stranger = LightningStoreClient(server.endpoint, expected_server_id="run-b", retry_delays=())
        owner = LightningStoreClient(server.endpoint, expected_server_id="run-a", retry_delays=())
        anyone = LightningStoreClient(server.endpoint, retry_delays=())
        clients.extend([stranger, owner, anyone])
        assert await stranger.get_server_id() == "run-a"  # health checks stay open to every client
        with pytest.raises(LightningStoreHTTPError) as refused:
            await stranger.enqueue_rollout(input={"x": 1})
        assert refused.value.status == 409
        assert refused.value.error_type == "StoreIdentityMismatch"
        assert "run-a" in refused.value.message and "run-b" in refused.value.message
        assert list(await store.query_rollouts()) == []
        await owner.enqueue_rollout(input={"x": 2})
        await anyone.enqueue_rollout(input={"x": 3})
        assert len(await store.query_rollouts()) == 2
    finally:
        for client in clients:
            await client.close()
        await server.stop()


def test_each_run_gives_its_server_a_fresh_id_that_its_runners_use(tmp_path: Path) -> None:
    seen: List[str] = []

    async def algorithm(store: Any, event: Any) -> None:
        seen.append(store.server_id)
        rollout = await store.enqueue_rollout(input={"n": 1})
        await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=30)

    async def runner(store: Any, worker_id: int, event: Any) -> None:
        claimed = None
        while claimed is None:
            claimed = await store.dequeue_rollout(worker_id="w")
            await asyncio.sleep(0.05)
        (tmp_path / "runner").write_text(str(store.expected_server_id))
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

    for _ in range(2):
        strategy = ClientServerExecutionStrategy(role="both", server_host="127.0.0.1", server_port=free_port())
        strategy.execute(algorithm, runner, InMemoryLightningStore(thread_safe=True))
        assert (tmp_path / "runner").read_text() == seen[-1]
    assert len(set(seen)) == 2
