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

from typing import Any, List

from agentbolt.utils.imports import import_extra
from agentbolt.utils.lazy import LazyExports

_LAZY = LazyExports(
    __name__,
    {
        "agentbolt.verl.daemon": ["AgentModeDaemon"],
        "agentbolt.verl.dataset": ["AgentDataset", "LoadedDataset"],
        "agentbolt.verl.trainer": ["AgentLightningTrainer"],
        "agentbolt.verl.entrypoint": ["TaskRunner", "run_ppo", "main"],
    },
)

__all__ = sorted(_LAZY.names())

_NEED_VERL = {"AgentLightningTrainer", "TaskRunner", "run_ppo", "main"}
"""Names whose modules import VERL (and Ray, Hydra) when they load."""


def require_verl(feature: str) -> None:
    """Fail with the extra to install when VERL is missing.

    Raises:
        ImportError: VERL is not installed (``pip install 'agentbolt[verl]'``).
    """
    import_extra("verl.trainer", feature=feature, extra="verl")


def __getattr__(name: str) -> Any:
    if name in _NEED_VERL:
        require_verl(f"agentbolt.verl.{name}")
    return _LAZY.load(name)


def __dir__() -> List[str]:
    return _LAZY.dir()
