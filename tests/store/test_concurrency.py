"""In-process concurrency: many asyncio tasks and several threads against one store."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any, Coroutine, Dict, List

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.store.collection_based import CollectionBasedLightningStore
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.threading import LightningStoreThreaded
from agentbolt.types import AttemptedRollout, EnqueueRolloutRequest, RolloutConfig

from .conftest import is_http, make_span, make_store

# Upper bound for waits that must be ended by a notification; only there to turn a hang into a failure.
HANG_GUARD_SECONDS = 60.0


def unwrap(store: LightningStore) -> CollectionBasedLightningStore[Any]:
    inner = store.store if isinstance(store, LightningStoreThreaded) else store
    assert isinstance(inner, CollectionBasedLightningStore)
    return inner


async def test_sequence_ids_are_unique_and_increasing(store: LightningStore) -> None:
    first = await store.start_rollout("a")
    second = await store.start_rollout("b")
    tasks = 10 if is_http(store) else 40
    calls = 5

    async def allocate(rollout: AttemptedRollout) -> List[int]:
        issued = []
        for _ in range(calls):
            issued.append(await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id))
        return issued

    results = await asyncio.gather(*(allocate(r) for r in (first, second) for _ in range(tasks)))
    for index, rollout_results in enumerate((results[:tasks], results[tasks:])):
        flat = [value for issued in rollout_results for value in issued]
        assert sorted(flat) == list(range(1, tasks * calls + 1)), f"rollout {index}"
        for issued in rollout_results:
            assert issued == sorted(issued) and len(set(issued)) == len(issued)


async def test_no_rollout_is_dequeued_twice(store: LightningStore) -> None:
    total = 20 if is_http(store) else 60
    created = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(total)])
    claimed: List[str] = []

    async def dequeuer(worker: int) -> None:
        while True:
            batch = await store.dequeue_many_rollouts(limit=1 + worker % 3, worker_id=f"w-{worker}")
            if not batch:
                return
            claimed.extend(r.rollout_id for r in batch)

    await asyncio.gather(*(dequeuer(i) for i in range(8)))
    assert sorted(claimed) == sorted(r.rollout_id for r in created)
    for rollout in created[:5]:
        assert len(await store.query_attempts(rollout.rollout_id)) == 1


async def test_concurrent_spans_on_one_attempt(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    count = 20 if is_http(store) else 50

    async def send(index: int) -> None:
        sequence_id = await store.get_next_span_sequence_id(rid, aid)
        assert await store.add_span(make_span(rid, aid, sequence_id, f"s-{index}")) is not None

    await asyncio.gather(*(send(i) for i in range(count)))
    spans = await store.query_spans(rid)
    assert len(spans) == count
    assert [s.sequence_id for s in spans] == list(range(1, count + 1))
    rollout = await store.get_rollout_by_id(rid)
    assert rollout is not None and rollout.status == "running"
    assert await store.get_next_span_sequence_id(rid, aid) == count + 1


@pytest.mark.parametrize("backend_name", ["memory_thread_safe", "threaded", "sqlite"])
async def test_threads_with_own_loops_never_double_claim(backend_name: str, tmp_path: Path) -> None:
    async with make_store(backend_name, tmp_path) as store:
        total = 80
        created = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(total)])
        claims: Dict[int, List[str]] = {}
        errors: List[BaseException] = []

        def thread_main(index: int) -> None:
            async def run() -> None:
                mine: List[str] = []
                while True:
                    claimed = await store.dequeue_rollout(worker_id=f"thread-{index}")
                    if claimed is None:
                        break
                    mine.append(claimed.rollout_id)
                    sequence_id = await store.get_next_span_sequence_id(claimed.rollout_id, claimed.attempt.attempt_id)
                    await store.add_span(
                        make_span(claimed.rollout_id, claimed.attempt.attempt_id, sequence_id, f"t{index}")
                    )
                    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
                claims[index] = mine

            try:
                asyncio.run(run())
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=thread_main, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join)
        assert errors == []
        all_claims = [rid for mine in claims.values() for rid in mine]
        assert sorted(all_claims) == sorted(r.rollout_id for r in created)
        done = await store.wait_for_rollouts(rollout_ids=[r.rollout_id for r in created], timeout=0)
        assert len(done) == total and all(r.status == "succeeded" for r in done)


async def test_concurrent_watchdog_verdicts_apply_once(
    inproc_backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_000_000.0]
    monkeypatch.setattr("agentbolt.store.collection_based.time.time", lambda: now[0])
    async with make_store(inproc_backend, tmp_path, scan_debounce_seconds=0) as store:
        config = RolloutConfig(timeout_seconds=5, max_attempts=2, retry_condition=["timeout"])
        created = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i, config=config) for i in range(10)])
        first_round = await store.dequeue_many_rollouts(limit=10)
        assert len(first_round) == 10
        now[0] += 6
        results = await asyncio.gather(*(store.dequeue_rollout() for _ in range(20)))
        retried = [r.rollout_id for r in results if r is not None]
        assert sorted(retried) == sorted(r.rollout_id for r in created)
        for rollout in created:
            attempts = await store.query_attempts(rollout.rollout_id)
            assert [a.status for a in attempts] == ["timeout", "preparing"]


async def test_wait_for_rollouts_is_cancellable(inproc_backend: str, tmp_path: Path) -> None:
    async with make_store(inproc_backend, tmp_path) as store:
        rollout = await store.enqueue_rollout("x")
        waiter = asyncio.create_task(store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=None))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert unwrap(store)._waiters == {}
        current = await store.get_rollout_by_id(rollout.rollout_id)
        assert current is not None and current.status == "queuing"


@pytest.mark.parametrize("backend_name", ["memory", "memory_thread_safe", "sqlite"])
async def test_wait_is_woken_by_completion_not_polling(backend_name: str, tmp_path: Path) -> None:
    async with make_store(backend_name, tmp_path) as store:
        inner = unwrap(store)
        inner._wait_poll_interval = 3600.0  # only a notification can end the wait
        first = await store.enqueue_rollout("a")
        second = await store.enqueue_rollout("b")
        waiter = asyncio.create_task(
            store.wait_for_rollouts(rollout_ids=[second.rollout_id, first.rollout_id], timeout=None)
        )
        await asyncio.sleep(0.02)
        await store.update_rollout(first.rollout_id, status="succeeded")
        await asyncio.sleep(0.02)
        assert not waiter.done()  # still waiting for the second one
        claimed = await store.dequeue_rollout()
        assert claimed is not None and claimed.rollout_id == second.rollout_id
        await store.update_attempt(second.rollout_id, "latest", status="failed")
        done = await asyncio.wait_for(waiter, HANG_GUARD_SECONDS)
        assert [(r.rollout_id, r.status) for r in done] == [
            (second.rollout_id, "failed"),
            (first.rollout_id, "succeeded"),
        ]


async def test_wait_is_woken_from_another_thread() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    store._wait_poll_interval = 3600.0
    rollout = await store.enqueue_rollout("x")
    waiter = asyncio.create_task(store.wait_for_rollout(rollout.rollout_id))
    await asyncio.sleep(0.02)

    def finish() -> None:
        asyncio.run(store.update_rollout(rollout.rollout_id, status="cancelled"))

    await asyncio.to_thread(finish)
    done = await asyncio.wait_for(waiter, HANG_GUARD_SECONDS)
    assert done is not None and done.status == "cancelled"
    assert await store.wait_for_rollout("ro-unknown") is None
    pending = await store.enqueue_rollout("y")
    assert await store.wait_for_rollout(pending.rollout_id, timeout=0) is None


async def test_threaded_facade_delegates_with_same_signatures() -> None:
    import inspect

    from agentbolt.store.base import LightningStore as Base

    inner = InMemoryLightningStore()
    facade = LightningStoreThreaded(inner)
    assert facade.store is inner
    assert facade.capabilities == {"thread_safe": True, "async_safe": True, "zero_copy": False, "otlp_traces": False}
    for name in ("update_rollout", "update_attempt", "query_spans", "dequeue_many_rollouts", "add_otel_span"):
        assert inspect.signature(getattr(LightningStoreThreaded, name)) == inspect.signature(getattr(Base, name))
    # Positional arguments reach the wrapped store unchanged.
    rollout = await facade.enqueue_rollout("x", "val")
    updated = await facade.update_rollout(rollout.rollout_id, "y", "train")
    assert (updated.input, updated.mode) == ("y", "train")
    stats = await facade.statistics()
    assert stats["name"] == "InMemoryLightningStore" and stats["total_rollouts"] == 1


async def test_unlocked_readers_survive_writers_in_other_threads() -> None:
    store = InMemoryLightningStore(thread_safe=True, scan_debounce_seconds=0)
    seeded = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(50)])
    ids = [r.rollout_id for r in seeded]
    errors: List[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        async def run() -> None:
            for round_index in range(100):
                claimed = await store.dequeue_rollout(worker_id="writer")
                if claimed is not None:
                    await store.start_attempt(claimed.rollout_id)
                    await store.update_rollout(claimed.rollout_id, status="requeuing")
                await store.enqueue_rollout(round_index)
                await store.update_worker(f"w-{round_index % 7}")

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)
        finally:
            stop.set()

    def reader() -> None:
        async def run() -> None:
            while not stop.is_set():
                await store.query_rollouts(rollout_id_in=ids[:25], sort_by="start_time")
                await store.query_rollouts(status_in=["preparing", "queuing"])
                await store.query_workers(worker_id_contains="w-")
                for rollout_id in ids[:5]:
                    await store.query_attempts(rollout_id)

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)
    assert errors == []
    stats = await store.statistics()
    assert stats["total_rollouts"] == 150


async def test_calls_cancelled_at_any_moment_leave_the_store_whole(inproc_backend: str, tmp_path: Path) -> None:
    # Callers give up on calls (a runner being stopped, a client gone): what a cancelled call did is stored whole or
    # not at all, and every later call works.
    rng = random.Random(11)

    async def cancel_some(calls: List[Coroutine[Any, Any, Any]]) -> List[Any]:
        tasks = [asyncio.create_task(call) for call in calls]
        await asyncio.sleep(rng.random() * 0.003)
        for task in rng.sample(tasks, len(tasks) // 3):
            task.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    async with make_store(inproc_backend, tmp_path) as store:
        enqueued: List[str] = []
        for round_ in range(15):
            results = await cancel_some([store.enqueue_rollout(round_ * 8 + i) for i in range(8)])
            enqueued += [r.rollout_id for r in results if not isinstance(r, BaseException)]
        stored = {r.rollout_id for r in await store.query_rollouts()}
        assert set(enqueued) <= stored

        claimed = await store.dequeue_many_rollouts(limit=len(stored) + 5)
        assert sorted(r.rollout_id for r in claimed) == sorted(stored)
        for start in range(0, len(claimed), 8):
            batch = claimed[start : start + 8]
            await cancel_some(
                [store.update_attempt(r.rollout_id, r.attempt.attempt_id, status="succeeded") for r in batch]
            )
        # A rollout and its attempt always agree: the rollout finished with its attempt, or neither moved.
        for rollout in await store.query_rollouts():
            (attempt,) = await store.query_attempts(rollout.rollout_id)
            assert (rollout.status, attempt.status) in {("succeeded", "succeeded"), ("preparing", "preparing")}
        late = await store.enqueue_rollout("late")
        assert (await store.dequeue_rollout()).rollout_id == late.rollout_id  # type: ignore[union-attr]
