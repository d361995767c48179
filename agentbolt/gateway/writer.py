"""Background span writer: builds the spans of finished calls and stores them in batches, off the request path."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from agentbolt.gateway.recording import CallRecord, build_span
from agentbolt.store.base import LightningStore
from agentbolt.types import Span

__all__ = ["SpanWriter"]

logger = logging.getLogger("agentbolt.gateway.writer")


class SpanWriter:
    """Queue of finished calls drained by one task that writes them with ``store.add_many_spans``.

    Batching is natural: the task takes everything queued when it wakes up (at most ``max_batch``), so a quiet
    gateway writes each span at once and a busy one writes many per store call.

    Args:
        store: Destination store.
        max_batch: Most spans per ``add_many_spans`` call.
        max_queued: Calls waiting beyond this are dropped with a warning (protects memory when the store is down).
    """

    def __init__(self, store: LightningStore, *, max_batch: int = 512, max_queued: int = 10000) -> None:
        if max_batch < 1 or max_queued < 1:
            raise ValueError("max_batch and max_queued must be at least 1")
        self.store = store
        self.max_batch = max_batch
        self._queue: asyncio.Queue[CallRecord] = asyncio.Queue(maxsize=max_queued)
        self._task: Optional[asyncio.Task[None]] = None
        self.written = 0
        self.dropped = 0
        self.failed = 0

    def start(self) -> None:
        """Start the writing task in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="agentbolt-span-writer")

    def submit(self, call: CallRecord) -> None:
        """Queue a finished call (never blocks; drops the call if the queue is full)."""
        try:
            self._queue.put_nowait(call)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning(
                    "Span queue is full (store too slow or down); %d call span(s) dropped so far.", self.dropped
                )

    def stats(self) -> Dict[str, int]:
        """Counters: ``queued``, ``written``, ``dropped`` (queue full) and ``failed`` (store rejected)."""
        return {"queued": self._queue.qsize(), "written": self.written, "dropped": self.dropped, "failed": self.failed}

    async def flush(self) -> None:
        """Wait until every call queued so far has been written (or given up on)."""
        await self._queue.join()

    async def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (waiting at most ``timeout`` seconds), then stop the task."""
        if self._task is None:
            return
        task, self._task = self._task, None
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
        except asyncio.TimeoutError:
            logger.warning("Gave up writing %d queued span(s) at shutdown.", self._queue.qsize())
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            except Exception:  # never let the writer die; the failure is counted and logged
                logger.exception("Unexpected error while writing %d span(s)", len(batch))
                self.failed += len(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _spans(self, batch: List[CallRecord]) -> List[Span]:
        spans: List[Span] = []
        for call in batch:
            if call.sequence_id is None:
                continue
            try:
                sequence_id = await call.sequence_id
            except Exception as exc:
                self.failed += 1
                logger.warning(
                    "No sequence id for a call of rollout %s / attempt %s (%r); its span is dropped.",
                    call.rollout_id,
                    call.attempt_id,
                    exc,
                )
                continue
            try:
                spans.append(build_span(call, sequence_id))
            except Exception:
                self.failed += 1
                logger.exception("Could not build the span of a call of rollout %s", call.rollout_id)
        return spans

    async def _write(self, batch: List[CallRecord]) -> None:
        spans = await self._spans(batch)
        if not spans:
            return
        try:
            await self.store.add_many_spans(spans)
            self.written += len(spans)
            return
        except Exception as exc:
            if len(spans) == 1:
                self.failed += 1
                logger.warning("Store rejected the span of rollout %s: %s", spans[0].rollout_id, exc)
                return
        # One bad rollout (e.g. unknown id) must not cost the others their spans: retry per rollout/attempt.
        groups: Dict[Tuple[str, str], List[Span]] = defaultdict(list)
        for span in spans:
            groups[(span.rollout_id, span.attempt_id)].append(span)
        for (rollout_id, attempt_id), group in groups.items():
            try:
                await self.store.add_many_spans(group)
                self.written += len(group)
            except Exception as exc:
                self.failed += len(group)
                logger.warning(
                    "Store rejected %d span(s) of rollout %s / attempt %s: %s", len(group), rollout_id, attempt_id, exc
                )
