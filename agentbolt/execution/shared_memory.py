"""Run the algorithm and the runners as threads of one process, sharing one store object."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, List, Literal, Optional, TypeVar

from agentbolt.tracer.base import untraced
from agentbolt.utils.checks import check_count

from .base import AlgorithmBundle, ExecutionStrategy, RunnerBundle, resolve_managed_store
from .events import ExecutionEvent, ThreadingEvent

__all__ = ["SharedMemoryExecutionStrategy"]

logger = logging.getLogger("agentbolt.execution.shared_memory")

T = TypeVar("T")


@dataclass(eq=False)
class SharedMemoryExecutionStrategy(ExecutionStrategy):
    """Algorithm and runners as threads sharing one store (alias ``"shm"``).

    The run ends when the algorithm returns, or when every runner has returned (e.g. after ``max_rollouts``): the
    algorithm then gets ``graceful_delay`` seconds to return before it is cancelled.

    Args:
        n_runners: Number of runner threads.
        main_thread: Which side runs on the main thread. ``"runner"`` requires exactly one runner.
        join_timeout: Seconds to wait for each thread when shutting down.
        graceful_delay: Seconds a bundle gets to return by itself after the stop event before it is cancelled.
        poll_interval: Seconds between checks of the stop event.
        managed_store: Wrap the store in :class:`~agentbolt.store.threading.LightningStoreThreaded`
            (default from ``AGL_MANAGED_STORE``, else True).
    """

    alias = "shm"

    n_runners: int = 1
    main_thread: Literal["algorithm", "runner"] = "runner"
    join_timeout: float = 15.0
    graceful_delay: float = 5.0
    poll_interval: float = 0.05
    managed_store: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.main_thread not in ("algorithm", "runner"):
            raise ValueError(f"main_thread must be 'algorithm' or 'runner', got {self.main_thread!r}")
        check_count(self.n_runners, "n_runners")
        if self.main_thread == "runner" and self.n_runners != 1:
            raise ValueError(
                f"main_thread='runner' requires n_runners == 1, got {self.n_runners}: the one runner runs in the main "
                "thread; use main_thread='algorithm' for several runner threads"
            )
        self.managed_store = resolve_managed_store(self.managed_store)

    async def _run_until_completed_or_canceled(self, coro: Awaitable[T], stop_evt: ExecutionEvent) -> Optional[T]:
        """Run ``coro``; once ``stop_evt`` is set, give it ``graceful_delay`` seconds, then cancel it."""
        task = asyncio.ensure_future(coro)
        try:
            while not task.done():
                if stop_evt.is_set():
                    done, _ = await asyncio.wait({task}, timeout=self.graceful_delay)
                    if not done:
                        task.cancel()
                    break
                await asyncio.wait({task}, timeout=self.poll_interval)
            try:
                return await task
            except asyncio.CancelledError:
                return None
        finally:
            if not task.done():
                task.cancel()

    def _run_bundle(
        self,
        label: str,
        coro: Awaitable[None],
        stop_evt: ExecutionEvent,
        thread_exceptions: List[BaseException],
        *,
        stop_when_done: bool,
    ) -> None:
        """Run one bundle on its own event loop; a failure or Ctrl-C sets the stop event for the other side.

        ``KeyboardInterrupt`` (Ctrl-C reaches the main thread) is a request to stop, not an error: it is logged and
        not re-raised from :meth:`execute`. Any other exception is recorded for :meth:`execute` to re-raise.
        """
        try:
            asyncio.run(self._run_until_completed_or_canceled(coro, stop_evt))
        except KeyboardInterrupt:
            logger.warning("Interrupted in the %s; stopping the algorithm and the runners", label)
            stop_evt.set()
        except BaseException as exc:
            logger.exception("The %s failed", label)
            thread_exceptions.append(exc)
            stop_evt.set()
        finally:
            if stop_when_done:
                stop_evt.set()

    def _run_algorithm(
        self, algorithm: AlgorithmBundle, store: Any, stop_evt: ExecutionEvent, thread_exceptions: List[BaseException]
    ) -> None:
        with untraced():  # the algorithm's own spans (its LLM calls) belong to no rollout running beside it
            self._run_bundle("algorithm", algorithm(store, stop_evt), stop_evt, thread_exceptions, stop_when_done=True)

    def _run_runner(
        self,
        runner: RunnerBundle,
        store: Any,
        worker_id: int,
        stop_evt: ExecutionEvent,
        thread_exceptions: List[BaseException],
    ) -> None:
        # A runner that finishes (e.g. after max_rollouts) leaves the others running.
        self._run_bundle(
            f"runner {worker_id}", runner(store, worker_id, stop_evt), stop_evt, thread_exceptions, stop_when_done=False
        )

    def execute(self, algorithm: AlgorithmBundle, runner: RunnerBundle, store: Any) -> None:
        """Run the bundles in threads; re-raise the first exception any of them raised."""
        if self.managed_store:
            from agentbolt.store.threading import LightningStoreThreaded

            store = LightningStoreThreaded(store)
        stop_evt = ThreadingEvent()
        thread_exceptions: List[BaseException] = []
        threads: List[threading.Thread] = []
        try:
            if self.main_thread == "algorithm":
                running = [self.n_runners]
                running_lock = threading.Lock()

                def run_runner(worker_id: int) -> None:
                    try:
                        self._run_runner(runner, store, worker_id, stop_evt, thread_exceptions)
                    finally:
                        with running_lock:
                            running[0] -= 1
                            last = running[0] == 0
                        if last and not stop_evt.is_set():
                            # Nobody runs the rollouts the algorithm may still wait for: it is stopped (and cancelled
                            # after graceful_delay), as it is when the one runner of main_thread="runner" returns.
                            logger.info("Every runner has returned (e.g. after max_rollouts); stopping the algorithm")
                            stop_evt.set()

                for worker_id in range(self.n_runners):
                    thread = threading.Thread(
                        target=run_runner,
                        args=(worker_id,),
                        name=f"runner-{worker_id}",
                        daemon=True,
                    )
                    thread.start()
                    threads.append(thread)
                self._run_algorithm(algorithm, store, stop_evt, thread_exceptions)
            else:
                thread = threading.Thread(
                    target=self._run_algorithm,
                    args=(algorithm, store, stop_evt, thread_exceptions),
                    name="algorithm",
                    daemon=True,
                )
                thread.start()
                threads.append(thread)
                self._run_runner(runner, store, 0, stop_evt, thread_exceptions)
                stop_evt.set()
        except KeyboardInterrupt:  # Ctrl-C outside a bundle (e.g. while starting threads)
            logger.warning("Interrupted; stopping the algorithm and the runners")
            stop_evt.set()
        finally:
            stop_evt.set()
            for thread in threads:
                thread.join(self.join_timeout)
                if thread.is_alive():
                    logger.warning("Thread %s did not stop within %.1f s", thread.name, self.join_timeout)
        if thread_exceptions:
            raise thread_exceptions[0]
