"""A runner in the middle of a rollout when its store server goes away: the rollout waits, it is not abandoned.

The store is a real ``agentbolt store`` subprocess on SQLite; the outage starts the moment the runner has claimed a
rollout, so the runner meets it exactly while fetching the rollout's resources.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, List, Optional

import aiohttp
import pytest
from support.servers import OutageKind, StoreServerProcess

import agentbolt as agl
from agentbolt.execution import ThreadingEvent
from agentbolt.runner import LitAgentRunner
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.store.outage import StoreUnreachableError
from agentbolt.tracer import OtelTracer
from agentbolt.types import AttemptedRollout

PROMPT = {"prompt": agl.PromptTemplate(template="Say {word}", engine="f-string")}


@agl.rollout
def rewarded_agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
    with agl.operation(name="work"):
        pass
    return 0.5


class OutageOnClaim(LightningStoreClient):
    """The real client, which sets off ``on_claim`` once, right after it claimed a rollout (a test hook)."""

    def __init__(self, endpoint: str, on_claim: Callable[[], None]) -> None:
        super().__init__(endpoint)
        self._on_claim: Optional[Callable[[], None]] = on_claim

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        claimed = await super().dequeue_rollout(worker_id=worker_id)
        if claimed is not None and self._on_claim is not None:
            on_claim, self._on_claim = self._on_claim, None
            on_claim()
        return claimed


@pytest.fixture
def server(store_server_process: StoreServerProcess) -> StoreServerProcess:
    return store_server_process


async def _enqueue(endpoint: str) -> str:
    client = LightningStoreClient(endpoint)
    try:
        resources_id = (await client.add_resources(PROMPT)).resources_id
        return (await client.enqueue_rollout(input={"word": "hi"}, resources_id=resources_id)).rollout_id
    finally:
        await client.close()


@pytest.mark.parametrize("kind", ["kill", "pause"])
async def test_runner_rides_out_an_outage_that_starts_when_it_fetches_resources(
    server: StoreServerProcess, kind: OutageKind
) -> None:
    rollout_id = await _enqueue(server.endpoint)
    ended: List[threading.Thread] = []
    store = OutageOnClaim(server.endpoint, lambda: ended.append(server.outage(kind, 3.0)))
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), max_rollouts=1, poll_interval=0.1, heartbeat_interval=0)
    try:
        with runner.run_context(agent=rewarded_agent, store=store):
            await runner.iter()
        await asyncio.to_thread(ended[0].join, 30)
        assert not server.errors

        rollout = await store.get_rollout_by_id(rollout_id)
        assert rollout is not None and rollout.status == "succeeded"
        attempts = list(await store.query_attempts(rollout_id))
        assert [a.status for a in attempts] == ["succeeded"]
        names = [span.name for span in await store.query_spans(rollout_id)]
        assert sorted(names) == ["agentlightning.annotation", "agentlightning.operation"], names
    finally:
        await store.close()


async def test_attempt_fails_when_the_store_comes_back_after_the_runner_gave_up(
    server: StoreServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    rollout_id = await _enqueue(server.endpoint)
    ended: List[threading.Thread] = []
    # The store stays away well past the runner's 1 s limit, so the runner gives up while it is still down.
    store = OutageOnClaim(server.endpoint, lambda: ended.append(server.outage("kill", 6.0)))
    runner: LitAgentRunner[Any] = LitAgentRunner(
        OtelTracer(), poll_interval=0.1, heartbeat_interval=0, store_outage_timeout=1.0
    )
    event = ThreadingEvent()
    try:
        with runner.run_context(agent=rewarded_agent, store=store):
            serving = asyncio.create_task(runner.iter(event=event))
            try:
                deadline = time.monotonic() + 60
                attempt = None
                while attempt is None or attempt.status != "failed":
                    assert time.monotonic() < deadline, f"the attempt was never recorded as failed: {attempt}"
                    assert not serving.done(), serving
                    await asyncio.sleep(0.2)
                    if ended and not ended[0].is_alive():
                        attempt = await store.get_latest_attempt(rollout_id)
            finally:
                event.set()
                await serving
        assert not server.errors

        attempts = list(await store.query_attempts(rollout_id))
        assert [a.status for a in attempts] == ["failed"]
        spans = list(await store.query_spans(rollout_id))
        exceptions = [s for s in spans if s.name == "agentlightning.exception"]
        assert len(exceptions) == 1
        assert exceptions[0].attributes["exception.type"] == "StoreUnreachableError"
        assert "stayed unreachable" in str(exceptions[0].attributes["exception.message"])
        assert any("Could not fetch its resources" in r.getMessage() for r in caplog.records)
    finally:
        await store.close()


class ClaimAnswerLost(LightningStoreClient):
    """The real client whose first dequeue never gets its answer (a test hook standing in for a dropped response).

    With ``claim=True`` the dequeue reaches the server, which claims a rollout for the worker and commits it; then
    the server is killed (and restarted on the same file after 2 s) and the call raises the error the client raises
    when the server dies mid-request. With ``claim=False`` the call fails before reaching the server.
    """

    def __init__(self, server: StoreServerProcess, *, claim: bool) -> None:
        super().__init__(server.endpoint)
        self._server = server
        self._claim = claim
        self.outages: List[threading.Thread] = []
        self.lost: List[AttemptedRollout] = []

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        if self.outages:
            return await super().dequeue_rollout(worker_id=worker_id)
        if self._claim:
            claimed = await super().dequeue_rollout(worker_id=worker_id)
            assert claimed is not None
            self.lost.append(claimed)
        self.outages.append(self._server.outage("kill", 2.0))
        raise aiohttp.ServerDisconnectedError()


@pytest.mark.parametrize("claim", [True, False], ids=["claimed", "not-claimed"])
async def test_a_claim_whose_answer_was_lost_is_taken_up_once_the_store_is_back(
    server: StoreServerProcess, claim: bool, caplog: pytest.LogCaptureFixture
) -> None:
    rollout_id = await _enqueue(server.endpoint)
    store = ClaimAnswerLost(server, claim=claim)
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), max_rollouts=1, poll_interval=0.1, heartbeat_interval=0)
    try:
        with runner.run_context(agent=rewarded_agent, store=store):
            worker_id = runner.get_worker_id()
            await asyncio.wait_for(runner.iter(), 60)
        await asyncio.to_thread(store.outages[0].join, 30)
        assert not server.errors

        rollout = await store.get_rollout_by_id(rollout_id)
        assert rollout is not None and rollout.status == "succeeded"
        # One attempt: the runner ran the claim it never received, instead of leaving it to the watchdog.
        attempts = list(await store.query_attempts(rollout_id))
        assert [a.status for a in attempts] == ["succeeded"]
        if claim:
            assert attempts[0].attempt_id == store.lost[0].attempt.attempt_id
        taken_up = [r for r in caplog.records if "its answer was lost" in r.getMessage()]
        assert len(taken_up) == (1 if claim else 0)
        worker = await store.get_worker_by_id(worker_id)
        assert worker is not None and worker.current_attempt_id is None, worker
    finally:
        await store.close()


class BrokenWorkerRecords(agl.InMemoryLightningStore):
    """An in-process store whose first dequeue fails and whose worker records cannot be read (a test hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.dequeues = 0

    async def dequeue_rollout(self, worker_id: Optional[str] = None) -> Optional[AttemptedRollout]:
        self.dequeues += 1
        if self.dequeues == 1:
            raise RuntimeError("the first dequeue fails")
        return await super().dequeue_rollout(worker_id=worker_id)

    async def get_worker_by_id(self, worker_id: str) -> Any:
        raise ValueError("worker records are broken")


async def test_a_check_the_store_answers_with_an_error_does_not_stop_the_runner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = BrokenWorkerRecords()
    resources_id = (await store.add_resources(PROMPT)).resources_id
    rollout_id = (await store.enqueue_rollout(input={"word": "hi"}, resources_id=resources_id)).rollout_id
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), max_rollouts=1, poll_interval=0.05, heartbeat_interval=0)
    with runner.run_context(agent=rewarded_agent, store=store):
        await asyncio.wait_for(runner.iter(), 30)
    rollout = await store.get_rollout_by_id(rollout_id)
    assert rollout is not None and rollout.status == "succeeded"
    assert store.dequeues == 2  # the check failed once and was given up; the next poll dequeued
    assert any("worker records are broken" in r.getMessage() for r in caplog.records)


def test_store_outage_timeout_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="store_outage_timeout"):
        LitAgentRunner(OtelTracer(), store_outage_timeout=-1.0)


class OutcomesUnreachableAtFirst(agl.InMemoryLightningStore):
    """An in-memory store whose first ``outages`` attempt outcomes fail as an unreachable store's would (a fake of
    a store server away for a while: the runners keep those writes and make them afterwards)."""

    def __init__(self, outages: int) -> None:
        super().__init__(thread_safe=True)
        self.outages = outages
        self._lock = threading.Lock()

    async def update_attempt(self, rollout_id: str, attempt_id: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("status") in ("succeeded", "failed"):
            with self._lock:
                away, self.outages = self.outages > 0, self.outages - 1
            if away:
                raise StoreUnreachableError("the store is away")
            await asyncio.sleep(0.1)  # answers slowly once back, so the runners' kept writes overlap
        return await super().update_attempt(rollout_id, attempt_id, *args, **kwargs)


class SleepyAgent(agl.LitAgent[Any]):
    async def rollout_async(self, task: Any, resources: Any, rollout: Any) -> float:
        await asyncio.sleep(0.05)
        return 1.0


def test_runner_threads_each_keep_and_make_their_own_writes() -> None:
    # The runners of the shared-memory strategy are copies of one runner: they once shared the writes they keep
    # during an outage, so both made the same writes and one then failed with IndexError.
    store = OutcomesUnreachableAtFirst(outages=4)
    trainer = agl.Trainer(
        strategy={"type": "shm", "main_thread": "algorithm", "n_runners": 2},
        store=store,
        tracer=OtelTracer(),
        runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 0},
        algorithm=agl.Baseline(polling_interval=0.05, span_verbosity="none"),
        initial_resources={},
    )
    trainer.dev(SleepyAgent(), list(range(6)), progress=False)

    async def outcomes() -> List[Any]:
        return [[a.status for a in await store.query_attempts(r.rollout_id)] for r in await store.query_rollouts()]

    assert asyncio.run(outcomes()) == [["succeeded"]] * 6
