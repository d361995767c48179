"""The in-memory store: fast, process-local, with a memory cap enforced by evicting whole rollouts' spans."""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Union

from pydantic import BaseModel

from agentbolt.store.base import LightningStoreCapabilities, LightningStoreStatistics
from agentbolt.store.collection.memory import InMemoryLightningCollections
from agentbolt.store.collection_based import CollectionBasedLightningStore, tracked
from agentbolt.types import Span

if TYPE_CHECKING:
    from agentbolt.utils.metrics import MetricsBackend

__all__ = ["InMemoryLightningStore", "estimate_model_size"]

logger = logging.getLogger("agentbolt.store.memory")

_DEFAULT_MEMORY_BYTES = 8 * 1024**3
_DEFAULT_EVICTION_RATIO = 0.7
_DEFAULT_SAFE_FRACTION_OF_EVICTION = 0.8


def _detect_total_memory_bytes() -> int:
    """Total RAM of the machine (8 GiB when it cannot be determined)."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil missing or unsupported platform
        logger.warning("Could not detect total memory; assuming 8 GiB")
        return _DEFAULT_MEMORY_BYTES


_LEAF_TYPES = frozenset({int, float, str, bytes, bool, type(None)})
"""Exact types holding no other objects: their size is their ``sys.getsizeof``."""
_SEQUENCE_TYPES = frozenset({list, tuple, set, frozenset})


def estimate_model_size(obj: Any) -> int:
    """Approximate deep size in bytes of a pydantic model (or container), via ``sys.getsizeof``.

    The size of a model, mapping, list, tuple or set is its own ``sys.getsizeof`` plus the estimated sizes of its
    declared field values, mapping values, or items; anything else is its ``sys.getsizeof``. An object met several
    times counts each time. A container that contains itself (directly or not) counts 0 at the repeated occurrence,
    so cycles terminate.
    """
    ancestors: Set[int] = set()

    def size_of(value: Any) -> int:
        kind = type(value)
        if kind in _LEAF_TYPES:
            return sys.getsizeof(value)
        if kind in _SEQUENCE_TYPES and all(type(item) in _LEAF_TYPES for item in value):
            # Token ids and other flat lists: the same sum, without a Python call per item.
            return sys.getsizeof(value) + sum(map(sys.getsizeof, value))
        if isinstance(value, BaseModel):
            children: Iterable[Any] = value.__dict__.values()  # declared fields; extras live elsewhere
        elif isinstance(value, Mapping):
            children = value.values()
        elif isinstance(value, (list, tuple, set, frozenset)):
            children = value
        else:
            return sys.getsizeof(value)
        if id(value) in ancestors:
            return 0
        ancestors.add(id(value))
        try:
            return sys.getsizeof(value) + sum(size_of(child) for child in children)
        finally:
            ancestors.discard(id(value))

    return size_of(obj)


def _resolve_threshold(
    value: Union[float, int, None], capacity: int, default_bytes: int, *, name: str, allow_zero_ratio: bool
) -> int:
    if value is None:
        return default_bytes
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a float ratio or an int number of bytes")
    if isinstance(value, float):
        low_ok = value >= 0 if allow_zero_ratio else value > 0
        if not (low_ok and value <= 1):
            interval = "[0, 1]" if allow_zero_ratio else "(0, 1]"
            raise ValueError(f"{name} as a ratio must be in {interval}, got {value}")
        return int(capacity * value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must be a non-negative number of bytes, got {value}")
        return value
    raise TypeError(f"{name} must be a float ratio or an int number of bytes")


class InMemoryLightningStore(CollectionBasedLightningStore[InMemoryLightningCollections]):
    """A store keeping everything in process memory.

    Spans count against a memory budget: when their estimated size exceeds the eviction threshold, the spans of
    whole rollouts are dropped, oldest rollout first, until the total is back under the safe threshold. Querying the
    spans of an evicted rollout raises ``RuntimeError``.

    Args:
        thread_safe: Allow calls from several threads (each with its own event loop).
        eviction_memory_threshold: Span budget; a float is a ratio of total RAM in (0, 1], an int a number of
            bytes. Default: 70% of RAM.
        safe_memory_threshold: Size eviction brings spans back under; ratio in [0, 1] or bytes. Default: 80% of
            the eviction threshold. Must be below the eviction threshold.
        span_size_estimator: Size of one span in bytes (default :func:`estimate_model_size`).
        tracker: Optional metrics backend.
        scan_debounce_seconds: Minimum interval between watchdog scans.
    """

    _wait_poll_interval = 10.0
    _cache_latest_resources = True

    def __init__(
        self,
        *,
        thread_safe: bool = False,
        eviction_memory_threshold: Union[float, int, None] = None,
        safe_memory_threshold: Union[float, int, None] = None,
        span_size_estimator: Optional[Callable[[Span], int]] = None,
        tracker: Optional[MetricsBackend] = None,
        scan_debounce_seconds: float = 10.0,
    ) -> None:
        super().__init__(
            InMemoryLightningCollections(lock_type="thread" if thread_safe else "asyncio", tracker=tracker),
            tracker=tracker,
            scan_debounce_seconds=scan_debounce_seconds,
        )
        self._thread_safe = thread_safe
        self._memory_capacity_bytes = _detect_total_memory_bytes()
        self._eviction_threshold_bytes = max(
            1,
            _resolve_threshold(
                eviction_memory_threshold,
                self._memory_capacity_bytes,
                int(self._memory_capacity_bytes * _DEFAULT_EVICTION_RATIO),
                name="eviction_memory_threshold",
                allow_zero_ratio=False,
            ),
        )
        self._safe_threshold_bytes = _resolve_threshold(
            safe_memory_threshold,
            self._memory_capacity_bytes,
            int(self._eviction_threshold_bytes * _DEFAULT_SAFE_FRACTION_OF_EVICTION),
            name="safe_memory_threshold",
            allow_zero_ratio=True,
        )
        if not 0 <= self._safe_threshold_bytes < self._eviction_threshold_bytes:
            raise ValueError(
                f"safe_memory_threshold ({self._safe_threshold_bytes} bytes) must be below "
                f"eviction_memory_threshold ({self._eviction_threshold_bytes} bytes)"
            )
        self._span_size_estimator = span_size_estimator
        self._total_span_bytes = 0
        self._span_bytes_by_rollout: Dict[str, int] = {}
        self._evicted_rollout_ids: Set[str] = set()
        self._memory_lock = threading.Lock()

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """Async-safe always; thread-safe when constructed with ``thread_safe=True``."""
        return LightningStoreCapabilities(
            thread_safe=self._thread_safe, async_safe=True, zero_copy=False, otlp_traces=False
        )

    def _span_size(self, span: Span) -> int:
        if self._span_size_estimator is None:
            return estimate_model_size(span)
        return max(0, int(self._span_size_estimator(span)))

    async def _post_add_spans(self, spans: Sequence[Span], rollout_id: str, attempt_id: str) -> None:
        added = sum(self._span_size(span) for span in spans)
        with self._memory_lock:
            self._span_bytes_by_rollout[rollout_id] = self._span_bytes_by_rollout.get(rollout_id, 0) + added
            self._total_span_bytes += added
            over_budget = self._total_span_bytes > self._eviction_threshold_bytes
        if over_budget:
            await self._evict_spans()

    @tracked("_evict_spans")
    async def _evict_spans(self) -> None:
        """Drop the spans of whole rollouts, oldest ``start_time`` first, until under the safe threshold."""
        async with self.collections.atomic(mode="rw", labels=["rollouts", "spans"]) as collections:
            with self._memory_lock:
                candidates = list(self._span_bytes_by_rollout)
            rollouts = await collections.rollouts.query(filter={"_must": {"rollout_id": {"within": candidates}}})
            start_times = {rollout.rollout_id: rollout.start_time for rollout in rollouts}
            order: List[str] = sorted(candidates, key=lambda rid: (start_times.get(rid, float("-inf")), rid))
            evicted: List[str] = []
            for rollout_id in order:
                with self._memory_lock:
                    if self._total_span_bytes <= self._safe_threshold_bytes:
                        break
                    freed = self._span_bytes_by_rollout.pop(rollout_id, 0)
                    self._total_span_bytes -= freed
                    self._evicted_rollout_ids.add(rollout_id)
                await collections.evict_spans_for_rollout(rollout_id)
                evicted.append(rollout_id)
        if evicted:
            logger.info("Evicted the spans of %d rollout(s) to stay within the memory budget", len(evicted))

    async def _ensure_spans_available(self, rollout_id: str) -> None:
        if rollout_id in self._evicted_rollout_ids:
            raise RuntimeError(f"Spans of rollout {rollout_id} were evicted to respect the memory budget")

    async def statistics(self) -> LightningStoreStatistics:
        """Counts, uptime and the memory budget figures."""
        stats = await super().statistics()
        stats["total_span_bytes"] = self._total_span_bytes
        stats["eviction_threshold_bytes"] = self._eviction_threshold_bytes
        stats["safe_threshold_bytes"] = self._safe_threshold_bytes
        stats["memory_capacity_bytes"] = self._memory_capacity_bytes
        return stats
