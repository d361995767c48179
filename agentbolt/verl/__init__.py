"""VERL in agent mode: VERL's PPO trainer fed with rollouts that agentbolt runners execute.

Use it through :class:`agentbolt.algorithm.verl.VERL` (``agl.VERL(config)``). The modules here need the ``verl``
extra (``pip install 'agentbolt[verl]'``: VERL, Ray, Hydra) and load it only when a name below is used:

* :class:`AgentModeDaemon` (``daemon``): enqueues a batch of tasks, waits for the rollouts, and turns their
  traces into VERL's training batch (token ids from the gateway, masks, rewards).
* :class:`AgentDataset` / :class:`LoadedDataset` (``dataset``): task lists as VERL's dataloaders read them.
* :class:`AgentLightningTrainer` (``trainer``): VERL's ``RayPPOTrainer`` whose generation step is the daemon.
* :func:`run_ppo`, :class:`TaskRunner`, :func:`main` (``entrypoint``): starting it on a Ray cluster.
* ``config.yaml``: VERL's ``ppo_trainer`` configuration plus the ``agentbolt`` section.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["AgentDataset", "AgentLightningTrainer", "AgentModeDaemon", "LoadedDataset", "TaskRunner", "main", "run_ppo"]

_LOCATIONS = {
    "AgentModeDaemon": "agentbolt.verl.daemon",
    "AgentDataset": "agentbolt.verl.dataset",
    "LoadedDataset": "agentbolt.verl.dataset",
    "AgentLightningTrainer": "agentbolt.verl.trainer",
    "TaskRunner": "agentbolt.verl.entrypoint",
    "run_ppo": "agentbolt.verl.entrypoint",
    "main": "agentbolt.verl.entrypoint",
}


def __getattr__(name: str) -> Any:
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
