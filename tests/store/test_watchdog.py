"""Watchdog (timeouts, unresponsive attempts), debounce, pure lifecycle rules, restart, and store metrics.

The clock is controlled by patching ``time.time`` as seen by ``agentbolt.store.collection_based``; these tests use
in-process backends only.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.store.collection_based import (
    CollectionBasedLightningStore,
    current_store_method_labels,
    get_current_store_methods,
)
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.threading import LightningStoreThreaded
from agentbolt.store.utils import LATENCY_BUCKETS, rollout_status_from_attempt, scan_unhealthy_rollouts
from agentbolt.types import Attempt, AttemptedRollout, RolloutConfig
from agentbolt.utils.metrics import MetricsBackend

from .conftest import make_span, make_store

T0 = 1_000_000.0


class Clock:
    """A manually advanced replacement for ``time.time``."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(T0)
    monkeypatch.setattr("agentbolt.store.collection_based.time.time", fake)
    return fake


def unwrap(store: LightningStore) -> CollectionBasedLightningStore[Any]:
    inner = store.store if isinstance(store, LightningStoreThreaded) else store
    assert isinstance(inner, CollectionBasedLightningStore)
    return inner


@pytest.fixture
async def watched(inproc_backend: str, tmp_path: Path, clock: Clock):
    """An in-process store scanning before every health-checked call."""
    async with make_store(inproc_backend, tmp_path, scan_debounce_seconds=0) as created:
        yield created


# ---------------------------------------------------------------------------------------------------------------------
# Pure rules


def _attempt(status: Any, sequence_id: int = 1, start: float = T0, heartbeat: Optional[float] = None) -> Attempt:
    return Attempt(
        rollout_id="ro-1",
        attempt_id=f"at-{sequence_id}",
        sequence_id=sequence_id,
        start_time=start,
        status=status,
        last_heartbeat_time=heartbeat,
    )


@pytest.mark.parametrize(
    ("status", "sequence_id", "expected"),
    [
        ("preparing", 1, "preparing"),
        ("running", 1, "running"),
        ("succeeded", 1, "succeeded"),
        ("failed", 1, "requeuing"),
        ("timeout", 2, "requeuing"),
        ("unresponsive", 3, "failed"),  # no attempts left
    ],
)
async def test_rollout_status_from_attempt(status: str, sequence_id: int, expected: str) -> None:
    config = RolloutConfig(max_attempts=3, retry_condition=["failed", "timeout", "unresponsive"])
    assert await rollout_status_from_attempt(_attempt(status, sequence_id), config) == expected


async def test_rollout_status_from_attempt_without_retry_condition_and_bad_status() -> None:
    config = RolloutConfig(max_attempts=3, retry_condition=["timeout"])
    assert await rollout_status_from_attempt(_attempt("failed"), config) == "failed"
    bogus = _attempt("running").model_copy(update={"status": "exploded"})
    with pytest.raises(ValueError, match="exploded"):
        await rollout_status_from_attempt(bogus, config)


def _attempted(config: RolloutConfig, attempt: Attempt) -> AttemptedRollout:
    return AttemptedRollout(
        rollout_id="ro-1", input=None, start_time=T0, status="running", config=config, attempt=attempt
    )


async def test_scan_unhealthy_rollouts(clock: Clock) -> None:
    both = RolloutConfig(timeout_seconds=10, unresponsive_seconds=3)
    clock.now = T0 + 5
    assert await scan_unhealthy_rollouts([_attempted(both, _attempt("running", heartbeat=T0 + 4))]) == {}
    assert await scan_unhealthy_rollouts([_attempted(both, _attempt("running"))]) == {("ro-1", "at-1"): "unresponsive"}
    assert await scan_unhealthy_rollouts([_attempted(both, _attempt("running", heartbeat=T0 + 1))]) == {
        ("ro-1", "at-1"): "unresponsive"
    }
    clock.now = T0 + 11  # timeout wins over unresponsive
    assert await scan_unhealthy_rollouts([_attempted(both, _attempt("running", heartbeat=T0 + 10.5))]) == {
        ("ro-1", "at-1"): "timeout"
    }
    assert await scan_unhealthy_rollouts([_attempted(RolloutConfig(), _attempt("running"))]) == {}


def test_latency_buckets() -> None:
    assert len(LATENCY_BUCKETS) == 44
    assert LATENCY_BUCKETS[0] == 1e-6 and LATENCY_BUCKETS[-1] == 300.0
    assert sorted(set(LATENCY_BUCKETS)) == LATENCY_BUCKETS


# ---------------------------------------------------------------------------------------------------------------------
# Watchdog through the store


async def test_timeout_fails_rollout_and_marks_worker_unknown(watched: LightningStore, clock: Clock) -> None:
    rollout = await watched.enqueue_rollout("x", config=RolloutConfig(timeout_seconds=10))
    claimed = await watched.dequeue_rollout(worker_id="w-1")
    assert claimed is not None
    clock.advance(9)
    current = await watched.get_rollout_by_id(rollout.rollout_id)
    assert current is not None and current.status == "preparing"
    clock.advance(2)
    current = await watched.get_rollout_by_id(rollout.rollout_id)
    assert isinstance(current, AttemptedRollout)
    assert current.status == "failed" and current.end_time == clock.now
    assert current.attempt.status == "timeout" and current.attempt.end_time is None
    worker = await watched.get_worker_by_id("w-1")
    assert worker is not None and worker.status == "unknown" and worker.current_rollout_id is None


async def test_timeout_with_retry_requeues_then_gives_up(watched: LightningStore, clock: Clock) -> None:
    config = RolloutConfig(timeout_seconds=10, max_attempts=2, retry_condition=["timeout"])
    rollout = await watched.enqueue_rollout("x", config=config)
    first = await watched.dequeue_rollout()
    assert first is not None
    clock.advance(11)
    second = await watched.dequeue_rollout()  # the scan runs first and re-enqueues the rollout
    assert second is not None and second.rollout_id == rollout.rollout_id
    assert second.attempt.sequence_id == 2 and second.attempt.start_time == clock.now
    clock.advance(11)
    final = await watched.get_rollout_by_id(rollout.rollout_id)
    assert final is not None and final.status == "failed"
    assert [a.status for a in await watched.query_attempts(rollout.rollout_id)] == ["timeout", "timeout"]
    assert await watched.dequeue_rollout() is None


async def test_unresponsive_uses_heartbeats(watched: LightningStore, clock: Clock) -> None:
    config = RolloutConfig(unresponsive_seconds=5, max_attempts=2, retry_condition=["unresponsive"])
    rollout = await watched.enqueue_rollout("x", config=config)
    claimed = await watched.dequeue_rollout()
    assert claimed is not None
    rid, aid = rollout.rollout_id, claimed.attempt.attempt_id
    clock.advance(4)
    await watched.add_span(make_span(rid, aid, 1, "s1"))  # heartbeat at T0+4
    clock.advance(4)
    attempt = await watched.get_latest_attempt(rid)
    assert attempt is not None and attempt.status == "running"
    clock.advance(2)  # 6 s since the heartbeat
    attempt = await watched.get_latest_attempt(rid)
    assert attempt is not None and attempt.status == "unresponsive"
    current = await watched.get_rollout_by_id(rid)
    assert current is not None and current.status == "requeuing"
    # A late span revives the attempt and the rollout; the queued retry is dropped.
    await watched.add_span(make_span(rid, aid, 2, "s2"))
    current = await watched.get_rollout_by_id(rid)
    assert isinstance(current, AttemptedRollout)
    assert current.status == "running" and current.attempt.status == "running"
    assert await watched.dequeue_rollout() is None


async def test_unresponsive_without_any_heartbeat(watched: LightningStore, clock: Clock) -> None:
    started = await watched.start_rollout("x", config=RolloutConfig(unresponsive_seconds=5))
    clock.advance(6)
    attempts = await watched.query_attempts(started.rollout_id)
    assert [a.status for a in attempts] == ["unresponsive"]
    current = await watched.get_rollout_by_id(started.rollout_id)
    assert current is not None and current.status == "failed"


async def test_finished_and_unconfigured_rollouts_are_left_alone(watched: LightningStore, clock: Clock) -> None:
    done = await watched.start_rollout("x", config=RolloutConfig(timeout_seconds=1))
    await watched.update_attempt(done.rollout_id, "latest", status="succeeded")
    free = await watched.start_rollout("y")
    clock.advance(3600)
    assert [r.status for r in await watched.query_rollouts()] == ["succeeded", "preparing"]
    latest = await watched.get_latest_attempt(free.rollout_id)
    assert latest is not None and latest.status == "preparing"


async def test_scan_runs_before_listed_methods_only(watched: LightningStore, clock: Clock) -> None:
    started = await watched.start_rollout("x", config=RolloutConfig(timeout_seconds=1))
    rid, aid = started.rollout_id, started.attempt.attempt_id
    clock.advance(2)
    # Methods outside the health-checked list do not run the watchdog.
    await watched.get_next_span_sequence_id(rid, aid)
    await watched.get_worker_by_id("w")
    await watched.statistics()
    inner = unwrap(watched)
    async with inner.collections.atomic(mode="r") as collections:
        stored = await collections.attempts.get(filter={"_must": {"rollout_id": {"exact": rid}}})
    assert stored is not None and stored.status == "preparing"
    await watched.query_workers()
    latest = await watched.get_latest_attempt(rid)
    assert latest is not None and latest.status == "timeout"


async def test_debounce_limits_scans(inproc_backend: str, tmp_path: Path, clock: Clock) -> None:
    async with make_store(inproc_backend, tmp_path, scan_debounce_seconds=10) as store:
        started = await store.start_rollout("x", config=RolloutConfig(timeout_seconds=3))  # first scan at T0
        clock.advance(5)  # timed out, but only 5 s since the last scan
        latest = await store.get_latest_attempt(started.rollout_id)
        assert latest is not None and latest.status == "preparing"
        clock.advance(5)  # 10 s since the last scan entry
        latest = await store.get_latest_attempt(started.rollout_id)
        assert latest is not None and latest.status == "timeout"


async def test_should_scan_debounce_and_race(clock: Clock) -> None:
    store = InMemoryLightningStore(scan_debounce_seconds=10)
    assert store._scan_debounce_seconds == 10
    assert await store._should_scan_for_unhealthy_rollouts() is True  # first one always allowed
    assert await store._should_scan_for_unhealthy_rollouts() is False
    clock.advance(9.9)
    assert await store._should_scan_for_unhealthy_rollouts() is False
    clock.advance(0.1)
    results = await asyncio.gather(*(store._should_scan_for_unhealthy_rollouts() for _ in range(20)))
    assert results.count(True) == 1
    eager = InMemoryLightningStore(scan_debounce_seconds=0)
    assert all([await eager._should_scan_for_unhealthy_rollouts() for _ in range(3)])


async def test_watchdog_resumes_after_restart(tmp_path: Path, clock: Clock) -> None:
    async with make_store("sqlite", tmp_path, scan_debounce_seconds=10) as store:
        rollout = await store.enqueue_rollout(
            "x", config=RolloutConfig(timeout_seconds=30, max_attempts=2, retry_condition=["timeout"])
        )
        claimed = await store.dequeue_rollout(worker_id="w-1")
        assert claimed is not None
    clock.advance(31)
    async with make_store("sqlite", tmp_path, scan_debounce_seconds=10) as reopened:
        retry = await reopened.dequeue_rollout(worker_id="w-2")
        assert retry is not None and retry.rollout_id == rollout.rollout_id
        assert retry.attempt.sequence_id == 2
        worker = await reopened.get_worker_by_id("w-1")
        assert worker is not None and worker.status == "unknown"


# ---------------------------------------------------------------------------------------------------------------------
# Method labels and metrics


class RecordingMetrics(MetricsBackend):
    """A metrics backend keeping every recording (labels validated by the base class registry)."""

    def __init__(self) -> None:
        super().__init__()
        self.counters: List[Tuple[str, Dict[str, str]]] = []
        self.histograms: List[Tuple[str, float, Dict[str, str]]] = []

    def _check(self, kind: str, name: str, labels: Optional[Dict[str, str]]) -> Dict[str, str]:
        spec = self._spec(kind, name)
        given = dict(labels or {})
        missing = [label for label in spec.label_names if label not in given]
        if missing:
            raise ValueError(f"missing labels {missing} for {name}")
        return given

    async def inc_counter(self, name: str, amount: float = 1.0, labels: Optional[Dict[str, str]] = None) -> None:
        self.counters.append((name, self._check("counter", name, labels)))

    async def observe_histogram(self, name: str, value: float, labels: Optional[Dict[str, str]] = None) -> None:
        self.histograms.append((name, value, self._check("histogram", name, labels)))


async def test_tracker_records_store_collection_and_rollout_metrics() -> None:
    metrics = RecordingMetrics()
    store = InMemoryLightningStore(tracker=metrics)
    rollout = await store.enqueue_rollout("x", mode="train")
    with pytest.raises(ValueError):
        await store.start_attempt("ro-missing")
    await store.update_rollout(rollout.rollout_id, status="succeeded")

    store_calls = [labels for name, labels in metrics.counters if name == "agl.store.total"]
    assert {"method": "enqueue_rollout", "store_pubmeth": "enqueue_rollout", "status": "OK"} in store_calls
    assert {"method": "start_attempt", "store_pubmeth": "start_attempt", "status": "ValueError"} in store_calls
    assert any(labels["method"] == "_scan_for_unhealthy_rollouts" for labels in store_calls)
    latencies = [value for name, value, _ in metrics.histograms if name == "agl.store.latency"]
    assert latencies and all(value >= 0 for value in latencies)

    collection_calls = [labels for name, labels in metrics.counters if name == "agl.collections.total"]
    assert {
        "store_pubmeth": "enqueue_rollout",
        "store_privmeth": "unknown",
        "operation": "insert",
        "collection": "rollouts",
        "status": "OK",
    } in collection_calls
    assert any(
        labels["store_privmeth"] == "_scan_for_unhealthy_rollouts" and labels["operation"] == "query"
        for labels in collection_calls
    )

    finished = [labels for name, labels in metrics.counters if name == "agl.rollouts.total"]
    assert finished == [{"status": "succeeded", "mode": "train"}]
    durations = [value for name, value, _ in metrics.histograms if name == "agl.rollouts.duration"]
    assert len(durations) == 1 and durations[0] >= 0


async def test_current_store_method_labels_outside_and_inside() -> None:
    assert get_current_store_methods() == (None, None)
    assert current_store_method_labels() == {"store_pubmeth": "unknown", "store_privmeth": "unknown"}
    seen: List[Tuple[Optional[str], Optional[str]]] = []

    class Probe(InMemoryLightningStore):
        async def _post_update_rollout(self, rollouts: Any, skip_enqueue: bool = False) -> None:
            seen.append(get_current_store_methods())
            await super()._post_update_rollout(rollouts, skip_enqueue)

    store = Probe()
    rollout = await store.enqueue_rollout("x")
    await store.update_rollout(rollout.rollout_id, status="failed")
    assert seen == [("update_rollout", None)]
    assert get_current_store_methods() == (None, None)


@pytest.mark.parametrize(
    ("value", "error"), [(float("nan"), ValueError), (float("inf"), ValueError), ("10", TypeError)]
)
def test_a_scan_interval_that_is_not_a_finite_number_is_refused(value: Any, error: type) -> None:
    with pytest.raises(error, match="scan_debounce_seconds"):
        InMemoryLightningStore(scan_debounce_seconds=value)
