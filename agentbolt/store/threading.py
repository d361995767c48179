"""A facade serialising every call to a wrapped store, making it usable from several threads."""

from __future__ import annotations

import functools
from typing import Any, List, Optional

from agentbolt.store.base import LightningStore, LightningStoreCapabilities
from agentbolt.store.collection.memory import _ThreadSafeAsyncLock
from agentbolt.store.collection_based import healthcheck_suppressed
from agentbolt.types import Rollout

__all__ = ["LightningStoreThreaded"]


def _delegate_locked(name: str) -> Any:
    """A method forwarding its arguments unchanged to ``self.store.<name>`` while holding the facade's lock."""

    @functools.wraps(getattr(LightningStore, name))
    async def method(self: LightningStoreThreaded, *args: Any, **kwargs: Any) -> Any:
        async with self._lock:
            return await getattr(self.store, name)(*args, **kwargs)

    return method


class LightningStoreThreaded(LightningStore):
    """Wrap a store so that calls from any thread (and any event loop) run one at a time.

    The lock never blocks an event loop: waiting coroutines yield while another thread holds it.
    ``wait_for_rollouts`` waits without the lock so that long waits do not stall other calls.

    Args:
        store: The store to protect.
    """

    def __init__(self, store: LightningStore) -> None:
        super().__init__()
        self.store = store
        self._lock = _ThreadSafeAsyncLock()

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        """The wrapped store's capabilities, made thread- and async-safe."""
        return LightningStoreCapabilities({**self.store.capabilities, "async_safe": True, "thread_safe": True})  # type: ignore[typeddict-item]

    def otlp_traces_endpoint(self) -> str:
        """The wrapped store's OTLP traces endpoint."""
        return self.store.otlp_traces_endpoint()

    async def wait_for_rollouts(self, *, rollout_ids: List[str], timeout: Optional[float] = None) -> List[Rollout]:
        """Delegated without the lock, so that long waits do not stall other calls.

        The wrapped store's watchdog may write, so it runs first under the lock (with an immediate check); the
        unlocked wait itself then only reads.
        """
        async with self._lock:
            finished = await self.store.wait_for_rollouts(rollout_ids=rollout_ids, timeout=0)
        if timeout is not None and timeout <= 0:
            return finished
        with healthcheck_suppressed():
            return await self.store.wait_for_rollouts(rollout_ids=rollout_ids, timeout=timeout)

    statistics = _delegate_locked("statistics")
    start_rollout = _delegate_locked("start_rollout")
    enqueue_rollout = _delegate_locked("enqueue_rollout")
    enqueue_many_rollouts = _delegate_locked("enqueue_many_rollouts")
    dequeue_rollout = _delegate_locked("dequeue_rollout")
    dequeue_many_rollouts = _delegate_locked("dequeue_many_rollouts")
    start_attempt = _delegate_locked("start_attempt")
    add_span = _delegate_locked("add_span")
    add_many_spans = _delegate_locked("add_many_spans")
    add_otel_span = _delegate_locked("add_otel_span")
    query_rollouts = _delegate_locked("query_rollouts")
    query_attempts = _delegate_locked("query_attempts")
    get_rollout_by_id = _delegate_locked("get_rollout_by_id")
    get_latest_attempt = _delegate_locked("get_latest_attempt")
    query_resources = _delegate_locked("query_resources")
    get_resources_by_id = _delegate_locked("get_resources_by_id")
    get_latest_resources = _delegate_locked("get_latest_resources")
    get_next_span_sequence_id = _delegate_locked("get_next_span_sequence_id")
    get_many_span_sequence_ids = _delegate_locked("get_many_span_sequence_ids")
    query_spans = _delegate_locked("query_spans")
    add_resources = _delegate_locked("add_resources")
    update_resources = _delegate_locked("update_resources")
    update_rollout = _delegate_locked("update_rollout")
    update_attempt = _delegate_locked("update_attempt")
    query_workers = _delegate_locked("query_workers")
    get_worker_by_id = _delegate_locked("get_worker_by_id")
    update_worker = _delegate_locked("update_worker")
