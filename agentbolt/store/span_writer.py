"""One writer of spans to a store: bounded buffering, batches, and retries that ride out a store outage.

Every source of spans that must not wait for the store feeds a :class:`SpanWriter`: the tracer's span processor
(spans of agent code and of the OpenAI SDK instrumentation) and the LLM gateway (one span per proxied call). Sources
hand over :class:`PendingSpan` objects and go on; a task on the writer's event loop stores them, oldest first:

* **Batches.** Everything waiting (at most ``max_batch`` spans) is written with one store call: spans whose
  sequence id was issued up front with ``add_many_spans``, the others with ``add_spans_with_new_sequence_ids``,
  which issues their ids in order. A span's ``Span`` (and so its span id) is built once, so a batch that is sent
  again after an ambiguous failure is recognised by the store as already stored instead of being duplicated.
* **Outages delay spans, they do not lose them.** When a write fails for a reason retrying can cure (connection
  refused or reset, a timeout, a 5xx), the batch stays at the head of the buffer and is retried with backoff
  (``retry_initial_delay`` doubling to ``retry_max_delay``) until the store answers. One warning is logged when
  the outage starts and one when the store is back. A process that is stopping calls :meth:`SpanWriter.stop_retrying`:
  from then on a write the store cannot take is not retried, and the spans waiting are given up (``lost``) with one
  warning that counts them; :meth:`SpanWriter.resume_retrying` ends that when the writer serves a new run.
* **Bounded memory.** At most ``max_buffered`` spans wait. A span handed over while the buffer is full is dropped:
  that is the only case where spans are dropped for lack of room; drops are counted (``dropped``) and logged
  (the first one of each full spell, then a total once there is room again).
* **Rejected spans are given up one by one.** When the store rejects a batch as invalid (a 4xx answer, a
  ``ValueError`` / ``TypeError`` / ``KeyError``), its spans are written one at a time so only the offending span is
  given up (``failed``). A rejected span holding strings that JSON cannot carry (lone surrogates) is first written
  once more with those strings repaired (see :func:`~agentbolt.types.wire.without_lone_surrogates`), with a warning:
  the span is kept, with U+FFFD where the text had no valid form (``repaired``).

:meth:`SpanWriter.flush` waits until every span handed over before the call has been written or given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple, Union

from agentbolt.store.base import LightningStore
from agentbolt.types import Span
from agentbolt.types.wire import without_lone_surrogates

__all__ = ["PendingSpan", "SpanWriter", "is_permanent_store_error"]

module_logger = logging.getLogger(__name__)

DEFAULT_MAX_BUFFERED = 10_000
"""Spans a writer keeps while the store is slow or unreachable."""

STORE_CALL_TIMEOUT_SECONDS = 60.0
"""Upper bound of one store call (a hung call is abandoned and retried)."""


def is_permanent_store_error(exc: BaseException) -> bool:
    """Whether retrying a failed store call cannot help (the store rejected the request itself).

    HTTP errors count by their status (4xx but 408 and 429); otherwise ``ValueError``, ``TypeError`` and ``KeyError``
    are permanent and everything else (connection errors, timeouts...) is worth retrying.
    """
    status = getattr(exc, "status", None)
    if not isinstance(status, int):
        status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return 400 <= status < 500 and status not in (408, 429)
    return isinstance(exc, (ValueError, TypeError, KeyError))


class PendingSpan:
    """A span handed to a :class:`SpanWriter`: its ids are known, its ``Span`` is built when it is written.

    Subclasses set ``rollout_id`` and ``attempt_id`` and implement :meth:`to_span`; they may override
    :meth:`issued_sequence_id` (a sequence id obtained up front) and :meth:`completed`.
    """

    rollout_id: str
    attempt_id: str

    async def issued_sequence_id(self) -> Optional[int]:
        """The sequence id issued for this span before it was handed over, or None to have the store issue one.

        May wait (for an id requested from the store earlier). Raising gives the span up, except for errors
        :func:`is_permanent_store_error` considers temporary, which are retried like a failed write.
        """
        return None

    def to_span(self, sequence_id: int) -> Span:
        """Build the span (called once; ``sequence_id`` is 0 when the store issues it at write time)."""
        raise NotImplementedError

    def describe(self) -> str:
        """How log messages name this span."""
        return f"span of rollout {self.rollout_id}"

    def completed(self, stored: Optional[Span]) -> None:
        """Called once when the span is stored (``stored``) or given up (None).

        Runs on the writer's loop, or in the thread calling :meth:`SpanWriter.submit` when the buffer was full.
        """


class _Queued:
    """A pending span in the buffer, with what the writer learned about it so far."""

    __slots__ = ("enqueued_at", "item", "numbered", "repair_tried", "span", "stored", "written")

    def __init__(self, item: PendingSpan) -> None:
        self.item = item
        self.enqueued_at = time.monotonic()
        self.span: Optional[Span] = None
        self.numbered = False  # the span carries an id issued up front (else the store issues it at write time)
        self.written = False  # stored, or given up
        self.stored: Optional[Span] = None
        self.repair_tried = False  # the store rejected it and its strings were checked for what JSON cannot carry


def _build_spans(to_build: Sequence[Tuple[_Queued, Optional[int]]]) -> List[Union[Span, Exception]]:
    """The span of each pending item (0 as the sequence id where the store issues it), or the error building it."""
    built: List[Union[Span, Exception]] = []
    for queued, sequence_id in to_build:
        try:
            built.append(queued.item.to_span(0 if sequence_id is None else sequence_id))
        except Exception as exc:
            built.append(exc)
    return built


class SpanWriter:
    """Buffers spans and writes them to ``store`` from a task on one event loop (see the module docstring).

    :meth:`submit` may be called from any thread and never blocks. :meth:`start` binds the writer to an event loop;
    :meth:`flush` and :meth:`close` run on that loop, :meth:`flush_threadsafe` from any other thread.

    Args:
        store: Destination store.
        max_buffered: Most spans waiting; beyond that new spans are dropped (and counted).
        max_batch: Most spans per store call.
        write_delay: Longest time a span waits for more spans to share its store call (0: write at once).
            :meth:`flush` writes at once.
        retry_initial_delay: First delay between retries while the store is unreachable.
        retry_max_delay: Longest delay between retries.
        logger: Logger of the warnings (defaults to this module's).
    """

    def __init__(
        self,
        store: LightningStore,
        *,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_batch: int = 256,
        write_delay: float = 0.0,
        retry_initial_delay: float = 0.2,
        retry_max_delay: float = 5.0,
        logger: Optional[logging.Logger] = None,
    ) -> None:
        if max_buffered < 1 or max_batch < 1:
            raise ValueError(f"max_buffered and max_batch must be at least 1, got {max_buffered} and {max_batch}")
        if write_delay < 0:
            raise ValueError(f"write_delay must not be negative, got {write_delay}")
        self.store = store
        self.max_buffered = max_buffered
        self.max_batch = max_batch
        self.write_delay = write_delay
        self.retry_initial_delay = retry_initial_delay
        self.retry_max_delay = retry_max_delay
        self._logger = logger or module_logger

        self._lock = threading.Lock()
        self._pending: Deque[_Queued] = deque()
        self._submitted = 0  # spans accepted so far; a span's ticket is the count after it
        self._completed = 0  # spans written or given up, always a prefix of the accepted ones
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self.repaired = 0
        self.lost = 0
        self._dropped_while_full = 0

        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[int] = None
        self._task: Optional[asyncio.Task[None]] = None
        self._wakeup: Optional[asyncio.Event] = None
        self._flush_until = 0
        self._waiters: List[Tuple[int, asyncio.Future[None]]] = []
        self._isolate = 0  # spans still to write one by one after a batch was rejected
        self._outage_since: Optional[float] = None
        self._retrying = True
        self._retries_stopped: Optional[asyncio.Event] = None

    # ---- lifecycle ----

    def start(self, loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        """Start writing on ``loop`` (default: the running loop). Spans submitted earlier are kept."""
        if self._loop is not None:
            return
        if loop is None:
            loop = asyncio.get_running_loop()
        self._loop = loop
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._start_task()
        else:
            loop.call_soon_threadsafe(self._start_task)

    def _start_task(self) -> None:
        assert self._loop is not None
        self._loop_thread = threading.get_ident()
        self._wakeup = asyncio.Event()
        self._retries_stopped = asyncio.Event()
        self._signal_retrying()
        # A fresh context: the writer has its own retry policy and must not inherit the context of whichever caller
        # started it (a runner's ride_out_outages block, a rollout's trace context).
        self._task = self._loop.create_task(self._run(), name="agentbolt-span-writer", context=contextvars.Context())

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called."""
        return self._loop is not None

    async def close(self, timeout: float = 10.0) -> int:
        """Write what is buffered (waiting at most ``timeout`` seconds), then stop; must run on the writer's loop.

        Returns:
            The number of spans that could not be written and were given up (counted in ``lost``).
        """
        await self.flush(timeout)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return self._abandon()

    def stop_retrying(self) -> None:
        """Give up the spans the store cannot take instead of retrying them: the process is stopping (any thread).

        Spans are still written while the store takes them. Once a write fails for a reason a retry could cure (the
        store is gone), or at once when the writer is already retrying such a failure, every span waiting is given up
        and counted in ``lost``, with one warning. Calls that wait for spans (:meth:`flush`, :meth:`close`) then
        return. This lasts until :meth:`resume_retrying`.
        """
        self._set_retrying(False)

    def resume_retrying(self) -> None:
        """Retry the writes the store cannot take again, as before :meth:`stop_retrying` (any thread).

        For a writer that outlives the stop it was told about and serves a new run of the process.
        """
        self._set_retrying(True)

    def _set_retrying(self, retrying: bool) -> None:
        self._retrying = retrying
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is retried any more anyway
            loop.call_soon_threadsafe(self._signal_retrying)

    def _signal_retrying(self) -> None:
        """Make :attr:`_retries_stopped` (on the writer's loop) follow :attr:`_retrying`."""
        if self._retries_stopped is None:
            return
        if self._retrying:
            self._retries_stopped.clear()
        else:
            self._retries_stopped.set()

    def _abandon(self, why: Optional[str] = None) -> int:
        """Give up every span waiting (counted in ``lost``); one warning says how many (and ``why``, when not at
        shutdown)."""
        with self._lock:
            left = list(self._pending)
            self._pending.clear()
            self._completed += len(left)
            self.lost += len(left)
        for queued in left:
            self._finish(queued.item, None)
        if left and why is None:
            self._logger.warning(
                "Shutting down with %d span(s) never written to the store (oldest: %s); they are lost.",
                len(left),
                left[0].item.describe(),
            )
        elif left:
            self._logger.warning(
                "Giving up %d span(s) never written to the store (%s; oldest: %s); they are lost.",
                len(left),
                why,
                left[0].item.describe(),
            )
        self._release_waiters()
        return len(left)

    def stop_threadsafe(self, timeout: float) -> int:
        """:meth:`close` from another thread; returns the number of spans given up."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return self._abandon()
        future = asyncio.run_coroutine_threadsafe(self.close(timeout), loop)
        try:
            return future.result(timeout + 5.0)
        except Exception:  # the loop is stuck: whatever is left is lost
            return self._abandon()

    # ---- submitting ----

    def submit(self, item: PendingSpan) -> bool:
        """Hand a span over (any thread, never blocks).

        Returns:
            False when the buffer was full and the span was dropped.
        """
        queued = _Queued(item)
        with self._lock:
            waiting = len(self._pending)
            if waiting >= self.max_buffered:
                self.dropped += 1
                self._dropped_while_full += 1
                first = self._dropped_while_full == 1
                dropped = self.dropped
            else:
                self._pending.append(queued)
                self._submitted += 1
                first = False
                dropped = -1
        if dropped >= 0:
            if first:
                self._logger.warning(
                    "Span buffer full (%d spans waiting for the store): giving up %s (%d span(s) dropped so far); "
                    "further drops are counted until there is room again.",
                    self.max_buffered,
                    item.describe(),
                    dropped,
                )
            self._finish(item, None)
            return False
        # The task needs waking for a first span, a full batch, or when spans are written without delay.
        if waiting == 0 or not self.write_delay or (waiting + 1) % self.max_batch == 0:
            self._wake()
        return True

    def _wake(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            if self._wakeup is not None:
                self._wakeup.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing will write anyway
            loop.call_soon_threadsafe(self._set_wakeup)

    def _set_wakeup(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # ---- state ----

    @property
    def queued(self) -> int:
        """Spans waiting to be written."""
        with self._lock:
            return len(self._pending)

    @property
    def unreachable(self) -> bool:
        """Whether the last write failed for a reason a retry may cure (the store is down or too slow)."""
        return self._outage_since is not None

    def stats(self) -> Dict[str, int]:
        """Counters: ``queued``, ``written``, ``dropped`` (buffer full), ``failed`` (rejected), ``repaired`` (written
        after their strings were made writable as JSON) and ``lost``."""
        with self._lock:
            queued = len(self._pending)
        return {
            "queued": queued,
            "written": self.written,
            "dropped": self.dropped,
            "failed": self.failed,
            "repaired": self.repaired,
            "lost": self.lost,
        }

    # ---- flushing ----

    async def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every span submitted before this call is written or given up; must run on the writer's loop.

        Args:
            timeout: Seconds to wait at most (None: no limit).

        Returns:
            True when they all were, False on timeout (they stay buffered and are still written).
        """
        with self._lock:
            ticket = self._submitted
        return await self._wait_for(ticket, timeout)

    def flush_threadsafe(self, timeout: Optional[float] = None) -> bool:
        """:meth:`flush` from a thread other than the writer's loop (blocks that thread)."""
        with self._lock:
            ticket = self._submitted
            done = self._completed >= ticket
        if done:
            return True
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        future = asyncio.run_coroutine_threadsafe(self._wait_for(ticket, timeout), loop)
        try:
            return future.result(None if timeout is None else timeout + 5.0)
        except Exception:
            return False

    async def _wait_for(self, ticket: int, timeout: Optional[float]) -> bool:
        with self._lock:
            if self._completed >= ticket:
                return True
            self._flush_until = max(self._flush_until, ticket)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((ticket, waiter))
        self._set_wakeup()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            if not waiter.done():
                waiter.cancel()
            self._waiters = [(t, w) for t, w in self._waiters if w is not waiter]

    def _release_waiters(self) -> None:
        completed = self._completed
        for ticket, waiter in self._waiters:
            if ticket <= completed and not waiter.done():
                waiter.set_result(None)

    # ---- the writing task ----

    def _next_batch(self) -> List[_Queued]:
        with self._lock:
            limit = 1 if self._isolate > 0 else self.max_batch
            batch: List[_Queued] = []
            for queued in self._pending:
                if len(batch) >= limit:
                    break
                batch.append(queued)
            return batch

    def _batch_wait(self, batch: List[_Queued]) -> float:
        """Seconds to wait for more spans before writing ``batch`` (0: write now)."""
        if not self.write_delay or self._isolate or self._outage_since is not None:
            return 0.0
        with self._lock:
            if self._flush_until > self._completed:
                return 0.0
            if len(batch) >= self.max_batch or len(self._pending) >= self.max_buffered:
                return 0.0
        return max(0.0, batch[0].enqueued_at + self.write_delay - time.monotonic())

    async def _run(self) -> None:
        assert self._wakeup is not None
        wakeup = self._wakeup
        delay = self.retry_initial_delay
        while True:
            batch = self._next_batch()
            if not batch:
                wakeup.clear()
                if not self.queued:
                    await wakeup.wait()
                continue
            wait = self._batch_wait(batch)
            if wait > 0:
                wakeup.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), wait)
                continue
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_permanent_store_error(exc):
                    if self._retrying:
                        self._enter_outage(exc)
                        await self._wait_before_retry(delay)
                        delay = min(delay * 2, self.retry_max_delay)
                    if not self._retrying:  # the process is stopping: no more retries (see stop_retrying)
                        self._abandon(
                            f"the store cannot take them ({type(exc).__name__}: {exc}) and the process is stopping"
                        )
                    continue
                if len([q for q in batch if not q.written]) > 1:
                    self._isolate = len(batch)  # write them one by one to find the rejected span
                    continue
                if self._repair(batch, exc):
                    continue
                for queued in batch:
                    if not queued.written:
                        self._give_up(queued, exc)
            else:
                self._leave_outage()
                delay = self.retry_initial_delay
            if self._isolate:
                self._isolate = max(0, self._isolate - len(batch))
            self._complete(batch)

    async def _wait_before_retry(self, delay: float) -> None:
        """Sleep ``delay`` seconds before retrying a write, or until :meth:`stop_retrying` is called."""
        assert self._retries_stopped is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._retries_stopped.wait(), delay)

    async def _prepare(self, batch: Sequence[_Queued]) -> None:
        """Build the spans not built yet, waiting for sequence ids issued up front.

        The spans are built on a worker thread: building the span of one huge call (a prompt of many megabytes)
        takes seconds, which must not hold up the event loop the writer shares with the calls it records.
        """
        to_build: List[Tuple[_Queued, Optional[int]]] = []
        for queued in batch:
            if queued.span is not None or queued.written:
                continue
            try:
                to_build.append((queued, await queued.item.issued_sequence_id()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_permanent_store_error(exc):
                    raise
                self._give_up(queued, exc)
        if not to_build:
            return
        try:
            built = await asyncio.to_thread(_build_spans, to_build)
        except RuntimeError:  # no worker thread can be had (the interpreter is shutting down): build them here
            built = _build_spans(to_build)
        for (queued, sequence_id), outcome in zip(to_build, built, strict=True):
            if isinstance(outcome, Exception):
                self._logger.error("Could not build %s", queued.item.describe(), exc_info=outcome)
                self._give_up(queued, outcome, log=False)
                continue
            queued.span = outcome
            queued.numbered = sequence_id is not None

    async def _write(self, batch: Sequence[_Queued]) -> None:
        await self._prepare(batch)
        ready = [(q, q.span) for q in batch if not q.written and q.span is not None]
        numbered = [(q, span) for q, span in ready if q.numbered]
        if numbered:
            spans = [span for _, span in numbered]
            await asyncio.wait_for(self.store.add_many_spans(spans), STORE_CALL_TIMEOUT_SECONDS)
            for queued, span in numbered:
                self._stored(queued, span)
        unnumbered = [(q, span) for q, span in ready if not q.numbered]
        if unnumbered:
            spans = [span for _, span in unnumbered]
            stored = await asyncio.wait_for(
                self.store.add_spans_with_new_sequence_ids(spans), STORE_CALL_TIMEOUT_SECONDS
            )
            by_id = {(span.rollout_id, span.span_id): span for span in stored}
            for queued, span in unnumbered:
                # A span missing from the answer was already stored (a batch sent again after a lost answer).
                self._stored(queued, by_id.get((span.rollout_id, span.span_id)))

    def _repair(self, batch: Sequence[_Queued], exc: BaseException) -> bool:
        """Make the strings of a rejected span writable as JSON, once; whether there was anything to repair."""
        for queued in batch:
            if queued.written or queued.span is None or queued.repair_tried:
                continue
            queued.repair_tried = True
            try:
                cleaned = without_lone_surrogates(queued.span)
            except ValueError:  # invalid for other reasons too: given up with the store's error
                continue
            if cleaned is queued.span:
                continue
            queued.span = cleaned
            self.repaired += 1
            self._logger.warning(
                "The store rejected %s (%s: %s); writing it again with U+FFFD for the lone surrogates in its text.",
                queued.item.describe(),
                type(exc).__name__,
                exc,
            )
            return True
        return False

    def _stored(self, queued: _Queued, stored: Optional[Span]) -> None:
        queued.written = True
        queued.stored = stored
        self.written += 1

    def _give_up(self, queued: _Queued, exc: BaseException, *, log: bool = True) -> None:
        queued.written = True
        queued.stored = None
        self.failed += 1
        if log:
            self._logger.warning(
                "The store rejected %s (%s: %s); giving it up (%d span(s) given up so far).",
                queued.item.describe(),
                type(exc).__name__,
                exc,
                self.failed,
            )

    def _complete(self, batch: Sequence[_Queued]) -> None:
        with self._lock:
            for queued in batch:
                if self._pending and self._pending[0] is queued:
                    self._pending.popleft()
                    self._completed += 1
            room = len(self._pending) < self.max_buffered
            dropped_while_full = self._dropped_while_full if room else 0
            if room:
                self._dropped_while_full = 0
        for queued in batch:
            self._finish(queued.item, queued.stored if queued.written else None)
        if dropped_while_full > 1:
            self._logger.warning(
                "Span buffer has room again; %d span(s) were dropped while it was full.", dropped_while_full
            )
        self._release_waiters()

    def _finish(self, item: PendingSpan, stored: Optional[Span]) -> None:
        try:
            item.completed(stored)
        except Exception:
            self._logger.exception("Completion callback of %s failed", item.describe())

    def _enter_outage(self, exc: BaseException) -> None:
        if self._outage_since is not None:
            return
        self._outage_since = time.monotonic()
        self._logger.warning(
            "Cannot write spans to the store (%s: %s); buffering them (%d waiting, at most %d) and retrying.",
            type(exc).__name__,
            exc,
            self.queued,
            self.max_buffered,
        )

    def _leave_outage(self) -> None:
        if self._outage_since is None:
            return
        seconds = time.monotonic() - self._outage_since
        self._outage_since = None
        self._logger.warning(
            "Store reachable again after %.1f s; writing the %d buffered span(s).", seconds, self.queued
        )

    def __repr__(self) -> str:
        stats: Dict[str, Any] = self.stats()
        return f"SpanWriter({type(self.store).__name__}, {stats})"
