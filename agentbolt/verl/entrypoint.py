"""Starting agent-mode VERL training on a Ray cluster (verl 0.9.1).

:func:`run_ppo` is what :meth:`agentbolt.algorithm.verl.VERL.run` calls: it joins (or starts) Ray and runs
:class:`TaskRunner` as an actor, which builds VERL's worker groups and the trainer
(:class:`~agentbolt.verl.trainer.AgentLightningTrainer`) and trains. :func:`main` is the command line
(``python -m agentbolt.verl agentbolt.store=http://HOST:4747 data.train_files=tasks.jsonl ...``) for running VERL
as the algorithm process of a store that runners elsewhere serve.

Needs GPUs; not exercised on the CPU-only test machines.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any, Optional, Sequence, Type

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner

from agentbolt.verl.configuration import compose_config
from agentbolt.verl.daemon import AgentModeDaemon, check_gateway_port
from agentbolt.verl.dataset import AgentDataset, LoadedDataset

__all__ = ["TaskRunner", "main", "run_ppo"]

logger = logging.getLogger(__name__)


class AgentTaskRunner(BaseTaskRunner):
    """Builds VERL's workers and the agent-mode trainer inside a Ray actor, then trains."""

    def run(  # type: ignore[override]
        self,
        config: Any,
        train_dataset: Optional[Sequence[Any]] = None,
        val_dataset: Optional[Sequence[Any]] = None,
        store: Any = None,
        adapter: Any = None,
        trainer_cls: Optional[Type[Any]] = None,
        daemon_cls: Optional[Type[AgentModeDaemon]] = None,
    ) -> None:
        """Train with ``config`` on the datasets (or ``data.train_files`` / ``data.val_files``)."""
        from verl.trainer.ppo.utils import create_rl_sampler, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn

        from agentbolt.verl.trainer import AgentLightningTrainer

        logger.info("Agent-mode task runner on %s, pid %d", socket.gethostname(), os.getpid())
        OmegaConf.resolve(config)
        # The gateway starts in this process at the first step: a taken port must fail now, not after the workers
        # loaded the model.
        check_gateway_port(config.agentbolt.get("gateway_host", "127.0.0.1"), config.agentbolt.port)
        if config.agentbolt.get("instrument_vllm", True):
            from agentbolt.verl.async_server import use_patched_vllm_server

            use_patched_vllm_server()
        _, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        train = AgentDataset(train_dataset) if train_dataset is not None else LoadedDataset(config.data.train_files)
        val = AgentDataset(val_dataset) if val_dataset is not None else LoadedDataset(config.data.val_files)
        trainer = (trainer_cls or AgentLightningTrainer)(
            config=config,
            tokenizer=model_config.tokenizer,
            processor=model_config.processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=ray_worker_group_cls,
            train_dataset=train,
            val_dataset=val,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train),
            store=store,
            llm_proxy=None,  # the daemon starts the gateway in this process, on agentbolt.port
            adapter=adapter,
            daemon_cls=daemon_cls,
        )
        trainer.init_workers()
        trainer.fit()


TaskRunner = ray.remote(num_cpus=1)(AgentTaskRunner)
"""The task runner as a Ray actor class."""


def _check_store(store: Any) -> None:
    if store is None:
        raise ValueError("agent mode needs a store that the runners serve")
    if not store.capabilities.get("zero_copy", False):
        raise ValueError(
            f"VERL trains inside Ray actors, which reach the store over HTTP: {type(store).__name__} cannot be "
            "shared that way. Use the client-server or Ray execution strategy (they serve the store), or a "
            "LightningStoreClient of an `agentbolt store` server."
        )


def run_ppo(
    config: Any,
    train_dataset: Optional[Sequence[Any]] = None,
    val_dataset: Optional[Sequence[Any]] = None,
    store: Any = None,
    llm_proxy: Any = None,
    adapter: Any = None,
    trainer_cls: Optional[Type[Any]] = None,
    daemon_cls: Optional[Type[AgentModeDaemon]] = None,
) -> None:
    """Train with VERL in agent mode on the Ray cluster (started here when Ray is not running).

    Args:
        config: The composed configuration (:func:`~agentbolt.verl.configuration.compose_config`).
        train_dataset: Training tasks (default: ``data.train_files``).
        val_dataset: Validation tasks (default: ``data.val_files``).
        store: The store the runners serve; must be reachable from other processes.
        llm_proxy: A gateway the caller configured; its port becomes ``agentbolt.port`` (the daemon starts the
            gateway next to VERL's trainer).
        adapter: Spans to triplets (default: :class:`~agentbolt.adapter.TracerTraceToTriplet`).
        trainer_cls: Trainer class (default :class:`~agentbolt.verl.trainer.AgentLightningTrainer`).
        daemon_cls: Daemon class (default :class:`~agentbolt.verl.daemon.AgentModeDaemon`).

    Raises:
        ValueError: No store, or one that cannot be shared with Ray actors.
    """
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    _check_store(store)
    if adapter is None:
        from agentbolt.adapter import TracerTraceToTriplet

        adapter = TracerTraceToTriplet()
    if llm_proxy is not None:
        config.agentbolt.port = llm_proxy.server_launcher_args.port
    if not ray.is_initialized():
        ray_init = OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True) or {}
        runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_init.get("runtime_env", {}) or {})
        ray.init(**{**ray_init, "runtime_env": OmegaConf.to_container(runtime_env)})
    runner = TaskRunner.remote()
    ray.get(runner.run.remote(config, train_dataset, val_dataset, store, adapter, trainer_cls, daemon_cls))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m agentbolt.verl OVERRIDES...``: VERL as the algorithm process of an ``agentbolt store`` server.

    ``agentbolt.store=http://HOST:PORT`` names the store (its runners are started separately, e.g. with
    ``AGL_CURRENT_ROLE=runner``); tasks come from ``data.train_files`` / ``data.val_files``.

    Raises:
        SystemExit: A malformed override, an unknown or invalid ``agentbolt`` setting, or no store (one line).
    """
    from hydra.errors import HydraException

    from agentbolt.store.client_server import LightningStoreClient

    try:
        config = compose_config(cli_overrides=list(sys.argv[1:] if argv is None else argv))
    except (HydraException, TypeError, ValueError) as exc:  # a malformed override, an unknown or invalid setting
        raise SystemExit(f"agentbolt.verl: error: {exc}") from None
    address = config.agentbolt.get("store")
    if not address:
        raise SystemExit("agentbolt.verl: error: set agentbolt.store=http://HOST:PORT (the store the runners serve)")
    run_ppo(config, store=LightningStoreClient(str(address)))
