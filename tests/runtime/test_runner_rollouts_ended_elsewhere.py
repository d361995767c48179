"""A runner whose rollout is ended in the store by someone else stops its agent and takes the next rollout.

An algorithm cancels the rollouts still unfinished after its wait (GRPO's late rollouts, with
``store.update_rollout(rollout_id, status="cancelled")``); the store's watchdog times attempts out, and a new attempt
supersedes an old one. The runner notices at its heartbeat interval, cancels the agent, leaves the status the store
holds as it is and goes on with the queue.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, AsyncIterator, Awaitable, Callable, List

import pytest
from support.servers import StoreServerProcess

import agentbolt as agl
from agentbolt.emitter import find_final_reward
from agentbolt.runner import LitAgentRunner
from agentbolt.store.base import LightningStore
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import OtelTracer

PROMPT: agl.NamedResources = {"prompt": agl.PromptTemplate(template="{word}", engine="f-string")}
HANG_GUARD = 60.0
"""Seconds after which a test waiting for the runner fails instead of hanging (not a timing expectation)."""


@pytest.fixture(params=["in-memory", "server"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LightningStore]:
    """The store the runner serves: in this process, or an ``agentbolt store`` server process reached over HTTP."""
    if request.param == "in-memory":
        yield InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
        return
    server: StoreServerProcess = request.getfixturevalue("store_server_process")
    client = LightningStoreClient(server.endpoint)
    try:
        yield client
    finally:
        await client.close()


def _runner(max_rollouts: int) -> LitAgentRunner[Any]:
    return LitAgentRunner(
        OtelTracer(), max_rollouts=max_rollouts, poll_interval=0.05, heartbeat_interval=0.05, interval_jitter=0.01
    )


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not await check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


async def _enqueue(store: LightningStore, word: str, **kwargs: Any) -> str:
    resources_id = (await store.add_resources(PROMPT)).resources_id
    rollout = await store.enqueue_rollout(input={"word": word}, mode="train", resources_id=resources_id, **kwargs)
    return rollout.rollout_id


def _stuck_agent(started: asyncio.Event) -> Any:
    """An agent that never returns on the task ``stuck`` (after setting ``started``) and scores 1 on the others."""

    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        if task["word"] == "stuck":
            started.set()
            await asyncio.Event().wait()
        return 1.0

    return agent


async def _status(store: LightningStore, rollout_id: str) -> str:
    rollout = await store.get_rollout_by_id(rollout_id)
    assert rollout is not None
    return rollout.status


async def test_a_runner_cancels_an_agent_whose_rollout_was_cancelled_and_runs_the_next_rollout(
    store: LightningStore,
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        if task["word"] == "stuck":
            started.set()
            try:
                await asyncio.Event().wait()  # a tool call that never returns
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return 1.0

    stuck = await _enqueue(store, "stuck")
    runner = _runner(max_rollouts=2)
    with runner.run_context(agent=agent, store=store):
        serving = asyncio.create_task(runner.iter())
        await asyncio.wait_for(started.wait(), HANG_GUARD)
        await store.update_rollout(stuck, status="cancelled")  # what GRPO does to a late rollout
        following = await _enqueue(store, "next")
        await asyncio.wait_for(serving, HANG_GUARD)

    assert cancelled.is_set()
    assert await _status(store, following) == "succeeded"
    assert await _status(store, stuck) == "cancelled"
    attempt = await store.get_latest_attempt(stuck)
    assert attempt is not None and attempt.status in ("preparing", "running")  # no outcome written for it


async def test_a_sync_agent_keeps_its_thread_but_its_late_result_is_not_recorded() -> None:
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        if task["word"] == "stuck":
            started.set()
            release.wait(HANG_GUARD)
            returned.set()
        return 1.0

    store = InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
    stuck = await _enqueue(store, "stuck")
    runner = _runner(max_rollouts=2)
    try:
        with runner.run_context(agent=agent, store=store):
            serving = asyncio.create_task(runner.iter())
            assert await asyncio.to_thread(started.wait, HANG_GUARD)
            await store.update_rollout(stuck, status="cancelled")
            following = await _enqueue(store, "next")
            await asyncio.wait_for(serving, HANG_GUARD)
            # The next rollout ran while the cancelled agent's thread was still blocked.
            assert not returned.is_set()
            assert await _status(store, following) == "succeeded"
    finally:
        release.set()
    threads: List[threading.Thread] = [t for t in threading.enumerate() if t.name == f"rollout-{stuck}"]
    for thread in threads:
        thread.join(HANG_GUARD)
    assert returned.is_set()
    assert await _status(store, stuck) == "cancelled"
    attempt = await store.get_latest_attempt(stuck)
    assert attempt is not None and attempt.status in ("preparing", "running")
    assert find_final_reward(list(await store.query_spans(stuck))) is None


async def test_an_async_agent_that_ignores_its_cancellation_is_left_behind_and_its_result_dropped() -> None:
    started, release, returned = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        if task["word"] == "stuck":
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await release.wait()  # carries on regardless
            returned.set()
        return 1.0

    store = InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
    stuck = await _enqueue(store, "stuck")
    runner = _runner(max_rollouts=2)
    with runner.run_context(agent=agent, store=store):
        serving = asyncio.create_task(runner.iter())
        await asyncio.wait_for(started.wait(), HANG_GUARD)
        await store.update_rollout(stuck, status="cancelled")
        following = await _enqueue(store, "next")
        await asyncio.wait_for(serving, HANG_GUARD)
        assert not returned.is_set()
        assert await _status(store, following) == "succeeded"
        release.set()
        await asyncio.wait_for(returned.wait(), HANG_GUARD)

    assert await _status(store, stuck) == "cancelled"
    attempt = await store.get_latest_attempt(stuck)
    assert attempt is not None and attempt.status in ("preparing", "running")
    assert find_final_reward(list(await store.query_spans(stuck))) is None


async def test_a_runner_gives_up_an_attempt_that_a_new_attempt_superseded() -> None:
    started = asyncio.Event()
    agent = _stuck_agent(started)

    store = InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
    stuck = await _enqueue(store, "stuck")
    runner = _runner(max_rollouts=1)
    with runner.run_context(agent=agent, store=store):
        serving = asyncio.create_task(runner.iter())
        await asyncio.wait_for(started.wait(), HANG_GUARD)
        first = await store.get_latest_attempt(stuck)
        newer = await store.start_attempt(stuck, worker_id="elsewhere")
        await asyncio.wait_for(serving, HANG_GUARD)

    assert first is not None
    attempts = {attempt.attempt_id: attempt.status for attempt in await store.query_attempts(stuck)}
    assert attempts[first.attempt_id] in ("preparing", "running")
    assert attempts[newer.attempt.attempt_id] == "preparing"  # the new attempt's outcome is still to come
    assert await _status(store, stuck) == "preparing"


async def test_a_runner_gives_up_an_attempt_the_watchdog_timed_out() -> None:
    started = asyncio.Event()
    agent = _stuck_agent(started)

    store = InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
    stuck = await _enqueue(store, "stuck", config=agl.RolloutConfig(timeout_seconds=0.2, max_attempts=1))
    runner = _runner(max_rollouts=2)
    with runner.run_context(agent=agent, store=store):
        serving = asyncio.create_task(runner.iter())
        await asyncio.wait_for(started.wait(), HANG_GUARD)
        following = await _enqueue(store, "next")
        await asyncio.wait_for(serving, HANG_GUARD)

    attempt = await store.get_latest_attempt(stuck)
    assert attempt is not None and attempt.status == "timeout"
    assert await _status(store, stuck) == "failed"
    assert await _status(store, following) == "succeeded"


async def test_a_runner_finishes_an_attempt_that_the_watchdog_only_found_unresponsive() -> None:
    """``unresponsive`` is not final: an attempt that sends spans again is recovered, so the runner goes on."""
    started, release = asyncio.Event(), asyncio.Event()

    @agl.rollout
    async def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        started.set()
        await release.wait()
        return 1.0

    store = InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
    config = agl.RolloutConfig(unresponsive_seconds=0.2, max_attempts=2, retry_condition=["unresponsive"])
    rollout_id = await _enqueue(store, "quiet", config=config)
    runner = _runner(max_rollouts=1)
    with runner.run_context(agent=agent, store=store):
        serving = asyncio.create_task(runner.iter())
        await asyncio.wait_for(started.wait(), HANG_GUARD)

        async def unresponsive() -> bool:
            attempt = await store.get_latest_attempt(rollout_id)
            return attempt is not None and attempt.status == "unresponsive"

        await _eventually(unresponsive, "the watchdog found the attempt unresponsive")
        release.set()
        await asyncio.wait_for(serving, HANG_GUARD)

    assert await _status(store, rollout_id) == "succeeded"
    assert [attempt.status for attempt in await store.query_attempts(rollout_id)] == ["succeeded"]
