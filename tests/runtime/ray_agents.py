"""Agents for the Ray strategy tests, importable by the runner actors (the tests put this directory on their path)."""

from __future__ import annotations

import os
import signal
from typing import Any, Dict

import agentbolt as agl


class PidAgent(agl.LitAgent[Dict[str, Any]]):
    """Records which process ran the rollout (the runner actor's) and succeeds."""

    def rollout(self, task: Dict[str, Any], resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        agl.emit_object({"pid": os.getpid()})
        return 1.0


class CrashFirstAttemptAgent(agl.LitAgent[Dict[str, Any]]):
    """Kills its own process (SIGKILL) the first time it sees a task marked ``crash``; a marker file remembers."""

    def rollout(self, task: Dict[str, Any], resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        marker = task.get("crash")
        if marker and not os.path.exists(marker):
            with open(marker, "w") as handle:
                handle.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return 1.0


class FailingBundle:
    """A runner bundle that fails at once (a bug in the runner side, not a crash)."""

    async def __call__(self, store: Any, worker_id: int, event: Any) -> None:
        raise ValueError(f"runner {worker_id} is broken")


class IdleBundle:
    """A runner bundle that does nothing until the run stops."""

    async def __call__(self, store: Any, worker_id: int, event: Any) -> None:
        import asyncio

        while not event.is_set():
            await asyncio.sleep(0.05)
