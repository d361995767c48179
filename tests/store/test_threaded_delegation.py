"""``LightningStoreThreaded`` (contract §4.4) delegates exactly the store's public methods, 1:1, under its lock."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.store.threading import LightningStoreThreaded


def _public_coroutine_methods(cls: type) -> List[str]:
    return sorted(
        name for name in dir(cls) if not name.startswith("_") and inspect.iscoroutinefunction(getattr(cls, name, None))
    )


STORE_METHODS = _public_coroutine_methods(LightningStore)


class RecordingStore(LightningStore):
    """Records every call (arguments, whether the facade's lock was held) and returns a marker per call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[str, Tuple[Any, ...], Dict[str, Any], bool]] = []
        self.facade: Optional[LightningStoreThreaded] = None

    def otlp_traces_endpoint(self) -> str:
        return "http://recording/v1/traces"


def _recording_method(name: str) -> Any:
    async def method(self: RecordingStore, *args: Any, **kwargs: Any) -> Any:
        locked = self.facade is not None and self.facade._lock.locked()
        self.calls.append((name, args, kwargs, locked))
        return f"result-of-{name}"

    return method


for _name in STORE_METHODS:
    setattr(RecordingStore, _name, _recording_method(_name))


def _facade() -> Tuple[LightningStoreThreaded, RecordingStore]:
    inner = RecordingStore()
    facade = LightningStoreThreaded(inner)
    inner.facade = facade
    return facade, inner


def test_every_public_store_method_is_overridden_and_nothing_else_is_public() -> None:
    """Besides the store API, only the watchdog hooks a server calls (as it does on a collection-based store)."""
    watchdog_hooks = {"watchdog_period", "run_watchdog"}
    own = {name for name in vars(LightningStoreThreaded) if not name.startswith("_")}
    assert sorted(own - {"capabilities", "otlp_traces_endpoint"} - watchdog_hooks) == STORE_METHODS
    public = {name for name in dir(LightningStoreThreaded) if not name.startswith("_")}
    assert public == {name for name in dir(LightningStore) if not name.startswith("_")} | watchdog_hooks


UNLOCKED_WAITS = ("wait_for_rollouts", "wait_for_queued_rollouts")


@pytest.mark.parametrize("name", [name for name in STORE_METHODS if name not in UNLOCKED_WAITS])
async def test_each_method_forwards_its_arguments_once_and_returns_the_result(name: str) -> None:
    facade, inner = _facade()
    args = (f"{name}-positional",)
    kwargs = {"marker": name}
    result = await getattr(facade, name)(*args, **kwargs)
    assert result == f"result-of-{name}"
    assert [(n, a, k) for n, a, k, _ in inner.calls] == [(name, args, kwargs)]
    assert inner.calls[0][3], "the facade's lock is held during the call"


@pytest.mark.parametrize("timeout", [None, 0, 0.5])
async def test_wait_for_rollouts_is_delegated_once_with_the_same_arguments_without_the_lock(
    timeout: Optional[float],
) -> None:
    facade, inner = _facade()
    assert await facade.wait_for_rollouts(rollout_ids=["ro-1"], timeout=timeout) == "result-of-wait_for_rollouts"
    assert inner.calls == [("wait_for_rollouts", (), {"rollout_ids": ["ro-1"], "timeout": timeout}, False)]


async def test_wait_for_queued_rollouts_is_delegated_once_without_the_lock() -> None:
    facade, inner = _facade()
    assert await facade.wait_for_queued_rollouts(0.5) == "result-of-wait_for_queued_rollouts"
    assert inner.calls == [("wait_for_queued_rollouts", (0.5,), {}, False)]


async def test_a_long_wait_does_not_hold_up_other_calls() -> None:
    facade = LightningStoreThreaded(InMemoryLightningStore())
    started = await facade.start_rollout("x")
    waiting = asyncio.create_task(facade.wait_for_rollouts(rollout_ids=[started.rollout_id], timeout=30))
    await asyncio.sleep(0.05)
    await facade.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded")
    (finished,) = await asyncio.wait_for(waiting, timeout=10)
    assert finished.status == "succeeded"


def test_capabilities_are_the_wrapped_ones_made_thread_and_async_safe() -> None:
    facade = LightningStoreThreaded(InMemoryLightningStore())
    caps = facade.capabilities
    assert caps["thread_safe"] and caps["async_safe"]
    assert caps["zero_copy"] is False and caps["otlp_traces"] is False
    assert LightningStoreThreaded(RecordingStore()).otlp_traces_endpoint() == "http://recording/v1/traces"


async def test_calls_from_many_threads_share_one_real_store() -> None:
    facade = LightningStoreThreaded(InMemoryLightningStore())
    started = await facade.start_rollout("x")
    rid, aid = started.rollout_id, started.attempt.attempt_id

    def worker(count: int) -> None:
        async def issue() -> None:
            for _ in range(count):
                await facade.get_next_span_sequence_id(rid, aid)

        asyncio.run(issue())

    threads = [threading.Thread(target=worker, args=(50,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert await facade.get_next_span_sequence_id(rid, aid) == 4 * 50 + 1


async def test_the_watchdog_runs_under_the_facade_lock_and_only_for_a_store_that_has_one(tmp_path: Path) -> None:
    facade, _ = _facade()
    assert facade.watchdog_period is None
    await facade.run_watchdog()  # nothing to run

    store = SqliteLightningStore(str(tmp_path / "w.db"), scan_debounce_seconds=0.5)
    try:
        threaded = LightningStoreThreaded(store)
        assert threaded.watchdog_period == store.watchdog_period == 0.5
        await threaded._lock.acquire()
        scan = asyncio.ensure_future(threaded.run_watchdog())
        await asyncio.sleep(0.05)
        assert not scan.done(), "the scan waits for the facade's lock"
        threaded._lock.release()
        await asyncio.wait_for(scan, timeout=30)
    finally:
        await store.close()
