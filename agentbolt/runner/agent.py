"""LitAgentRunner: dequeues rollouts, runs the agent under a tracer, and records the outcome."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Deque,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    cast,
)

from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.semconv import AGL_EXCEPTION
from agentbolt.store.base import MAX_QUEUE_WAIT_SECONDS, is_finished
from agentbolt.store.outage import (
    DEFAULT_STORE_OUTAGE_TIMEOUT,
    StoreUnreachableError,
    ride_out_outages,
    without_retries,
)
from agentbolt.tracer.base import Tracer
from agentbolt.tracer.dummy import DummyTracer
from agentbolt.tracer.otel import OtelTracer
from agentbolt.types import (
    AttemptedRollout,
    AttemptStatus,
    Hook,
    NamedResources,
    Rollout,
    RolloutMode,
    RolloutRawResult,
    Span,
    SpanCoreFields,
    TraceStatus,
)
from agentbolt.utils.checks import check_count, check_positive
from agentbolt.utils.otel import format_exception_attributes
from agentbolt.utils.system_snapshot import system_snapshot

from .base import Runner
from .metrics import RunnerMetrics, runner_metrics

if TYPE_CHECKING:
    from agentbolt.execution.events import ExecutionEvent
    from agentbolt.litagent import LitAgent
    from agentbolt.store.base import LightningStore

__all__ = ["TRAINING_POLL_INTERVAL", "LitAgentRunner"]

TRAINING_POLL_INTERVAL = 1.0
"""A ``poll_interval`` for runners whose store is served by a process that also trains or serves the model.

An idle runner waits on the store's queue (``wait_for_queued_rollouts``), which wakes it as soon as the algorithm
queues rollouts, so the interval bounds how often an idle runner asks (a dequeue and a wait per interval), not how
long a step waits for its first rollouts. Polling 20 times a second, eight idle runners kept the store's server and
SQLite writer threads busy with a fifth of a core (measured per thread) beside an update that used 1.3 on 2 cores.
"""

logger = logging.getLogger("agentbolt.runner.agent")

T_task = TypeVar("T_task")
T_result = TypeVar("T_result")


async def _run_in_daemon_thread(name: str, func: Callable[..., T_result], *args: Any, **kwargs: Any) -> T_result:
    """Call ``func`` in a new daemon thread, in a copy of the current context (as ``asyncio.to_thread`` does).

    Unlike ``asyncio.to_thread``, the thread is not one of the event loop's default executor: ``asyncio.run`` does
    not wait for it when it shuts the loop down, nor does the interpreter when it exits. A caller that is cancelled
    returns at once; the call runs to its end in the background, or dies with the process.

    Args:
        name: The thread's name.
        func: The function to call; ``args`` and ``kwargs`` are passed to it.

    Returns:
        What ``func`` returned; what it raised is raised.
    """
    context = contextvars.copy_context()
    future: concurrent.futures.Future[T_result] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = context.run(func, *args, **kwargs)
        except BaseException as exc:  # handed to the awaiting coroutine, as asyncio.to_thread does
            future.set_exception(exc)
        else:
            future.set_result(result)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        if thread.is_alive():
            logger.warning("Cancelled while thread %s was still running; it is left to finish in the background.", name)
        raise


STOPPING_WRITE_TIMEOUT = 5.0
"""Seconds each of a stopping runner's last writes (an interrupted attempt's outcome) may take at most.

Those writes are sent once (see :func:`~agentbolt.store.outage.without_retries`); the bound also covers a store that
accepts connections but does not answer (paused).
"""

_ENDED_ATTEMPT_STATUSES: Tuple[AttemptStatus, ...] = ("failed", "succeeded", "timeout")
"""Attempt statuses after which the store no longer takes the attempt's outcome into account.

``unresponsive`` is not among them: an attempt that sends a span again is running again (the store recovers it).
"""


class _RolloutEndedElsewhere(Exception):
    """The store ended the attempt while its agent ran; the message says how."""


def _retrieve_outcome(task: asyncio.Task[Any]) -> None:
    """Read what an abandoned agent task ended with, so that asyncio does not report it as never retrieved."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("An abandoned agent task ended with %r", task.exception())


@dataclass
class _StoreWrite:
    """A write a rollout's record needs (a span, the attempt's outcome), kept while the store is unreachable."""

    rollout_id: str
    what: str
    write: Callable[[], Awaitable[Any]]


def _runner_task_cancelled() -> bool:
    """Whether the running task is being cancelled, as a stopping runner's is (Python 3.10 cannot tell: yes).

    A ``CancelledError`` that the agent's own code raises or lets through (a task of its own it cancelled and
    awaited) reaches the runner too, while its task is not being cancelled.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


class LitAgentRunner(Runner[T_task]):
    """The standard runner for :class:`~agentbolt.litagent.LitAgent` agents.

    While an agent runs, the runner reads its rollout from the store every ``heartbeat_interval`` seconds. Once the
    store no longer waits for this attempt's outcome (the rollout was cancelled, failed or succeeded by someone
    else, a newer attempt superseded this one, or the watchdog timed it out or failed it), the runner cancels the
    agent, logs a warning, writes no outcome for the attempt (the store keeps the status it holds) and goes on with
    the next rollout. A synchronous agent's thread cannot be stopped: it runs on in the background until it returns,
    and what it returns is dropped.

    Args:
        tracer: Tracer recording the agent's spans into the store.
        max_rollouts: Stop :meth:`iter` after this many rollouts (None: until the stop event).
        poll_interval: Seconds between polls of an empty queue (with jitter).
        heartbeat_interval: Seconds between worker heartbeats, and between the reads of a running rollout's status
            (with jitter; <= 0 disables both).
        interval_jitter: Maximum random jitter added to or removed from the intervals, in seconds (at most half of
            the interval).
        heartbeat_launch_mode: ``"thread"`` (a background thread schedules heartbeats) or ``"asyncio"`` (a task).
        heartbeat_include_gpu: Include GPU statistics in heartbeats.
        store_outage_timeout: Seconds each store call made for a rollout (fetching its resources, storing its spans,
            recording its outcome) keeps retrying while the store is unreachable, before the rollout fails with a
            logged error (see :func:`~agentbolt.store.outage.ride_out_outages`). A write that still fails is kept
            and made when the store is back, before the runner claims another rollout. ``None`` or ``0``: the
            store client's own retry policy only.

    Stopping: once the runner is asked to stop (Ctrl-C, or its task cancelled), it no longer rides out store outages.
    The interrupted attempt's outcome (and the writes kept from an earlier outage) are sent once each, bounded by
    :data:`STOPPING_WRITE_TIMEOUT`; what the store could not take is reported in one error line. The tracer stops
    retrying too: spans the store cannot take are given up and counted in one warning (see
    :meth:`~agentbolt.tracer.otel.OtelTracer.stop_retrying`). While the store is unreachable and the runner is idle,
    it keeps polling every ``poll_interval`` (and sending heartbeats); the outage is logged when it starts and when it
    ends, the failed calls in between at DEBUG level.
    """

    def __init__(
        self,
        tracer: Tracer,
        max_rollouts: Optional[int] = None,
        poll_interval: float = 5.0,
        heartbeat_interval: float = 10.0,
        interval_jitter: float = 0.5,
        heartbeat_launch_mode: Literal["asyncio", "thread"] = "thread",
        heartbeat_include_gpu: bool = False,
        store_outage_timeout: Optional[float] = DEFAULT_STORE_OUTAGE_TIMEOUT,
    ) -> None:
        super().__init__()
        if heartbeat_launch_mode not in ("asyncio", "thread"):
            raise ValueError(f"heartbeat_launch_mode must be 'thread' or 'asyncio', got {heartbeat_launch_mode!r}")
        if store_outage_timeout is not None and not store_outage_timeout >= 0:
            raise ValueError(f"store_outage_timeout must be None or at least 0 seconds, got {store_outage_timeout!r}")
        if not isinstance(tracer, Tracer):
            raise TypeError(f"tracer must be a Tracer (e.g. agl.OtelTracer()), got {type(tracer).__name__}")
        check_count(max_rollouts, "max_rollouts", optional=True)
        check_positive(poll_interval, "poll_interval")
        self._tracer = tracer
        self._max_rollouts = max_rollouts
        self._poll_interval = poll_interval
        self._heartbeat_interval = heartbeat_interval
        self._interval_jitter = interval_jitter
        self._heartbeat_launch_mode = heartbeat_launch_mode
        self._heartbeat_include_gpu = heartbeat_include_gpu
        self._store_outage_timeout = store_outage_timeout
        self._unwritten: Deque[_StoreWrite] = deque()
        self._claim_in_doubt = False
        self._stopping = False
        self._heartbeat_failing = False
        self._hooks: List[Hook] = []
        self._agent: Optional[LitAgent[T_task]] = None
        self._store: Optional[LightningStore] = None
        self.worker_id: Optional[int] = None
        self._metrics: Optional[RunnerMetrics] = None

    # ------------------------------------------------------------------ lifecycle

    def init(self, agent: LitAgent[T_task], *, hooks: Optional[Sequence[Hook]] = None, **kwargs: Any) -> None:
        """Attach ``agent`` and ``hooks`` and initialise the tracer."""
        self._agent = agent
        agent.set_runner(self)
        self._hooks = list(hooks or [])
        self._tracer.init()

    def init_worker(self, worker_id: int, store: LightningStore, **kwargs: Any) -> None:  # type: ignore[override]
        """Bind this worker to ``store`` and initialise the tracer for it.

        The worker's own state starts afresh: runners of the shared-memory strategy are copies of one runner, and
        each keeps its own writes for the store (during an outage) and knows its own claims.
        """
        self._store = store
        self.worker_id = worker_id
        self._unwritten = deque()
        self._claim_in_doubt = False
        self._stopping = False
        self._heartbeat_failing = False
        self._tracer.init_worker(worker_id, store)
        self._metrics = runner_metrics()

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        """Detach the agent and store and tear the tracer down."""
        self._agent = None
        self._store = None
        self.worker_id = None
        self._hooks = []
        self._tracer.teardown()

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        """Tear down the tracer's worker state."""
        self.worker_id = None
        self._tracer.teardown_worker(worker_id)

    @property
    def tracer(self) -> Tracer:
        """The tracer recording the agent's spans."""
        return self._tracer

    def get_agent(self) -> LitAgent[T_task]:
        """The agent; ``ValueError`` before :meth:`init`."""
        if self._agent is None:
            raise ValueError("Agent not initialized. Call init() first.")
        return self._agent

    def get_store(self) -> LightningStore:
        """The store; ``ValueError`` before :meth:`init_worker`."""
        if self._store is None:
            raise ValueError("Store not initialized. Call init_worker() first.")
        return self._store

    def get_worker_id(self) -> str:
        """``"Worker-<id>"`` as recorded in the store."""
        return f"Worker-{self.worker_id}" if self.worker_id is not None else "Worker-Unknown"

    # ------------------------------------------------------------------ hooks

    async def _call_hooks(self, name: str, **kwargs: Any) -> None:
        for hook in self._hooks:
            try:
                await getattr(hook, name)(**kwargs)
            except Exception:
                logger.exception("%s hook %s failed", name, type(hook).__name__)

    # ------------------------------------------------------------------ one rollout

    async def _invoke_agent(
        self, agent: LitAgent[T_task], rollout: AttemptedRollout, resources: NamedResources
    ) -> RolloutRawResult:
        train = rollout.mode == "train"
        if agent.is_async():
            method = agent.training_rollout_async if train else agent.validation_rollout_async
            return await method(rollout.input, resources=resources, rollout=rollout)
        sync_method: Callable[..., RolloutRawResult] = agent.training_rollout if train else agent.validation_rollout
        # A blocking agent runs in a thread of its own so heartbeats and the event loop keep going, and so that a
        # stop or Ctrl-C that cancels the rollout is not held up until the agent returns.
        return await _run_in_daemon_thread(
            f"rollout-{rollout.rollout_id}", sync_method, rollout.input, resources=resources, rollout=rollout
        )

    async def _invoke_agent_watched(
        self, agent: LitAgent[T_task], rollout: AttemptedRollout, resources: NamedResources
    ) -> RolloutRawResult:
        """Run the agent while watching, every heartbeat interval, that the store still waits for its outcome.

        Raises:
            _RolloutEndedElsewhere: The store ended the attempt; the agent was cancelled.
        """
        if self._heartbeat_interval <= 0:
            return await self._invoke_agent(agent, rollout, resources)
        running = asyncio.create_task(self._invoke_agent(agent, rollout, resources), name=f"agent-{rollout.rollout_id}")
        watching = asyncio.create_task(
            self._wait_until_attempt_ended(self.get_store(), rollout), name=f"watch-{rollout.rollout_id}"
        )
        try:
            await asyncio.wait({running, watching}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the runner is stopped: the agent is cancelled, as when it was awaited directly
            watching.cancel()
            running.cancel()
            await asyncio.wait({running})
            raise
        if running.done():  # an outcome that came with the verdict is recorded: the store's rules then apply
            watching.cancel()
            return running.result()
        reason = watching.result()
        running.cancel()
        # An async agent stops at its next await (a sync agent's call returns at once, its thread goes on).
        await asyncio.wait({running}, timeout=max(self._heartbeat_interval, 0.1))
        if running.done():
            _retrieve_outcome(running)
        else:
            logger.warning(
                "[Rollout %s] The agent did not stop when cancelled; it is left to run in the background.",
                rollout.rollout_id,
            )
            running.add_done_callback(_retrieve_outcome)
        raise _RolloutEndedElsewhere(reason)

    async def _wait_until_attempt_ended(self, store: LightningStore, rollout: AttemptedRollout) -> str:
        """Read the rollout every heartbeat interval; return why, once the store no longer waits for the attempt.

        A read that fails or does not answer within the interval is skipped: the agent goes on.
        """
        timeout = max(self._heartbeat_interval, 0.1)
        while True:
            await asyncio.sleep(self._jittered(self._heartbeat_interval))
            try:
                with ride_out_outages(None):  # an unreachable store is asked again at the next interval
                    reason = await asyncio.wait_for(self._why_attempt_ended(store, rollout), timeout=timeout)
            except Exception as exc:
                logger.debug("[Rollout %s] Could not read its status: %r", rollout.rollout_id, exc)
                continue
            if reason is not None:
                return reason

    async def _why_attempt_ended(self, store: LightningStore, rollout: AttemptedRollout) -> Optional[str]:
        """Why the store no longer waits for this attempt's outcome; None while it does, or cannot tell.

        One read: the rollout comes with its latest attempt.
        """
        current = await store.get_rollout_by_id(rollout.rollout_id)
        if current is None:  # over HTTP also the answer to a failed read: no verdict
            return None
        latest = current.attempt if isinstance(current, AttemptedRollout) else None
        if latest is not None and latest.attempt_id != rollout.attempt.attempt_id:
            return f"attempt {latest.attempt_id} superseded it (rollout {current.status})"
        if latest is not None and latest.status in _ENDED_ATTEMPT_STATUSES:
            return f"the store marked the attempt {latest.status} (rollout {current.status})"
        if is_finished(current):
            return f"the store marked the rollout {current.status}"
        return None

    async def _step_impl(self, next_rollout: AttemptedRollout, raise_on_exception: bool = False) -> str:
        """Run the agent on one claimed rollout and record the attempt's outcome; returns the rollout id.

        Every store call made for the rollout rides out a store outage of up to ``store_outage_timeout`` seconds.
        """
        with ride_out_outages(self._store_outage_timeout):
            return await self._run_rollout(next_rollout, raise_on_exception)

    async def _run_rollout(self, next_rollout: AttemptedRollout, raise_on_exception: bool) -> str:
        store = self.get_store()
        agent = self.get_agent()
        rollout_id = next_rollout.rollout_id
        started = time.perf_counter()
        try:
            resources_update = (
                await store.get_resources_by_id(next_rollout.resources_id)
                if next_rollout.resources_id
                else await store.get_latest_resources()
            )
        except Exception as exc:  # the store stayed unreachable for longer than the runner rides out
            logger.error("[Rollout %s] Could not fetch its resources (%s); the attempt fails.", rollout_id, exc)
            await self._finish_attempt(next_rollout, exc, started)
            if raise_on_exception:
                raise
            return rollout_id
        if resources_update is None:
            message = (
                f"[Rollout {rollout_id}] No resources found (resources_id={next_rollout.resources_id!r}); the attempt "
                "is left as it is. The algorithm must store resources before its rollouts run (with a Trainer: "
                "initial_resources, an empty dict if the agent needs none)."
            )
            if raise_on_exception:
                raise RuntimeError(message)
            logger.error(message)
            return rollout_id

        spans: Union[List[ReadableSpan], List[Span]] = []
        error: Optional[BaseException] = None
        ended_elsewhere = False
        await self._call_hooks("on_rollout_start", agent=agent, runner=self, rollout=next_rollout)
        try:
            async with self._tracer.trace_context(
                name=rollout_id, rollout_id=rollout_id, attempt_id=next_rollout.attempt.attempt_id
            ):
                await self._call_hooks(
                    "on_trace_start", agent=agent, runner=self, tracer=self._tracer, rollout=next_rollout
                )
                raw_result = await self._invoke_agent_watched(agent, next_rollout, resources_update.resources)
                await self._call_hooks(
                    "on_trace_end", agent=agent, runner=self, tracer=self._tracer, rollout=next_rollout
                )
            spans = await self._post_process_rollout_result(next_rollout, raw_result)
        except _RolloutEndedElsewhere as exc:
            ended_elsewhere = True
            logger.warning(
                "[Rollout %s] Attempt %s ended while its agent ran: %s. The agent was cancelled; the attempt's "
                "outcome is not recorded.",
                rollout_id,
                next_rollout.attempt.attempt_id,
                exc,
            )
        except BaseException as exc:
            error = exc
            stopped = isinstance(exc, KeyboardInterrupt) or (
                isinstance(exc, asyncio.CancelledError) and _runner_task_cancelled()
            )
            if stopped:  # the runner is stopping, as asked
                self._stopping = True  # the attempt's outcome is sent once (see _write)
                logger.info("[Rollout %s] The agent was stopped (%s)", rollout_id, type(exc).__name__)
            else:  # a CancelledError of the agent's own (a task of its cancelled) fails the attempt like any error
                logger.exception("[Rollout %s] Agent raised %s", rollout_id, type(exc).__name__)
            if raise_on_exception or stopped or not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            await self._call_hooks("on_rollout_end", agent=agent, runner=self, rollout=next_rollout, spans=spans)
            if not ended_elsewhere:
                await self._finish_attempt(next_rollout, error, started)
        return rollout_id

    async def _finish_attempt(self, rollout: AttemptedRollout, error: Optional[BaseException], started: float) -> None:
        """Record the attempt's outcome (after an ``agentlightning.exception`` span when it failed) and count it."""
        status: Literal["failed", "succeeded"] = "failed" if error is not None else "succeeded"
        if error is not None:
            await self._record_exception(rollout, error)
        store = self.get_store()
        await self._write_or_keep(
            rollout.rollout_id,
            f"the attempt's outcome ({status})",
            lambda: store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status=status),
        )
        metrics = self._metrics
        if metrics is not None:
            await metrics.record(status, rollout.mode, time.perf_counter() - started)

    async def _record_exception(self, rollout: AttemptedRollout, exc: BaseException) -> None:
        """Store an ``agentlightning.exception`` span describing why the attempt failed."""
        core = DummyTracer().create_span(
            name=AGL_EXCEPTION,
            attributes=format_exception_attributes(exc),
            status=TraceStatus(status_code="ERROR", description=str(exc)),
        )
        await self._store_core_spans(rollout, [core])

    async def _store_core_spans(self, rollout: AttemptedRollout, cores: Sequence[SpanCoreFields]) -> List[Span]:
        # The store issues the sequence ids (the placeholder 0 is replaced) and stores the spans in one call; the
        # call is safe to repeat (the store skips spans it already holds), so it may be kept for later.
        spans = [
            Span.from_core_fields(
                core, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, sequence_id=0
            )
            for core in cores
        ]
        store = self.get_store()
        stored = await self._write_or_keep(
            rollout.rollout_id, f"{len(spans)} spans", lambda: store.add_spans_with_new_sequence_ids(spans)
        )
        return list(stored) if stored is not None else []

    # ------------------------------------------------------------------ writes kept through an outage

    async def _write_or_keep(self, rollout_id: str, what: str, write: Callable[[], Awaitable[Any]]) -> Any:
        """Make a write the rollout's record needs; keep it for later when the store cannot be reached.

        Writes reach the store in the order they were made: while earlier ones are kept, a new one is kept behind
        them. Kept writes are made by :meth:`_write_kept`.

        Returns:
            What the write returned; None when it was kept, or when the store rejected it (logged).
        """
        if not self._unwritten:
            try:
                return await self._write(write)
            except StoreUnreachableError as exc:
                reason = str(exc)
            except Exception:
                logger.exception("[Rollout %s] Could not write %s", rollout_id, what)
                return None
        else:
            reason = f"{len(self._unwritten)} earlier writes are waiting for the store"
        if not self._stopping:  # a stopping runner reports what it could not write once, when it stops
            logger.error(
                "[Rollout %s] Could not write %s: %s; it is written once the store is back.", rollout_id, what, reason
            )
        self._unwritten.append(_StoreWrite(rollout_id, what, write))
        return None

    async def _write(self, write: Callable[[], Awaitable[Any]]) -> Any:
        """Make one write: as the current context says, or once and bounded when the runner is stopping.

        Raises:
            StoreUnreachableError: The store could not take the write (while stopping: did not answer in time).
        """
        if not self._stopping:
            return await write()
        with without_retries():
            try:
                return await asyncio.wait_for(write(), timeout=STOPPING_WRITE_TIMEOUT)
            except asyncio.TimeoutError as exc:
                raise StoreUnreachableError(f"no answer within {STOPPING_WRITE_TIMEOUT:g} s") from exc

    async def _write_kept(self) -> bool:
        """Make the writes kept during an outage, oldest first; whether none is left.

        Stops at the first write the store still cannot take (:class:`StoreUnreachableError`, so call this inside
        :func:`ride_out_outages`); a write failing otherwise is logged and dropped.
        """
        while self._unwritten:
            kept = self._unwritten[0]
            try:
                await self._write(kept.write)
            except StoreUnreachableError:
                return False
            except Exception:
                logger.exception("[Rollout %s] Could not write %s", kept.rollout_id, kept.what)
            else:
                logger.info("[Rollout %s] Wrote %s now that the store is back.", kept.rollout_id, kept.what)
            self._unwritten.popleft()
        return True

    async def _write_kept_before_stopping(self) -> None:
        """Give the kept writes one last bounded chance; log those the store still could not take, in one line.

        Stopped by the stop event, the runner rides out an outage of up to ``store_outage_timeout`` seconds for
        them; asked to stop (Ctrl-C), it sends each once (see :meth:`_write`).
        """
        if not self._unwritten:
            return
        with ride_out_outages(self._store_outage_timeout):
            await self._write_kept()
        if self._unwritten:
            logger.error(
                "%s stopped with %d write(s) the store could not take (it is unreachable); they are not written: %s",
                self.get_worker_id(),
                len(self._unwritten),
                "; ".join(f"{kept.what} of rollout {kept.rollout_id}" for kept in self._unwritten),
            )
            self._unwritten.clear()

    async def _post_process_rollout_result(
        self, rollout: AttemptedRollout, raw_result: RolloutRawResult
    ) -> Union[List[ReadableSpan], List[Span]]:
        """Turn what the agent returned into stored spans (a float becomes a reward span)."""
        store = self.get_store()
        if raw_result is None:
            return list(self._tracer.get_last_trace())
        if isinstance(raw_result, (bool, int)) and not isinstance(raw_result, float):
            logger.warning(
                "[Rollout %s] The agent returned %s %r; converting it to a float reward.",
                rollout.rollout_id,
                type(raw_result).__name__,
                raw_result,
            )
            raw_result = float(raw_result)
        if isinstance(raw_result, float):
            from agentbolt.emitter import emit_reward

            spans = list(self._tracer.get_last_trace())
            await self._store_core_spans(rollout, [emit_reward(raw_result, propagate=False)])
            return spans
        if inspect.iscoroutine(raw_result):
            raw_result.close()  # never awaited: closed, so that Python does not warn about it later
            raise TypeError(
                f"{type(self.get_agent()).__name__}'s rollout returned a coroutine: a LitAgent's coroutine methods are "
                "named rollout_async, training_rollout_async or validation_rollout_async (the runner awaits only "
                "those); rollout, training_rollout and validation_rollout are synchronous"
            )
        if not isinstance(raw_result, list):
            raise TypeError(
                f"A rollout must return None, a float reward or a list of spans; got {type(raw_result).__name__}"
            )
        if not raw_result:
            logger.warning("[Rollout %s] The agent returned an empty list of spans.", rollout.rollout_id)
            return []
        if all(isinstance(item, ReadableSpan) for item in raw_result):
            if isinstance(self._tracer, OtelTracer):
                logger.warning(
                    "[Rollout %s] The agent returned OpenTelemetry spans although the tracer already records them; "
                    "they may be stored twice.",
                    rollout.rollout_id,
                )
            stored_otel: List[Span] = []
            for item in raw_result:
                added = await store.add_otel_span(
                    rollout.rollout_id, rollout.attempt.attempt_id, cast(ReadableSpan, item)
                )
                if added is not None:
                    stored_otel.append(added)
            return stored_otel
        if all(isinstance(item, Span) for item in raw_result):
            stored: List[Span] = []
            for item in raw_result:
                added_span = await store.add_span(cast(Span, item))
                if added_span is not None:
                    stored.append(added_span)
            return stored
        if all(isinstance(item, SpanCoreFields) for item in raw_result):
            return await self._store_core_spans(rollout, raw_result)  # type: ignore[arg-type]
        raise ValueError(
            "A list returned by a rollout must contain only ReadableSpan, Span or SpanCoreFields items; got "
            + ", ".join(sorted({type(item).__name__ for item in raw_result}))
        )

    # ------------------------------------------------------------------ heartbeats

    def _jittered(self, interval: float) -> float:
        """``interval`` plus or minus the jitter, which is capped at half the interval.

        Without the cap a short poll interval (say 0.05 s with the default 0.5 s jitter) would mostly come out as
        the minimum, and idle runners would poll the store far more often than asked.
        """
        jitter = min(self._interval_jitter, interval / 2)
        return max(0.01, interval + random.uniform(-jitter, jitter))

    async def _emit_heartbeat(self, store: LightningStore, worker_id: str) -> None:
        """Send one heartbeat of ``worker_id`` (taken when the heartbeats started: a heartbeat still on its way
        when the worker is torn down must not report for no worker) with a system snapshot; bounded by the
        heartbeat interval, never raises."""
        timeout = max(self._heartbeat_interval, 0.1)
        try:
            snapshot = await asyncio.wait_for(
                asyncio.to_thread(system_snapshot, self._heartbeat_include_gpu), timeout=timeout
            )
        except asyncio.TimeoutError:
            logger.debug("System snapshot took longer than %.1f s; skipping this heartbeat", timeout)
            return
        except Exception:
            logger.exception("System snapshot failed")
            return
        try:
            await asyncio.wait_for(store.update_worker(worker_id, snapshot), timeout=timeout)
        except Exception as exc:
            # One warning per spell of failures (a store that is down fails every heartbeat until it is back).
            level = logging.DEBUG if self._heartbeat_failing else logging.WARNING
            self._heartbeat_failing = True
            logger.log(level, "Heartbeat of %s failed: %s", worker_id, str(exc) or repr(exc))
            return
        if self._heartbeat_failing:
            self._heartbeat_failing = False
            logger.info("Heartbeats of %s reach the store again", worker_id)

    def _start_heartbeat_loop(self, store: LightningStore) -> Optional[Callable[[], Awaitable[None]]]:
        """Start sending heartbeats; returns an async function that stops them (None when disabled)."""
        if self._heartbeat_interval <= 0 or self.worker_id is None:
            return None
        worker_id = self.get_worker_id()
        if self._heartbeat_launch_mode == "asyncio":
            stop = asyncio.Event()

            async def loop() -> None:
                while not stop.is_set():
                    await self._emit_heartbeat(store, worker_id)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=self._jittered(self._heartbeat_interval))

            task = asyncio.create_task(loop(), name=f"heartbeat-{worker_id}")

            async def stop_asyncio() -> None:
                stop.set()
                try:
                    await asyncio.wait_for(task, timeout=self._heartbeat_interval + 1)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    task.cancel()

            return stop_asyncio
        if self._heartbeat_launch_mode == "thread":
            stop_flag = threading.Event()
            main_loop = asyncio.get_running_loop()
            in_flight: List[concurrent.futures.Future[None]] = []

            def run() -> None:
                # Snapshots are taken in this thread; the store is only ever used from its own event loop.
                while not stop_flag.is_set():
                    future = asyncio.run_coroutine_threadsafe(self._emit_heartbeat(store, worker_id), main_loop)
                    in_flight[:] = [future]
                    try:
                        future.result(timeout=2 * self._heartbeat_interval + 1)
                    except Exception as exc:  # the loop is gone or too busy to answer in time, or the worker stopped
                        future.cancel()
                        logger.debug("Heartbeat of %s skipped: %r", worker_id, exc)
                    stop_flag.wait(self._jittered(self._heartbeat_interval))

            thread = threading.Thread(target=run, name=f"heartbeat-{worker_id}", daemon=True)
            thread.start()

            async def stop_thread() -> None:
                stop_flag.set()
                for future in in_flight:  # a heartbeat on its way is not sent after the worker stopped
                    future.cancel()

            return stop_thread
        raise ValueError(f"Unknown heartbeat_launch_mode {self._heartbeat_launch_mode!r}; use 'thread' or 'asyncio'.")

    # ------------------------------------------------------------------ loops

    async def _sleep_until_next_poll(self, event: Optional[ExecutionEvent] = None) -> None:
        """Sleep about ``poll_interval`` seconds, returning early when ``event`` is set."""
        await self._wait_until_next_poll(event)

    async def _wait_until_next_poll(
        self, event: Optional[ExecutionEvent] = None, store: Optional[LightningStore] = None
    ) -> None:
        """Wait about ``poll_interval`` seconds, returning early when ``event`` is set or, given the ``store`` whose
        queue was just found empty, as soon as it has a rollout queued (``wait_for_queued_rollouts``)."""
        deadline = time.monotonic() + self._jittered(self._poll_interval)
        waiting: Optional[asyncio.Future[bool]] = None
        if store is not None:
            timeout = min(max(deadline - time.monotonic(), 0.0), MAX_QUEUE_WAIT_SECONDS)
            waiting = asyncio.ensure_future(store.wait_for_queued_rollouts(timeout))
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (event is not None and event.is_set()):
                    return
                if waiting is None:
                    await asyncio.sleep(min(0.1, remaining))
                    continue
                await asyncio.wait({waiting}, timeout=min(0.1, remaining))
                if not waiting.done():
                    continue
                error = None if waiting.cancelled() else waiting.exception()
                if error is None:
                    return  # a rollout is queued, or the store's wait ran out
                logger.debug("%s could not wait for queued rollouts: %r", self.get_worker_id(), error)
                waiting = None  # sleep out the interval instead
        finally:
            if waiting is not None and not waiting.done():
                waiting.cancel()
                with contextlib.suppress(BaseException):
                    await waiting

    async def iter(self, *, event: Optional[ExecutionEvent] = None) -> None:
        """Serve the store's queue until ``event`` is set or ``max_rollouts`` rollouts have run."""
        store = self.get_store()
        self._stopping = False
        stop_heartbeat = self._start_heartbeat_loop(store)
        completed = 0
        try:
            while not (event is not None and event.is_set()):
                if self._max_rollouts is not None and completed >= self._max_rollouts:
                    logger.info("%s finished its %d rollouts", self.get_worker_id(), completed)
                    break
                next_rollout = None
                while next_rollout is None:
                    if event is not None and event.is_set():
                        return
                    queue_was_empty = False
                    # No new work while the outcome of earlier work is not in the store yet; waiting for the store
                    # lasts about one poll interval, so that the stop event is still seen.
                    with ride_out_outages(max(self._poll_interval, 0.01)):
                        written = await self._write_kept()
                    if written and self._claim_in_doubt:
                        next_rollout = await self._claim_lost_in_transit(store)
                    if written and not self._claim_in_doubt and next_rollout is None:
                        try:
                            next_rollout = await store.dequeue_rollout(worker_id=self.get_worker_id())
                            queue_was_empty = next_rollout is None
                        except Exception as exc:
                            # The store may have claimed a rollout for this worker and lost the answer on the way.
                            self._claim_in_doubt = True
                            logger.warning("%s could not dequeue: %s", self.get_worker_id(), exc)
                    if next_rollout is None and queue_was_empty:
                        await self._wait_until_next_poll(event, store)
                    elif next_rollout is None:
                        await self._sleep_until_next_poll(event)
                try:
                    await self._step_impl(next_rollout)
                except Exception:
                    logger.exception("[Rollout %s] Runner step failed", next_rollout.rollout_id)
                completed += 1
        except (asyncio.CancelledError, KeyboardInterrupt):
            # Asked to stop: the last writes are sent once, and spans the store cannot take are given up.
            self._stopping = True
            if isinstance(self._tracer, OtelTracer):
                self._tracer.stop_retrying()
            raise
        finally:
            await self._write_kept_before_stopping()
            if stop_heartbeat is not None:
                await stop_heartbeat()

    async def _claim_lost_in_transit(self, store: LightningStore) -> Optional[AttemptedRollout]:
        """After a dequeue that failed on the way: the rollout the store handed this worker anyway, if any.

        A store records a claim on its worker (``current_attempt_id``) in the same transaction as the claim, so when
        the answer was lost (the server killed after committing, the connection dropped), the worker still names an
        attempt that is ``preparing``: this runner never received it, and takes it up now instead of leaving it to
        the store's watchdog. Clears the doubt once the store answered; while it is unreachable, the doubt stays.
        """
        worker_id = self.get_worker_id()
        try:
            # An unreachable store raises here (StoreUnreachableError) instead of answering None.
            with ride_out_outages(max(self._poll_interval, 0.01)):
                worker = await store.get_worker_by_id(worker_id)
                if worker is None or worker.current_rollout_id is None or worker.current_attempt_id is None:
                    self._claim_in_doubt = False
                    return None
                rollout = await store.get_rollout_by_id(worker.current_rollout_id)
                attempt = await store.get_latest_attempt(worker.current_rollout_id)
        except StoreUnreachableError as exc:
            logger.warning("%s will check for a claim lost in transit when the store is back: %s", worker_id, exc)
            return None
        except Exception as exc:  # the store answered (a store without workers, an error): nothing to take up
            self._claim_in_doubt = False
            if not isinstance(exc, NotImplementedError):
                logger.warning("%s could not check for a claim lost in transit: %s", worker_id, exc)
            return None
        self._claim_in_doubt = False
        if (
            rollout is None
            or attempt is None
            or attempt.attempt_id != worker.current_attempt_id
            or attempt.status != "preparing"
        ):
            return None
        logger.warning(
            "%s takes up rollout %s (attempt %s): the store claimed it for this worker, but its answer was lost",
            worker_id,
            rollout.rollout_id,
            attempt.attempt_id,
        )
        return AttemptedRollout(**rollout.model_dump(exclude={"attempt"}), attempt=attempt)

    async def step(
        self,
        input: T_task,
        *,
        resources: Optional[NamedResources] = None,
        mode: Optional[RolloutMode] = None,
        event: Optional[ExecutionEvent] = None,
    ) -> Rollout:
        """Run the agent once on ``input`` (outside the queue) and return the rollout as the store then holds it.

        That is the finished rollout, unless the store ended the attempt while the agent ran (see the class).
        """
        store = self.get_store()
        self._stopping = False
        resources_id = (await store.add_resources(resources)).resources_id if resources is not None else None
        attempted = await store.start_rollout(
            input=input, mode=mode, resources_id=resources_id, worker_id=self.get_worker_id()
        )
        await self._step_impl(attempted, raise_on_exception=True)
        with ride_out_outages(self._store_outage_timeout):
            if not await self._write_kept():
                raise RuntimeError(
                    f"The outcome of rollout {attempted.rollout_id} could not be recorded: the store is unreachable"
                )
        finished = await store.get_rollout_by_id(attempted.rollout_id)
        if finished is None:
            raise RuntimeError(f"Rollout {attempted.rollout_id} disappeared from the store")
        return finished
