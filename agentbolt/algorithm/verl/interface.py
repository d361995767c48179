"""``agl.VERL(config)``: VERL's PPO / GRPO trainer on GPUs, with agentbolt runners as its rollout workers.

The configuration is VERL's own (the keys of ``python -m verl.trainer.main_ppo``, as a nested dict) composed over
agentbolt's ``agentbolt/verl/config.yaml``, which adds the ``agentbolt`` section (gateway port, trace aggregation)
and the agent-mode defaults. :meth:`VERL.run` starts VERL on Ray: its FSDP workers train, its vLLM servers serve
the policy, and agentbolt's runners (started by the Trainer's execution strategy) run the agents against those
servers through the gateway, which records exact token ids for training. See ``docs/verl.md``.

Needs ``pip install 'agentbolt[verl]'`` and GPUs for training; building the configuration needs only the extra.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Type

from agentbolt.algorithm.base import Algorithm
from agentbolt.types import Dataset

__all__ = ["VERL"]

logger = logging.getLogger(__name__)


class VERL(Algorithm):
    """VERL's trainer in agent mode.

    Args:
        config: VERL configuration overrides as a nested dict (``{"data": {"train_batch_size": 32}, ...}``);
            merged over the packaged configuration with new keys allowed. An ``agentlightning`` section is read as
            ``agentbolt``.
        trainer_cls: Trainer class (default :class:`agentbolt.verl.trainer.AgentLightningTrainer`).
        daemon_cls: Daemon class (default :class:`agentbolt.verl.daemon.AgentModeDaemon`).

    Raises:
        ImportError: The ``verl`` extra is not installed.
        TypeError: ``config`` is not a dict.
        ValueError: The rollout engine is not vLLM, or an unknown ``agentbolt.trace_aggregator.level``.
    """

    def __init__(
        self, config: Dict[str, Any], trainer_cls: Optional[Type[Any]] = None, daemon_cls: Optional[Type[Any]] = None
    ) -> None:
        super().__init__()
        try:
            from agentbolt.verl.configuration import compose_config
        except ImportError as exc:  # pragma: no cover - the module itself is always there
            raise ImportError("VERL needs the 'verl' extra: pip install 'agentbolt[verl]'") from exc
        try:
            self.config = compose_config(config)
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"VERL needs the 'verl' extra (missing module {exc.name!r}): pip install 'agentbolt[verl]'"
            ) from exc
        self.trainer_cls = trainer_cls
        self.daemon_cls = daemon_cls

    def run(self, train_dataset: Optional[Dataset[Any]] = None, val_dataset: Optional[Dataset[Any]] = None) -> None:
        """Train on ``train_dataset``, validating on ``val_dataset`` (default: VERL's ``data.*_files``).

        The rollouts run through the store the Trainer set (``v1`` mode). Without one, ``agentbolt.store`` in the
        configuration names an ``agentbolt store`` server whose runners were started separately.

        Raises:
            ValueError: No store (neither the Trainer's nor ``agentbolt.store``), or one that cannot be reached from
                Ray actors.
        """
        from agentbolt.verl.entrypoint import run_ppo

        try:
            store: Any = self.get_store()
        except ValueError:
            address = self.config.agentbolt.get("store")
            if not address:
                raise ValueError(
                    "VERL runs the agents through a store: use it with agl.Trainer(algorithm=agl.VERL(...)).fit(...), "
                    "or set agentbolt.store to the URL of an `agentbolt store` server its runners serve"
                ) from None
            from agentbolt.store.client_server import LightningStoreClient

            store = LightningStoreClient(str(address))
        try:
            adapter = self.get_adapter()
        except ValueError:
            adapter = None
        run_ppo(
            self.config,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            store=store,
            llm_proxy=self.get_llm_proxy(),
            adapter=adapter,
            trainer_cls=self.trainer_cls,
            daemon_cls=self.daemon_cls,
        )
