"""LitAgentRunner: dequeues rollouts, runs the agent under a tracer, and records the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Literal, Optional, Sequence, TypeVar, Union, cast

from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.semconv import AGL_EXCEPTION
from agentbolt.tracer.dummy import DummyTracer
from agentbolt.tracer.otel import OtelTracer
from agentbolt.types import (
    AttemptedRollout,
    Hook,
    NamedResources,
    Rollout,
    RolloutMode,
    RolloutRawResult,
    Span,
    SpanCoreFields,
    TraceStatus,
)
from agentbolt.utils.otel import format_exception_attributes
from agentbolt.utils.system_snapshot import system_snapshot

from .base import Runner
from .metrics import RunnerMetrics, runner_metrics

if TYPE_CHECKING:
    from agentbolt.execution.events import ExecutionEvent
    from agentbolt.litagent import LitAgent
    from agentbolt.store.base import LightningStore
    from agentbolt.tracer.base import Tracer

__all__ = ["LitAgentRunner"]

logger = logging.getLogger("agentbolt.runner.agent")

T_task = TypeVar("T_task")


class LitAgentRunner(Runner[T_task]):
    """The standard runner for :class:`~agentbolt.litagent.LitAgent` agents.

    Args:
        tracer: Tracer recording the agent's spans into the store.
        max_rollouts: Stop :meth:`iter` after this many rollouts (None: until the stop event).
        poll_interval: Seconds between polls of an empty queue (with jitter).
        heartbeat_interval: Seconds between worker heartbeats (<= 0 disables them).
        interval_jitter: Maximum random jitter added to or removed from the intervals, in seconds (at most half of
            the interval).
        heartbeat_launch_mode: ``"thread"`` (a background thread schedules heartbeats) or ``"asyncio"`` (a task).
        heartbeat_include_gpu: Include GPU statistics in heartbeats.
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
    ) -> None:
        super().__init__()
        if heartbeat_launch_mode not in ("asyncio", "thread"):
            raise ValueError(f"heartbeat_launch_mode must be 'thread' or 'asyncio', got {heartbeat_launch_mode!r}")
        self._tracer = tracer
        self._max_rollouts = max_rollouts
        self._poll_interval = poll_interval
        self._heartbeat_interval = heartbeat_interval
        self._interval_jitter = interval_jitter
        self._heartbeat_launch_mode = heartbeat_launch_mode
        self._heartbeat_include_gpu = heartbeat_include_gpu
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
        """Bind this worker to ``store`` and initialise the tracer for it."""
        self._store = store
        self.worker_id = worker_id
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
        # A blocking agent runs in a worker thread so heartbeats and the event loop keep going.
        return await asyncio.to_thread(sync_method, rollout.input, resources=resources, rollout=rollout)

    async def _step_impl(self, next_rollout: AttemptedRollout, raise_on_exception: bool = False) -> str:
        """Run the agent on one claimed rollout and record the attempt's outcome; returns the rollout id."""
        store = self.get_store()
        agent = self.get_agent()
        rollout_id = next_rollout.rollout_id
        resources_update = (
            await store.get_resources_by_id(next_rollout.resources_id)
            if next_rollout.resources_id
            else await store.get_latest_resources()
        )
        if resources_update is None:
            message = f"[Rollout {rollout_id}] No resources found (resources_id={next_rollout.resources_id!r})."
            if raise_on_exception:
                raise RuntimeError(message)
            logger.error(message)
            return rollout_id

        spans: Union[List[ReadableSpan], List[Span]] = []
        error: Optional[BaseException] = None
        started = time.perf_counter()
        await self._call_hooks("on_rollout_start", agent=agent, runner=self, rollout=next_rollout)
        try:
            async with self._tracer.trace_context(
                name=rollout_id, rollout_id=rollout_id, attempt_id=next_rollout.attempt.attempt_id
            ):
                await self._call_hooks(
                    "on_trace_start", agent=agent, runner=self, tracer=self._tracer, rollout=next_rollout
                )
                raw_result = await self._invoke_agent(agent, next_rollout, resources_update.resources)
                await self._call_hooks(
                    "on_trace_end", agent=agent, runner=self, tracer=self._tracer, rollout=next_rollout
                )
            spans = await self._post_process_rollout_result(next_rollout, raw_result)
        except BaseException as exc:
            error = exc
            logger.exception("[Rollout %s] Agent raised %s", rollout_id, type(exc).__name__)
            await self._record_exception(next_rollout, exc)
            if raise_on_exception or not isinstance(exc, Exception):
                raise
        finally:
            await self._call_hooks("on_rollout_end", agent=agent, runner=self, rollout=next_rollout, spans=spans)
            try:
                await store.update_attempt(
                    rollout_id, next_rollout.attempt.attempt_id, status="failed" if error is not None else "succeeded"
                )
            except Exception:
                logger.exception("[Rollout %s] Could not record the attempt's outcome", rollout_id)
            metrics = self._metrics
            if metrics is not None:
                status = "failed" if error is not None else "succeeded"
                await metrics.record(status, next_rollout.mode, time.perf_counter() - started)
        return rollout_id

    async def _record_exception(self, rollout: AttemptedRollout, exc: BaseException) -> None:
        """Store an ``agentlightning.exception`` span describing why the attempt failed."""
        core = DummyTracer().create_span(
            name=AGL_EXCEPTION,
            attributes=format_exception_attributes(exc),
            status=TraceStatus(status_code="ERROR", description=str(exc)),
        )
        await self._store_core_spans(rollout, [core])

    async def _store_core_spans(self, rollout: AttemptedRollout, cores: Sequence[SpanCoreFields]) -> List[Span]:
        # The store issues the sequence ids (the placeholder 0 is replaced) and stores the spans in one call.
        spans = [
            Span.from_core_fields(
                core, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, sequence_id=0
            )
            for core in cores
        ]
        try:
            return list(await self.get_store().add_spans_with_new_sequence_ids(spans))
        except Exception:
            logger.exception("[Rollout %s] Could not store %d spans", rollout.rollout_id, len(spans))
            return []

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

    async def _emit_heartbeat(self, store: LightningStore) -> None:
        """Send one heartbeat with a system snapshot; bounded by the heartbeat interval, never raises."""
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
            await asyncio.wait_for(store.update_worker(self.get_worker_id(), snapshot), timeout=timeout)
        except Exception as exc:
            logger.warning("Heartbeat of %s failed: %s", self.get_worker_id(), exc)

    def _start_heartbeat_loop(self, store: LightningStore) -> Optional[Callable[[], Awaitable[None]]]:
        """Start sending heartbeats; returns an async function that stops them (None when disabled)."""
        if self._heartbeat_interval <= 0 or self.worker_id is None:
            return None
        if self._heartbeat_launch_mode == "asyncio":
            stop = asyncio.Event()

            async def loop() -> None:
                while not stop.is_set():
                    await self._emit_heartbeat(store)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=self._jittered(self._heartbeat_interval))

            task = asyncio.create_task(loop(), name=f"heartbeat-{self.get_worker_id()}")

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

            def run() -> None:
                # Snapshots are taken in this thread; the store is only ever used from its own event loop.
                while not stop_flag.is_set():
                    future = asyncio.run_coroutine_threadsafe(self._emit_heartbeat(store), main_loop)
                    try:
                        future.result(timeout=2 * self._heartbeat_interval + 1)
                    except Exception as exc:  # the loop is gone or too busy to answer in time
                        future.cancel()
                        logger.debug("Heartbeat of %s skipped: %r", self.get_worker_id(), exc)
                    stop_flag.wait(self._jittered(self._heartbeat_interval))

            thread = threading.Thread(target=run, name=f"heartbeat-{self.get_worker_id()}", daemon=True)
            thread.start()

            async def stop_thread() -> None:
                stop_flag.set()

            return stop_thread
        raise ValueError(f"Unknown heartbeat_launch_mode {self._heartbeat_launch_mode!r}; use 'thread' or 'asyncio'.")

    # ------------------------------------------------------------------ loops

    async def _sleep_until_next_poll(self, event: Optional[ExecutionEvent] = None) -> None:
        """Sleep about ``poll_interval`` seconds, returning early when ``event`` is set."""
        deadline = time.monotonic() + self._jittered(self._poll_interval)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (event is not None and event.is_set()):
                return
            await asyncio.sleep(min(0.1, remaining))

    async def iter(self, *, event: Optional[ExecutionEvent] = None) -> None:
        """Serve the store's queue until ``event`` is set or ``max_rollouts`` rollouts have run."""
        store = self.get_store()
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
                    try:
                        next_rollout = await store.dequeue_rollout(worker_id=self.get_worker_id())
                    except Exception as exc:
                        logger.warning("%s could not dequeue: %s", self.get_worker_id(), exc)
                    if next_rollout is None:
                        await self._sleep_until_next_poll(event)
                try:
                    await self._step_impl(next_rollout)
                except Exception:
                    logger.exception("[Rollout %s] Runner step failed", next_rollout.rollout_id)
                completed += 1
        finally:
            if stop_heartbeat is not None:
                await stop_heartbeat()

    async def step(
        self,
        input: T_task,
        *,
        resources: Optional[NamedResources] = None,
        mode: Optional[RolloutMode] = None,
        event: Optional[ExecutionEvent] = None,
    ) -> Rollout:
        """Run the agent once on ``input`` (outside the queue) and return the finished rollout."""
        store = self.get_store()
        resources_id = (await store.add_resources(resources)).resources_id if resources is not None else None
        attempted = await store.start_rollout(
            input=input, mode=mode, resources_id=resources_id, worker_id=self.get_worker_id()
        )
        await self._step_impl(attempted, raise_on_exception=True)
        finished = await store.get_rollout_by_id(attempted.rollout_id)
        if finished is None:
            raise RuntimeError(f"Rollout {attempted.rollout_id} disappeared from the store")
        return finished
