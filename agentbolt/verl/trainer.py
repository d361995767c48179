"""VERL's ``RayPPOTrainer`` (verl 0.9.1, the v0 trainer) with agentbolt's runners as its generation step.

The training loop is VERL's, step for step, except for generation and validation: instead of VERL's agent loops,
the :class:`~agentbolt.verl.daemon.AgentModeDaemon` enqueues the batch's tasks into the store, agentbolt runners
run the agents against VERL's vLLM servers through the gateway, and the daemon builds the batch from their traces.
Because one rollout may yield several samples (one per LLM call), the batch is the daemon's alone: it is not
joined with the dataloader's rows as VERL's own loop does.

This path needs GPUs (FSDP workers and vLLM servers); it is not exercised on the CPU-only machines agentbolt is
tested on. Its CPU parts (configuration, dataset, daemon, batch building) are tested with VERL installed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Type

import numpy as np
import torch
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, apply_kl_penalty, compute_advantage
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics

from agentbolt.verl.daemon import AgentModeDaemon

__all__ = ["AgentLightningTrainer", "AgentboltTrainer"]

logger = logging.getLogger(__name__)


class AgentboltTrainer(RayPPOTrainer):
    """VERL's PPO trainer fed by agentbolt rollouts (also available as ``AgentLightningTrainer``).

    Args:
        store: The store the runners serve.
        llm_proxy: Gateway to route agents through (None: the daemon starts one on ``agentbolt.port``).
        adapter: The Trainer's adapter (spans to triplets).
        daemon_cls: Daemon class (default :class:`~agentbolt.verl.daemon.AgentModeDaemon`).
        *args, **kwargs: ``RayPPOTrainer``'s arguments.
    """

    def __init__(
        self,
        *args: Any,
        store: Any,
        llm_proxy: Any,
        adapter: Any,
        daemon_cls: Optional[Type[AgentModeDaemon]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.store = store
        self.llm_proxy = llm_proxy
        self.adapter = adapter
        self.daemon_cls = daemon_cls or AgentModeDaemon
        self.agent_mode_daemon: Optional[AgentModeDaemon] = None

    # ------------------------------------------------------------------ the daemon

    def _make_daemon(self) -> AgentModeDaemon:
        settings = self.config.agentbolt
        rollout = self.config.actor_rollout_ref.rollout
        level = settings.trace_aggregator.level
        trajectory = level == "trajectory"
        return self.daemon_cls(
            self.store,
            adapter=self.adapter,
            llm_proxy=self.llm_proxy,
            host=settings.get("gateway_host", "127.0.0.1"),
            port=settings.port,
            train_rollout_n=rollout.n,
            val_rollout_n=rollout.val_kwargs.n,
            pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0,
            level=level,
            max_prompt_length=(
                settings.trace_aggregator.trajectory_max_prompt_length
                if trajectory
                else self.config.data.max_prompt_length
            ),
            max_response_length=(
                settings.trace_aggregator.trajectory_max_response_length
                if trajectory
                else self.config.data.max_response_length
            ),
            agent_match=settings.get("agent_match"),
            sampling_parameters={"temperature": rollout.temperature, "top_p": rollout.top_p},
            val_sampling_parameters={"temperature": rollout.val_kwargs.temperature, "top_p": rollout.val_kwargs.top_p},
            reward_fillna_value=settings.reward_fillna_value,
            rollout_timeout=settings.rollout_timeout,
            debug=settings.trace_aggregator.debug,
            mismatch_log_dir=settings.trace_aggregator.mismatch_log_dir,
        )

    def _roll_out(self, tasks: List[Any], is_train: bool) -> Dict[str, int]:
        assert self.agent_mode_daemon is not None
        self.agent_mode_daemon.set_up_data_and_server(tasks, self.llm_server_manager.get_addresses(), is_train=is_train)
        counts = self.agent_mode_daemon.run_until_all_finished()
        if is_train:
            # Free the GPUs for the update; the weight sync after it wakes the replicas again. Validation keeps them
            # awake, as VERL's own loop does, since training rollouts may follow.
            self.checkpoint_manager.sleep_replicas()
        return counts

    @staticmethod
    def _tasks(batch_dict: Dict[str, Any]) -> List[Any]:
        return list(batch_dict["task"])

    # ------------------------------------------------------------------ validation

    def _validate(self, merged: bool = False) -> Dict[str, float]:
        assert self.agent_mode_daemon is not None
        tasks = [task for batch in self.val_dataloader for task in self._tasks(batch)]
        self._roll_out(tasks, is_train=False)  # the replicas are awake: after the first sync or the last update
        metrics = self.agent_mode_daemon.get_test_metrics()
        self.agent_mode_daemon.clear_data_and_server()
        return metrics

    # ------------------------------------------------------------------ training

    def fit(self) -> None:
        """Train: for each batch of tasks, roll out through the runners, then run VERL's PPO update."""
        from verl.utils.tracking import Tracking

        tracking = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=None,
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        self.agent_mode_daemon = self._make_daemon()
        try:
            if self.config.trainer.get("val_before_train", True):
                tracking.log(data=self._validate(), step=self.global_steps)
                if self.config.trainer.get("val_only", False):
                    return
            first_epoch = self.global_steps // len(self.train_dataloader)
            self.global_steps += 1
            dp_size = self._get_dp_size(self.actor_rollout_wg, "actor")
            for _epoch in range(first_epoch, self.config.trainer.total_epochs):
                for batch_dict in self.train_dataloader:
                    metrics = self._train_step(self._tasks(batch_dict), dp_size)
                    tracking.log(data=metrics, step=self.global_steps)
                    if self.global_steps >= self.total_training_steps:
                        return
                    self.global_steps += 1
        finally:
            self.agent_mode_daemon.close()
            self._shutdown_dump_executor()

    def _train_step(self, tasks: List[Any], dp_size: int) -> Dict[str, Any]:
        assert self.agent_mode_daemon is not None
        config = self.config
        metrics: Dict[str, Any] = {}
        timing_raw: Dict[str, float] = {}
        is_last_step = self.global_steps >= self.total_training_steps
        with marked_timer("step", timing_raw):
            with marked_timer("gen", timing_raw, color="red"):
                counts = self._roll_out(tasks, is_train=True)
                batch, daemon_metrics = self.agent_mode_daemon.get_train_data_batch(multiple=dp_size)
                self.agent_mode_daemon.clear_data_and_server()
            metrics.update(daemon_metrics)
            metrics.update({f"agent_mode/status_{k}": float(v) for k, v in counts.items()})
            batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
            if config.trainer.balance_batch:
                self._balance_batch(batch, metrics=metrics)
            batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
            batch.meta_info["images_seqlens"] = []

            with marked_timer("old_log_prob", timing_raw, color="blue"):
                old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
                entropys = old_log_prob.batch.pop("entropys")
                actor_config = config.actor_rollout_ref.actor
                entropy = agg_loss(
                    loss_mat=entropys,
                    loss_mask=batch.batch["response_mask"],
                    loss_agg_mode=actor_config.loss_agg_mode,
                    loss_scale_factor=actor_config.loss_scale_factor,
                )
                metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": old_log_prob_mfu})
                batch = batch.union(old_log_prob)
            if self.use_reference_policy:
                with marked_timer("ref", timing_raw, color="olive"):
                    batch = batch.union(self._compute_ref_log_prob(batch))
            if self.use_critic:
                with marked_timer("values", timing_raw, color="cyan"):
                    batch = batch.union(self._compute_values(batch))

            with marked_timer("adv", timing_raw, color="brown"):
                if config.algorithm.use_kl_in_reward:
                    batch, kl_metrics = apply_kl_penalty(
                        batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=config.algorithm.kl_penalty
                    )
                    metrics.update(kl_metrics)
                else:
                    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                batch = compute_advantage(
                    batch,
                    adv_estimator=config.algorithm.adv_estimator,
                    gamma=config.algorithm.gamma,
                    lam=config.algorithm.lam,
                    num_repeat=config.actor_rollout_ref.rollout.n,
                    norm_adv_by_std_in_grpo=config.algorithm.get("norm_adv_by_std_in_grpo", True),
                    config=config.algorithm,
                )

            if self.use_critic:
                with marked_timer("update_critic", timing_raw, color="pink"):
                    metrics.update(reduce_metrics(self._update_critic(batch).meta_info["metrics"]))
            if config.trainer.critic_warmup > self.global_steps:
                self.checkpoint_manager.update_weights(self.global_steps)
            else:
                with marked_timer("update_actor", timing_raw, color="red"):
                    actor_output = self._update_actor(batch)
                if config.trainer.save_freq > 0 and (is_last_step or self.global_steps % config.trainer.save_freq == 0):
                    with marked_timer("save_checkpoint", timing_raw, color="green"):
                        self._save_checkpoint()
                with marked_timer("update_weights", timing_raw, color="red"):
                    self.checkpoint_manager.update_weights(self.global_steps)
                metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))

        if config.trainer.test_freq > 0 and (is_last_step or self.global_steps % config.trainer.test_freq == 0):
            with marked_timer("testing", timing_raw, color="green"):
                metrics.update(self._validate())
        metrics.update({"training/global_step": self.global_steps, "training/time": time.time()})
        metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
        metrics.update(
            compute_throughout_metrics(
                batch=batch, timing_raw=timing_raw, n_gpus=self.resource_pool_manager.get_n_gpus()
            )
        )
        metrics["agent_mode/groups"] = float(len(np.unique(batch.non_tensor_batch["uid"])))
        return metrics


AgentLightningTrainer = AgentboltTrainer
"""The name the reference uses for this trainer."""
