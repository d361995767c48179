"""A facade serialising every call to a wrapped store, making it usable from several threads."""

from __future__ import annotations

from typing import Any, List, Optional

from agentbolt.store.base import LightningStore, LightningStoreCapabilities, forward_store_api
from agentbolt.store.collection.memory import _ThreadSafeAsyncLock
from agentbolt.store.collection_based import CollectionBasedLightningStore, healthcheck_suppressed
from agentbolt.types import Rollout

__all__ = ["LightningStoreThreaded"]


class LightningStoreThreaded(LightningStore):
    """Wrap a store so that calls from any thread (and any event loop) run one at a time.

    Every public method of :class:`~agentbolt.store.base.LightningStore` is forwarded once, with the same arguments,
    while holding the facade's lock; the lock never blocks an event loop (waiting coroutines yield while another
    thread holds it). ``wait_for_rollouts`` and ``wait_for_queued_rollouts`` are forwarded without the lock so that
    long waits do not stall other calls.

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
        """Forwarded without the lock, so that long waits do not stall other calls.

        The watchdog of a collection-based store, which may write, runs first under the lock; the unlocked wait
        itself only reads.
        """
        if isinstance(self.store, CollectionBasedLightningStore):
            async with self._lock:
                await self.store._healthcheck()
        with healthcheck_suppressed():
            return await self.store.wait_for_rollouts(rollout_ids=rollout_ids, timeout=timeout)

    async def wait_for_queued_rollouts(self, timeout: float) -> bool:
        """Forwarded without the lock, like ``wait_for_rollouts``: the wait only reads."""
        with healthcheck_suppressed():
            return await self.store.wait_for_queued_rollouts(timeout)

    @property
    def watchdog_period(self) -> Optional[float]:
        """The wrapped store's watchdog period, or None when it has no watchdog (see :meth:`run_watchdog`)."""
        if isinstance(self.store, CollectionBasedLightningStore):
            return self.store.watchdog_period
        return None

    async def run_watchdog(self) -> None:
        """Run the wrapped store's watchdog scan, if it has one and one is due, holding the facade's lock."""
        if isinstance(self.store, CollectionBasedLightningStore):
            async with self._lock:
                await self.store.run_watchdog()

    async def _call_locked(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        async with self._lock:
            return await getattr(self.store, name)(*args, **kwargs)


forward_store_api(LightningStoreThreaded, LightningStoreThreaded._call_locked)
