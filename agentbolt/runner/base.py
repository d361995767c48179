"""The Runner interface: executes rollouts taken from the store."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, Iterator, List, Optional, TypeVar

from agentbolt.types import Hook, NamedResources, ParallelWorkerBase, Rollout, RolloutMode

if TYPE_CHECKING:
    from agentbolt.execution.events import ExecutionEvent
    from agentbolt.litagent import LitAgent
    from agentbolt.store.base import LightningStore

__all__ = ["Runner"]

logger = logging.getLogger("agentbolt.runner.base")

T_task = TypeVar("T_task")


class Runner(ParallelWorkerBase, Generic[T_task]):
    """Runs an agent on rollouts: ``iter`` serves the store's queue, ``step`` runs one input directly."""

    def init(self, agent: LitAgent[T_task], **kwargs: Any) -> None:
        """Prepare the runner for ``agent`` (once per process)."""
        raise NotImplementedError()

    def init_worker(self, worker_id: int, store: LightningStore, **kwargs: Any) -> None:  # type: ignore[override]
        """Bind the runner to a worker id and a store."""
        raise NotImplementedError()

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        """Release what :meth:`init` acquired."""
        raise NotImplementedError()

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        """Release what :meth:`init_worker` acquired."""
        raise NotImplementedError()

    def run(self, *args: Any, **kwargs: Any) -> None:
        """Not used: call :meth:`iter` or :meth:`step`."""
        raise RuntimeError("Runner.run() is not supported; use iter() or step().")

    @contextmanager
    def run_context(
        self,
        *,
        agent: LitAgent[T_task],
        store: LightningStore,
        hooks: Optional[List[Hook]] = None,
        worker_id: Optional[int] = None,
    ) -> Iterator[Runner[T_task]]:
        """Initialise the runner for ``agent`` and ``store``, yield it, and tear it down afterwards."""
        initialized = False
        worker_initialized = False
        try:
            self.init(agent=agent, hooks=hooks)
            initialized = True
            self.init_worker(worker_id=0, store=store)
            worker_initialized = True
            yield self
        finally:
            if worker_initialized:
                try:
                    self.teardown_worker(worker_id=worker_id or 0)
                except Exception:
                    logger.exception("Error while tearing down the runner worker")
            if initialized:
                try:
                    self.teardown()
                except Exception:
                    logger.exception("Error while tearing down the runner")

    async def iter(self, *, event: Optional[ExecutionEvent] = None) -> None:
        """Dequeue and run rollouts until ``event`` is set (or a rollout limit is reached)."""
        raise NotImplementedError()

    async def step(
        self,
        input: T_task,
        *,
        resources: Optional[NamedResources] = None,
        mode: Optional[RolloutMode] = None,
        event: Optional[ExecutionEvent] = None,
    ) -> Rollout:
        """Run the agent once on ``input`` outside the queue and return the finished rollout."""
        raise NotImplementedError()
