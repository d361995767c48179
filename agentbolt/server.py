"""Deprecated v0.1 task server: hands tasks to ``AgentLightningClient`` workers and collects their rollouts.

New code uses :class:`~agentbolt.store.LightningStoreServer` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from agentbolt.types import (
    GenericResponse,
    NamedResources,
    ResourcesUpdate,
    RolloutLegacy,
    RolloutMode,
    Task,
    TaskIfAny,
)
from agentbolt.utils.checks import check_positive

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agentbolt.utils.server_launcher import PythonServerLauncher

__all__ = ["AgentLightningServer", "ServerDataStore"]

logger = logging.getLogger("agentbolt.server")


class ServerDataStore:
    """In-memory state of the v0.1 server: pending and claimed tasks, resources and finished rollouts."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, Task] = OrderedDict()
        self._processing: Dict[str, Task] = {}
        self._completed: Dict[str, RolloutLegacy] = {}
        self._resources: Dict[str, ResourcesUpdate] = {}
        self._latest_resources_id: Optional[str] = None
        self.bind_to_running_loop()

    def bind_to_running_loop(self) -> None:
        """Make new lock and event; asyncio's bind to the loop that first waits on them, which a restart may change."""
        self._completed_event = asyncio.Event()
        self._lock = asyncio.Lock()

    async def add_task(
        self, sample: Any, mode: Optional[RolloutMode], resources_id: Optional[str], metadata: Optional[Dict[str, Any]]
    ) -> str:
        """Queue a task and return its rollout id."""
        rollout_id = f"rollout-{uuid.uuid4()}"
        task = Task(
            rollout_id=rollout_id,
            input=sample,
            mode=mode,
            resources_id=resources_id,
            create_time=time.time(),
            num_claims=0,
            metadata=metadata or {},
        )
        async with self._lock:
            self._pending[rollout_id] = task
        return rollout_id

    async def get_next_task(self, task_timeout_seconds: float) -> Optional[Task]:
        """Claim the oldest pending task, first re-queuing tasks claimed longer than the timeout."""
        async with self._lock:
            now = time.time()
            for rollout_id, task in list(self._processing.items()):
                if task.last_claim_time is not None and now - task.last_claim_time > task_timeout_seconds:
                    logger.warning("Task %s timed out after %.0f s; re-queuing it", rollout_id, task_timeout_seconds)
                    del self._processing[rollout_id]
                    self._pending[rollout_id] = task
            if not self._pending:
                return None
            rollout_id, task = self._pending.popitem(last=False)
            task.num_claims = (task.num_claims or 0) + 1
            task.last_claim_time = now
            self._processing[rollout_id] = task
            return task

    async def update_resources(self, resources: NamedResources) -> str:
        """Store a resources snapshot; it becomes the latest."""
        resources_id = f"res-{uuid.uuid4()}"
        now = time.time()
        async with self._lock:
            self._resources[resources_id] = ResourcesUpdate(
                resources_id=resources_id, create_time=now, update_time=now, version=1, resources=resources
            )
            self._latest_resources_id = resources_id
        return resources_id

    def get_resources(self, resources_id: str) -> Optional[ResourcesUpdate]:
        """A stored snapshot."""
        return self._resources.get(resources_id)

    def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        """The latest snapshot."""
        return self._resources.get(self._latest_resources_id) if self._latest_resources_id else None

    async def store_rollout(self, rollout: RolloutLegacy) -> None:
        """Record a finished rollout."""
        async with self._lock:
            self._processing.pop(rollout.rollout_id, None)
            self._pending.pop(rollout.rollout_id, None)
            self._completed[rollout.rollout_id] = rollout
        self._completed_event.set()

    def pop_rollout(self, rollout_id: str) -> Optional[RolloutLegacy]:
        """Remove and return a finished rollout."""
        return self._completed.pop(rollout_id, None)

    def pop_all_rollouts(self) -> List[RolloutLegacy]:
        """Remove and return every finished rollout."""
        rollouts = list(self._completed.values())
        self._completed.clear()
        return rollouts

    async def wait_for_completion(self, timeout: float) -> None:
        """Wait until some rollout completes (or ``timeout``)."""
        self._completed_event.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._completed_event.wait(), timeout=timeout)


class AgentLightningServer:
    """The v0.1 task server (deprecated).

    Args:
        host: Interface to bind.
        port: TCP port.
        task_timeout_seconds: A claimed task not reported within this time is handed out again.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, task_timeout_seconds: float = 300.0) -> None:
        warnings.warn("AgentLightningServer is deprecated; use LightningStoreServer.", DeprecationWarning, stacklevel=2)
        check_positive(task_timeout_seconds, "task_timeout_seconds")
        self.host = host
        self.port = port
        self.endpoint = f"http://{host}:{port}"
        self.task_timeout_seconds = task_timeout_seconds
        self._store: Optional[ServerDataStore] = None
        self._launcher: Optional[PythonServerLauncher] = None
        self.app: FastAPI = self._build_app()

    def _require_store(self) -> ServerDataStore:
        if self._store is None:
            raise RuntimeError("The server is not started; call await server.start() first.")
        return self._store

    def _build_app(self) -> FastAPI:
        from fastapi import FastAPI, HTTPException

        app = FastAPI(title="Agent Lightning v0.1 task server")

        @app.get("/task", response_model=TaskIfAny)
        async def next_task() -> TaskIfAny:
            if self._store is None:
                raise HTTPException(status_code=503, detail="Server not started")
            task = await self._store.get_next_task(self.task_timeout_seconds)
            return TaskIfAny(is_available=task is not None, task=task)

        @app.get("/resources/latest", response_model=ResourcesUpdate)
        async def latest_resources() -> ResourcesUpdate:
            if self._store is None:
                raise HTTPException(status_code=503, detail="Server not started")
            update = self._store.get_latest_resources()
            if update is None:
                raise HTTPException(status_code=404, detail="No resources have been set")
            return update

        @app.get("/resources/{resources_id}", response_model=ResourcesUpdate)
        async def resources_by_id(resources_id: str) -> ResourcesUpdate:
            if self._store is None:
                raise HTTPException(status_code=503, detail="Server not started")
            update = self._store.get_resources(resources_id)
            if update is None:
                raise HTTPException(status_code=404, detail=f"Resources {resources_id} not found")
            return update

        @app.post("/rollout", response_model=GenericResponse)
        async def post_rollout(rollout: RolloutLegacy) -> GenericResponse:
            if self._store is None:
                raise HTTPException(status_code=503, detail="Server not started")
            await self._store.store_rollout(rollout)
            return GenericResponse(status="ok", message=f"Rollout {rollout.rollout_id} received")

        return app

    def _new_launcher(self) -> PythonServerLauncher:
        from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

        if self._launcher is not None and self._launcher.is_running():
            raise RuntimeError("The server is already running")
        # A restart keeps the queued tasks, resources and finished rollouts of the previous run.
        if self._store is None:
            self._store = ServerDataStore()
        else:
            self._store.bind_to_running_loop()
        args = PythonServerLauncherArgs(
            host=self.host, port=self.port, launch_mode="asyncio", log_level=logging.WARNING, startup_timeout=30.0
        )
        self._launcher = PythonServerLauncher(self.app, args)
        return self._launcher

    async def start(self) -> None:
        """Serve in the background of the current event loop."""
        await self._new_launcher().start()
        logger.info("v0.1 task server listening on %s", self.endpoint)

    async def stop(self) -> None:
        """Stop serving."""
        if self._launcher is not None:
            await self._launcher.stop()
            self._launcher = None

    async def run_forever(self) -> None:
        """Serve until cancelled."""
        await self._new_launcher().run_forever()

    async def queue_task(
        self,
        sample: Any,
        mode: Optional[RolloutMode] = None,
        resources_id: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> str:
        """Queue a task; returns its rollout id."""
        return await self._require_store().add_task(sample, mode, resources_id, metadata)

    async def update_resources(self, resources: NamedResources) -> str:
        """Publish resources; returns their id."""
        return await self._require_store().update_resources(resources)

    async def get_completed_rollout(self, rollout_id: str) -> Optional[RolloutLegacy]:
        """Remove and return a finished rollout, if it is there."""
        return self._require_store().pop_rollout(rollout_id)

    async def poll_completed_rollout(self, rollout_id: str, timeout: Optional[float] = None) -> Optional[RolloutLegacy]:
        """Wait until the rollout is reported (or ``timeout`` seconds pass)."""
        store = self._require_store()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rollout = store.pop_rollout(rollout_id)
            if rollout is not None:
                return rollout
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return None
            await store.wait_for_completion(min(1.0, remaining))

    async def retrieve_completed_rollouts(self) -> List[RolloutLegacy]:
        """Remove and return every finished rollout."""
        return self._require_store().pop_all_rollouts()
