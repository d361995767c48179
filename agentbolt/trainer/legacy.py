"""The v0.1 training protocol (``Trainer.fit(agent, "http://server")``), kept for existing code."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from typing import TYPE_CHECKING, Any, List, Optional

from agentbolt.types import ParallelWorkerBase

if TYPE_CHECKING:
    from agentbolt.client import AgentLightningClient, DevTaskLoader
    from agentbolt.litagent import LitAgent

__all__ = ["TrainerLegacy"]

logger = logging.getLogger("agentbolt.trainer.legacy")


class TrainerLegacy(ParallelWorkerBase):
    """v0.1 worker loop: runners poll tasks from an ``AgentLightningServer`` and post rollouts back."""

    n_workers: int
    max_tasks: Optional[int]
    daemon: bool
    tracer: Any
    triplet_exporter: Any

    def _legacy_client(
        self, train_data: Any, dev_data: Any = None, dev_backend: Any = None
    ) -> AgentLightningClient | DevTaskLoader:
        from agentbolt.client import AgentLightningClient, DevTaskLoader

        if dev_data is not None:
            if isinstance(dev_data, DevTaskLoader):
                return dev_data
            if dev_backend is None:
                raise ValueError("dev_data needs dev_backend (the resources handed to the agent)")
            return DevTaskLoader(list(dev_data), dev_backend)
        if isinstance(train_data, (AgentLightningClient, DevTaskLoader)):
            return train_data
        if isinstance(train_data, str):
            if not train_data.startswith(("http://", "https://")):
                raise ValueError(
                    f"Server URL must start with http:// or https://, got {train_data!r} (a string train dataset is "
                    "read as the server URL of the v0.1 protocol; pass the tasks as a list)"
                )
            return AgentLightningClient(endpoint=train_data)
        raise TypeError(
            f"fit_v0 expects a server URL, an AgentLightningClient or a DevTaskLoader, got {type(train_data)}"
        )

    def _legacy_worker(self, agent: LitAgent[Any], client: Any, worker_id: int) -> int:
        from agentbolt.runner.legacy import LegacyAgentRunner

        self.tracer.init_worker(worker_id)
        try:
            runner = LegacyAgentRunner(
                agent=agent,
                client=client,
                tracer=self.tracer,
                triplet_exporter=self.triplet_exporter,
                worker_id=worker_id,
                max_tasks=self.max_tasks,
            )
            if agent.is_async():
                return asyncio.run(runner.iter_async())
            return runner.iter()
        finally:
            self.tracer.teardown_worker(worker_id)

    def fit_v0(
        self,
        agent: LitAgent[Any],
        train_data: Any,
        *,
        val_data: Any = None,
        dev_data: Any = None,
        dev_backend: Any = None,
    ) -> None:
        """Run ``n_workers`` v0.1 workers against a task server URL (or a ``DevTaskLoader`` for local tests)."""
        if val_data is not None:
            logger.warning("val_data is not used by the v0.1 protocol; the server decides the task modes.")
        client = self._legacy_client(train_data, dev_data, dev_backend)
        from agentbolt.client import DevTaskLoader

        if isinstance(client, DevTaskLoader) and self.n_workers > 1:
            logger.warning(
                "With n_workers=%d each worker process posts its rollouts to its own copy of the DevTaskLoader: the "
                "loader of this process keeps none of them. Use n_workers=1 to keep them.",
                self.n_workers,
            )
        agent.set_trainer(self)  # type: ignore[arg-type]
        self.tracer.init()
        try:
            if self.n_workers == 1:
                self._legacy_worker(agent, client, 0)
                return
            ctx = multiprocessing.get_context()
            processes: List[Any] = []
            for worker_id in range(self.n_workers):
                process = ctx.Process(  # type: ignore[attr-defined]
                    target=self._legacy_worker, args=(agent, client, worker_id), daemon=self.daemon
                )
                process.start()
                processes.append(process)
            try:
                for process in processes:
                    process.join()
            except KeyboardInterrupt:
                logger.warning("Interrupted; terminating v0.1 workers")
                for process in processes:
                    process.terminate()
                for process in processes:
                    process.join(10)
                raise
            failed = {worker_id: p.exitcode for worker_id, p in enumerate(processes) if p.exitcode != 0}
            if failed:
                raise RuntimeError(f"v0.1 workers failed (worker id: exit code): {failed}; see their logged errors")
        finally:
            self.tracer.teardown()
