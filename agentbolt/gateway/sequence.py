"""Sequence ids for gateway spans, requested from the store when each request arrives.

Requests arriving while a store call is in flight are served together by the next
``store.get_many_span_sequence_ids`` call, so a busy gateway makes one store round trip per batch instead of one
per request. Ids are handed out in arrival order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import List, Optional, Sequence, Tuple

from agentbolt.store.base import LightningStore

__all__ = ["SequenceAllocator"]

logger = logging.getLogger("agentbolt.gateway.sequence")


class SequenceAllocator:
    """Coalesces sequence-id requests into batched store calls.

    Args:
        store: Store that issues the ids.
    """

    def __init__(self, store: LightningStore) -> None:
        self.store = store
        self._pending: List[Tuple[str, str, asyncio.Future[int]]] = []
        self._task: Optional[asyncio.Task[None]] = None
        self._batched = True

    def allocate(self, rollout_id: str, attempt_id: str) -> asyncio.Future[int]:
        """Request the next sequence id of ``rollout_id``; the future resolves once the store answers."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((rollout_id, attempt_id, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agentbolt-sequence-ids")
        return future

    async def _fetch(self, pairs: Sequence[Tuple[str, str]]) -> Sequence[int]:
        if self._batched and len(pairs) > 1:
            try:
                return await self.store.get_many_span_sequence_ids(pairs)
            except NotImplementedError:
                self._batched = False
        return [await self.store.get_next_span_sequence_id(rollout_id, attempt_id) for rollout_id, attempt_id in pairs]

    async def _run(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    ids = await self._fetch([(rollout_id, attempt_id) for rollout_id, attempt_id, _ in batch])
                    if len(ids) != len(batch):
                        raise RuntimeError(f"store returned {len(ids)} sequence ids for {len(batch)} requests")
                except Exception as exc:
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, _, future), sequence_id in zip(batch, ids, strict=True):
                    if not future.done():
                        future.set_result(int(sequence_id))
        finally:
            self._task = None
