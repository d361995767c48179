"""Sequence ids for gateway spans, requested from the store when each request arrives.

Requests arriving while a store call is in flight are served together by the next
``store.get_many_span_sequence_ids`` call, so a busy gateway makes one store round trip per batch instead of one
per request. Ids are handed out in arrival order.

When the store cannot be reached (down, restarting), the requests keep their place: the batch is retried with
backoff, newer requests queue behind it, and the ids are issued in arrival order once the store answers. A call's
span thus keeps its place in its rollout however long the outage lasts; the span writer waits for the id before
writing the span. Only an error retrying cannot cure (the store rejecting the request) fails the waiting calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import List, Optional, Sequence, Tuple

from agentbolt.store.base import LightningStore
from agentbolt.store.span_writer import is_permanent_store_error

__all__ = ["SequenceAllocator"]

logger = logging.getLogger("agentbolt.gateway.sequence")


class SequenceAllocator:
    """Coalesces sequence-id requests into batched store calls, retried in order while the store is unreachable.

    Args:
        store: Store that issues the ids.
        retry_initial_delay: First delay between retries while the store is unreachable.
        retry_max_delay: Longest delay between retries.
    """

    def __init__(
        self, store: LightningStore, *, retry_initial_delay: float = 0.2, retry_max_delay: float = 5.0
    ) -> None:
        self.store = store
        self.retry_initial_delay = retry_initial_delay
        self.retry_max_delay = retry_max_delay
        self._pending: List[Tuple[str, str, asyncio.Future[int]]] = []
        self._in_flight: List[Tuple[str, str, asyncio.Future[int]]] = []
        self._task: Optional[asyncio.Task[None]] = None
        self._batched = True
        self._unreachable_since: Optional[float] = None

    @property
    def unreachable(self) -> bool:
        """Whether the last request for ids failed for a reason a retry may cure (they are being retried)."""
        return self._unreachable_since is not None

    def allocate(self, rollout_id: str, attempt_id: str) -> asyncio.Future[int]:
        """Request the next sequence id of ``rollout_id``; the future resolves once the store answers.

        Cancelling the future withdraws the request (no id is issued for it if it was not sent yet).
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((rollout_id, attempt_id, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agentbolt-sequence-ids")
        return future

    async def close(self) -> None:
        """Stop retrying; requests still waiting fail with :class:`ConnectionError`."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        waiting = self._in_flight + self._pending
        self._pending, self._in_flight = [], []
        for _, _, future in waiting:
            if not future.done():
                future.set_exception(ConnectionError("The gateway stopped before the store issued a sequence id"))

    async def _fetch(self, pairs: Sequence[Tuple[str, str]]) -> Sequence[int]:
        if self._batched and len(pairs) > 1:
            try:
                return await self.store.get_many_span_sequence_ids(pairs)
            except NotImplementedError:
                self._batched = False
        return [await self.store.get_next_span_sequence_id(rollout_id, attempt_id) for rollout_id, attempt_id in pairs]

    async def _run(self) -> None:
        delay = self.retry_initial_delay
        try:
            while self._pending:
                batch = [entry for entry in self._pending if not entry[2].done()]  # withdrawn requests need no id
                self._pending = []
                if not batch:
                    continue
                self._in_flight = batch
                try:
                    ids = await self._fetch([(rollout_id, attempt_id) for rollout_id, attempt_id, _ in batch])
                    if len(ids) != len(batch):
                        raise ValueError(f"store returned {len(ids)} sequence ids for {len(batch)} requests")
                except Exception as exc:
                    self._in_flight = []
                    if is_permanent_store_error(exc):
                        for _, _, future in batch:
                            if not future.done():
                                future.set_exception(exc)
                        continue
                    self._enter_outage(exc, len(batch))
                    self._pending = batch + self._pending  # keep arrival order: the oldest are issued first
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_max_delay)
                    continue
                self._in_flight = []
                self._leave_outage()
                delay = self.retry_initial_delay
                for (_, _, future), sequence_id in zip(batch, ids, strict=True):
                    if not future.done():
                        future.set_result(int(sequence_id))
        finally:
            self._task = None

    def _enter_outage(self, exc: BaseException, waiting: int) -> None:
        if self._unreachable_since is not None:
            return
        self._unreachable_since = time.monotonic()
        logger.warning(
            "Cannot get sequence ids from the store (%s: %s); %d call(s) wait for theirs, retrying. Answers are "
            "sent without waiting meanwhile.",
            type(exc).__name__,
            exc,
            waiting,
        )

    def _leave_outage(self) -> None:
        if self._unreachable_since is None:
            return
        seconds = time.monotonic() - self._unreachable_since
        self._unreachable_since = None
        logger.warning("Store issues sequence ids again after %.1f s.", seconds)
