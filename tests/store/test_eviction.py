"""InMemoryLightningStore memory budget: threshold resolution, size estimation and whole-rollout eviction."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentbolt.store import memory as memory_module
from agentbolt.store.memory import InMemoryLightningStore, _detect_total_memory_bytes, estimate_model_size
from agentbolt.types import AttemptedRollout, Span

from .conftest import make_span

SPAN_BYTES = 100


def fixed_size(span: Span) -> int:
    return SPAN_BYTES


async def fill(store: InMemoryLightningStore, rollout: AttemptedRollout, count: int, prefix: str) -> None:
    spans = [make_span(rollout.rollout_id, rollout.attempt.attempt_id, i + 1, f"{prefix}-{i}") for i in range(count)]
    assert len(await store.add_many_spans(spans)) == count


async def test_whole_rollouts_are_evicted_oldest_first() -> None:
    store = InMemoryLightningStore(
        eviction_memory_threshold=1000, safe_memory_threshold=500, span_size_estimator=fixed_size
    )
    rollouts = []
    for name in ("old", "middle", "young"):
        rollouts.append(await store.start_rollout(name))
        await asyncio.sleep(0.002)  # distinct start times
    old, middle, young = rollouts
    await fill(store, old, 4, "o")
    await fill(store, middle, 3, "m")
    await fill(store, young, 3, "y")
    assert store._total_span_bytes == 1000  # at the threshold: nothing evicted yet
    assert len(await store.query_spans(old.rollout_id)) == 4

    await fill(store, young, 1, "y2")  # 1100 bytes > 1000: evict old (-> 700), then middle (-> 400)
    assert store._total_span_bytes == 400
    for evicted in (old, middle):
        with pytest.raises(RuntimeError, match="evicted"):
            await store.query_spans(evicted.rollout_id)
    assert len(await store.query_spans(young.rollout_id)) == 4
    stats = await store.statistics()
    assert stats["total_spans"] == 4
    assert stats["total_span_bytes"] == 400
    assert stats["eviction_threshold_bytes"] == 1000
    assert stats["safe_threshold_bytes"] == 500
    assert stats["memory_capacity_bytes"] == store._memory_capacity_bytes
    # Rollouts and attempts themselves are kept.
    assert (await store.get_rollout_by_id(old.rollout_id)) is not None
    assert len(await store.query_attempts(old.rollout_id)) == 1


async def test_duplicates_do_not_count_and_estimator_is_clamped() -> None:
    store = InMemoryLightningStore(
        eviction_memory_threshold=1000, safe_memory_threshold=0, span_size_estimator=lambda span: -50
    )
    started = await store.start_rollout("x")
    await fill(store, started, 2, "s")
    assert store._total_span_bytes == 0
    sized = InMemoryLightningStore(eviction_memory_threshold=1000, span_size_estimator=fixed_size)
    started = await sized.start_rollout("x")
    span = make_span(started.rollout_id, started.attempt.attempt_id, 1, "s")
    await sized.add_span(span)
    assert await sized.add_span(span) is None
    assert sized._total_span_bytes == SPAN_BYTES


async def test_default_estimator_grows_with_content() -> None:
    small = make_span("ro", "at", 1, "s", attributes={"k": 1})
    large = make_span("ro", "at", 1, "s", attributes={"k": "x" * 10_000, "list": ["b" * 100, "c"]})
    assert estimate_model_size(large) - estimate_model_size(small) > 10_000
    assert estimate_model_size({"a": [1, 2, (3, 4)], "b": {5}}) > estimate_model_size({})
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert estimate_model_size(cyclic) > 0

    store = InMemoryLightningStore(eviction_memory_threshold=10**9)
    started = await store.start_rollout("x")
    await store.add_span(make_span(started.rollout_id, started.attempt.attempt_id, 1, "s", attributes={"k": 1}))
    assert store._total_span_bytes == estimate_model_size(
        make_span(started.rollout_id, started.attempt.attempt_id, 1, "s", attributes={"k": 1})
    )


def test_threshold_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_module, "_detect_total_memory_bytes", lambda: 10_000)
    default = InMemoryLightningStore()
    assert default._memory_capacity_bytes == 10_000
    assert default._eviction_threshold_bytes == 7_000
    assert default._safe_threshold_bytes == 5_600
    ratios = InMemoryLightningStore(eviction_memory_threshold=0.5, safe_memory_threshold=0.1)
    assert (ratios._eviction_threshold_bytes, ratios._safe_threshold_bytes) == (5_000, 1_000)
    absolute = InMemoryLightningStore(eviction_memory_threshold=300, safe_memory_threshold=0)
    assert (absolute._eviction_threshold_bytes, absolute._safe_threshold_bytes) == (300, 0)
    tiny = InMemoryLightningStore(eviction_memory_threshold=1e-9, safe_memory_threshold=0)
    assert tiny._eviction_threshold_bytes == 1  # at least one byte


@pytest.mark.parametrize(
    ("eviction", "safe", "message"),
    [
        (0.0, None, "ratio"),
        (1.5, None, "ratio"),
        (-1, None, "non-negative"),
        (0.5, 1.5, "ratio"),
        (0.5, -2, "non-negative"),
        (100, 100, "below"),
        (100, 200, "below"),
        (0.2, 0.5, "below"),
    ],
)
def test_invalid_thresholds(monkeypatch: pytest.MonkeyPatch, eviction: Any, safe: Any, message: str) -> None:
    monkeypatch.setattr(memory_module, "_detect_total_memory_bytes", lambda: 10_000)
    with pytest.raises(ValueError, match=message):
        InMemoryLightningStore(eviction_memory_threshold=eviction, safe_memory_threshold=safe)


def test_detect_total_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _detect_total_memory_bytes() > 0
    import psutil

    def broken() -> Any:
        raise OSError("no /proc")

    monkeypatch.setattr(psutil, "virtual_memory", broken)
    assert _detect_total_memory_bytes() == 8 * 1024**3


def test_capabilities() -> None:
    assert InMemoryLightningStore().capabilities == {
        "thread_safe": False,
        "async_safe": True,
        "zero_copy": False,
        "otlp_traces": False,
    }
    assert InMemoryLightningStore(thread_safe=True).capabilities["thread_safe"] is True


async def test_latest_resources_id_is_cached_after_first_use() -> None:
    from agentbolt.store.base import UNSET
    from agentbolt.types import PromptTemplate

    store = InMemoryLightningStore()
    assert store._latest_resources_id is UNSET
    assert (await store.enqueue_rollout(1)).resources_id is None
    assert store._latest_resources_id is None
    added = await store.add_resources({"p": PromptTemplate(template="t", engine="f-string")})
    assert store._latest_resources_id == added.resources_id
    assert (await store.enqueue_rollout(2)).resources_id == added.resources_id
