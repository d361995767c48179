"""``GRPO``: the algorithm that drives rollouts through the store and trains the policy on them.

One training step:

1. take ``batch_size`` tasks and enqueue each ``group_size`` times (one group per task) with the current
   ``main_llm`` resource;
2. wait for the rollouts; failed, cancelled, late and reward-less ones are counted and scored with
   ``failed_rollout_reward`` (or dropped when it is None); with ``resample_rounds``, groups none of whose samples
   would get an advantage (their rewards are all equal) are made up for by more rounds of fresh tasks (dynamic
   sampling);
3. adapt each rollout's spans to triplets and turn every LLM call of the trained agent(s) into a token sample
   carrying the rollout's reward (credit rule) — see :mod:`~agentbolt.algorithm.grpo.samples`;
4. normalise rewards within each group, each rollout weighing one (zero-variance groups are skipped) —
   :mod:`~.advantages`;
5. update the policy (:class:`~agentbolt.algorithm.grpo.trainer.PolicyTrainer`) while the serving engine is paused,
   then publish a new ``main_llm`` resource snapshot so the next rollouts use (and record) the new weights;
6. log metrics, validate every ``val_interval`` steps and checkpoint every ``checkpoint_interval`` steps.

The policy is served in process: the transformers engine generates with the very model object the trainer updates,
behind an OpenAI-compatible HTTP server, and agents reach it through the LLM gateway (:class:`agentbolt.LLMProxy`)
which records prompt/response token ids and log-probs for training.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Type

from agentbolt.algorithm.finetuning.algorithm import (
    FinetuningAlgorithm,
    PolicyServer,
    RolloutOutcome,
    TaskSampler,
    mean_std,
    model_vocab_size,
    padding_token_id,
)
from agentbolt.algorithm.finetuning.config import FinetuningConfig
from agentbolt.algorithm.grpo.advantages import AdvantageStats, RolloutScore, assign_advantages
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import SampleStats, TokenSample, triplets_to_samples

if TYPE_CHECKING:
    from agentbolt.algorithm.grpo.distributed import DataParallel
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore

__all__ = ["GRPO", "PolicyServer", "RolloutOutcome", "TaskSampler"]

logger = logging.getLogger(__name__)


class GRPO(FinetuningAlgorithm):
    """Group Relative Policy Optimization of the LLM calls made by your agent.

    Args:
        config: A :class:`GRPOConfig`, a dict of its fields, or None for the defaults.
        model: The policy: a model name or directory (overrides ``config.model``), or an already loaded
            transformers causal LM (then ``tokenizer`` is required). Default: the embedded model.
        tokenizer: Tokenizer of a model object (its chat template renders prompts).
        adapter: Spans-to-triplets adapter. Default: the trainer's adapter when it reads gateway spans, else
            :class:`agentbolt.adapter.LlmProxyTraceToTriplet`.
        **overrides: Config fields overriding ``config`` (``GRPO(batch_size=4, group_size=8)``).

    Raises:
        pydantic.ValidationError: An option is invalid.

    :meth:`run` also raises ``RuntimeError`` after the last step when the learning-rate schedule did not advance by
    exactly ``optimizer_steps_per_step`` per training step (an internal inconsistency; the checkpoint of the last
    step is already written).
    """

    config_class: ClassVar[Type[FinetuningConfig]] = GRPOConfig
    group_metadata_key: ClassVar[str] = "grpo_group"
    title: ClassVar[str] = "GRPO"
    config: GRPOConfig
    trainer: Optional[PolicyTrainer] = None
    _start_position: int = 0  # optimizer steps (taken or skipped) when the run started or resumed
    _data_parallel: Optional[DataParallel] = None  # this process's place in a torchrun launch, once joined
    _warned_off_distribution: bool = False  # the warning on calls sampled off the policy's distribution, given once

    # ------------------------------------------------------------------------------------------------ set-up
    def _build_trainer(self) -> Tuple[PolicyTrainer, Any]:
        """The policy trainer; under torchrun, one rank of the data-parallel run, built from the leader's config."""
        from agentbolt.algorithm.grpo.distributed import DataParallel
        from agentbolt.algorithm.grpo.trainer import PolicyTrainer

        if self._data_parallel is None or self._data_parallel.closed:
            self._data_parallel = DataParallel.from_environment(
                device=self.config.device, timeout=self.config.distributed_timeout
            )
        if self._data_parallel is not None:
            self.config = self._data_parallel.agree_on_config(self.config)
        model, tokenizer = self._load_policy()
        trainer = PolicyTrainer(
            model, self.config, pad_token_id=padding_token_id(tokenizer), data_parallel=self._data_parallel
        )
        return trainer, tokenizer

    # ------------------------------------------------------------------------------------------- data parallel
    def follow(self) -> int:
        """Take part in a data-parallel run as a follower: on ranks 1..N-1 of ``torchrun --nproc_per_node N``.

        Builds the trainer from the leader's (rank 0's) config and model, then computes this rank's share of every
        update the leader makes, until the leader's run ends. Rank 0 runs :meth:`run` (through
        :meth:`agentbolt.Trainer.fit`) as in one process; ``Trainer.fit`` calls this method on the other ranks.

        Returns:
            The number of updates taken part in.

        Raises:
            ValueError: This process is not a follower rank, or the leader refused its config.
            agentbolt.algorithm.grpo.distributed.DistributedUpdateError: The leader or another rank died or stalled.
        """
        from agentbolt.algorithm.grpo.distributed import launched_rank

        rank, world_size = launched_rank()
        if rank == 0:
            raise ValueError(
                f"GRPO.follow() runs on the ranks 1..N-1 of a torchrun launch; this process is rank 0 of {world_size}"
            )
        trainer, _ = self._build_trainer()
        try:
            assert trainer.data_parallel is not None
            return trainer.data_parallel.follow(trainer)
        finally:
            trainer.close()

    def _run_as_follower(self) -> bool:
        from agentbolt.algorithm.grpo.distributed import launched_rank

        if launched_rank()[0] == 0:
            return False
        self.follow()
        return True

    def _default_adapter(self) -> Any:
        """The Trainer's adapter when it reads the gateway's spans, else ``LlmProxyTraceToTriplet``.

        GRPO trains on the token ids the gateway records, which only ``LlmProxyTraceToTriplet`` reads. The
        ``agent_match`` of a Trainer's ``TracerTraceToTriplet`` (``Trainer(adapter={"agent_match": ...})``) is
        carried over; any other adapter is replaced with a warning (pass it as ``GRPO(adapter=...)`` to use it).
        """
        from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet

        try:
            adapter = self.get_adapter()
        except ValueError:
            adapter = None
        if adapter is None or isinstance(adapter, LlmProxyTraceToTriplet):
            return adapter or LlmProxyTraceToTriplet()
        if isinstance(adapter, TracerTraceToTriplet):
            return LlmProxyTraceToTriplet(agent_match=adapter.agent_match)
        if getattr(self, "_replaced_adapter", None) is not adapter:
            self._replaced_adapter = adapter
            logger.warning(
                "GRPO reads the LLM gateway's spans with LlmProxyTraceToTriplet and ignores the Trainer's adapter "
                "%s; pass it as GRPO(adapter=...) to use it instead.",
                type(adapter).__name__,
            )
        return LlmProxyTraceToTriplet()

    # -------------------------------------------------------------------------------------------------- phases
    def _score(self, outcome: RolloutOutcome) -> Optional[float]:
        """The final reward a rollout counts with: its own, else ``failed_rollout_reward`` (None: not counted)."""
        return outcome.reward if outcome.usable else self.config.failed_rollout_reward

    def _samples(
        self, outcomes: Sequence[RolloutOutcome], vocab_size: Optional[int] = None
    ) -> Tuple[List[TokenSample], SampleStats, List[RolloutScore]]:
        """The samples of every counted rollout (calls with a token id outside the model's ``vocab_size`` left out),
        what was skipped, and each counted rollout's score."""
        samples: List[TokenSample] = []
        stats = SampleStats()
        scores: List[RolloutScore] = []
        for outcome in outcomes:
            score = self._score(outcome)
            if score is None:
                continue
            scores.append(RolloutScore(outcome.rollout_id, outcome.group_id, score))
            found, found_stats = triplets_to_samples(
                outcome.triplets,
                rollout_id=outcome.rollout_id,
                group_id=outcome.group_id,
                final_reward=score,
                credit=self.config.credit,
                agent_match=self.config.agent_match,
                max_sequence_length=self.config.max_sequence_length,
                vocab_size=vocab_size,
            )
            samples.extend(found)
            stats.add(found_stats)
        return samples, stats, scores

    def _groups_without_signal(self, outcomes: Sequence[RolloutOutcome], vocab_size: Optional[int]) -> int:
        """Groups of ``outcomes`` the update would train no sample of, judged as the update judges them: by the
        advantages of their samples (so by per-call rewards under ``credit="per_call"``), a group whose rollouts
        made no trainable call or were all dropped counting as one without a signal."""
        samples, _, scores = self._samples(outcomes, vocab_size)
        kept, _ = assign_advantages(
            samples, rollouts=scores, mode=self.config.advantage_mode, eps=self.config.advantage_eps
        )
        return len({o.group_id for o in outcomes} - {sample.group_id for sample in kept})

    def _nothing_trained(self, samples: Sequence[TokenSample], advantages: AdvantageStats) -> str:
        """Why a step with ``samples`` and these group statistics has no sample to train on."""
        if not samples:
            return (
                "no LLM call of the step can be trained on: the rollouts made none (or failed before their first), or "
                "their calls were of other agents than agent_match, without token ids, or longer than "
                "max_sequence_length (see the rollouts/* and samples/* counts)."
            )
        if advantages.groups == 0 or advantages.zero_variance_groups < advantages.groups:
            return "no sample has a non-zero advantage (the groups with different rewards made no trainable call)."
        configured = self.config.sampling_parameters.get("temperature")
        temperatures = sorted({sample.temperature for sample in samples})
        used = ", ".join(f"{t:g}" for t in temperatures)
        if configured is None:
            setting = " (sampling_parameters sets no temperature)"
        elif temperatures != [configured]:  # the agent did not sample as configured
            setting = f" (sampling_parameters sets {configured:g})"
        else:
            setting = ""
        cause = (
            "the calls were sampled greedily, so the rollouts of a task all give the same answer: sample training "
            "calls at a temperature > 0 (the agent should pass the main_llm resource's sampling_parameters)"
            if all(sample.temperature == 0 for sample in samples)
            else "the policy always or never solves these tasks at this temperature: a higher temperature, a reward "
            "with partial credit, other tasks, or resample_rounds give groups a signal"
        )
        rewards = sorted({sample.reward for sample in samples})
        seen = ", ".join(f"{r:g}" for r in rewards[:5]) + (", ..." if len(rewards) > 5 else "")
        return (
            f"in each of the {advantages.groups} group(s) every rollout got the same reward (rewards seen: {seen}), "
            f"so no rollout has an advantage. The step's LLM calls were sampled at temperature {used}{setting}; "
            f"likely cause: {cause}."
        )

    async def _train_step(
        self,
        store: LightningStore,
        proxy: LLMProxy,
        server: PolicyServer,
        trainer: PolicyTrainer,
        tokenizer: Any,
        tasks: Sequence[Any],
        resources_id: str,
        step: int,
    ) -> Dict[str, float]:
        config = self.config
        started = time.perf_counter()
        outcomes = await self._run_rollouts(
            store, tasks, mode="train", step=step, resources_id=resources_id, copies=config.group_size
        )
        groups_run = len(tasks)
        vocab_size = model_vocab_size(trainer.model)
        for _ in range(config.resample_rounds):
            # groups with a signal still wanted
            missing = len(tasks) - (groups_run - self._groups_without_signal(outcomes, vocab_size))
            if missing <= 0 or self._draw_tasks is None:
                break
            more = self._draw_tasks(missing)
            outcomes += await self._run_rollouts(
                store,
                more,
                mode="train",
                step=step,
                resources_id=resources_id,
                copies=config.group_size,
                first_group=groups_run,
            )
            groups_run += len(more)
        rollout_seconds = time.perf_counter() - started
        samples, sample_stats, scores = self._samples(outcomes, vocab_size)
        if sample_stats.out_of_vocabulary:
            logger.warning(
                "%d LLM call(s) of step %d hold token ids outside the vocabulary of the model being trained: their ids "
                "were made by another model's tokenizer, so they are not trained on (samples/out_of_vocabulary)",
                sample_stats.out_of_vocabulary,
                step,
            )
        if sample_stats.off_distribution and not self._warned_off_distribution:
            self._warned_off_distribution = True
            logger.warning(
                "%d LLM call(s) of step %d were sampled with parameters that change the sampled distribution "
                "(guided decoding, top_p < 1, penalties...), set by the agent on its requests: their tokens were not "
                "drawn from the policy GRPO scores them under, so updating on them is a heuristic, not the policy "
                "gradient (samples/off_distribution counts them every step; docs/grpo.md)",
                sample_stats.off_distribution,
                step,
            )
        kept, adv_stats = assign_advantages(
            samples, rollouts=scores, mode=config.advantage_mode, eps=config.advantage_eps
        )
        failed = {o.rollout_id for o in outcomes if not o.usable}
        mean, std = mean_std([s.reward for s in scores])
        record: Dict[str, float] = {
            "train/reward_mean": mean,
            "train/reward_std": std,
            "rollouts/total": float(len(outcomes)),
            "rollouts/failed": float(len(failed)),
            "rollouts/failed_scored": float(sum(1 for s in scores if s.rollout_id in failed)),
            "rollouts/late": float(sum(1 for o in outcomes if o.status == "late")),
            **sample_stats.as_metrics("samples/"),
            "samples/from_failed": float(sum(1 for s in samples if s.rollout_id in failed)),
            "samples/trained": float(len(kept)),
            "groups/total": float(adv_stats.groups),
            "groups/zero_variance": float(adv_stats.zero_variance_groups),
            "groups/resampled": float(groups_run - len(tasks)),
        }
        update_started = time.perf_counter()
        if kept:
            metrics = await self._update_weights(server, trainer, lambda: trainer.train_step(kept))
        else:
            metrics = trainer.skip_step()
            logger.warning("Step %d: the policy is unchanged: %s", step, self._nothing_trained(samples, adv_stats))
        record.update({f"update/{k}": v for k, v in metrics.items()})
        record["time/rollout_seconds"] = rollout_seconds
        record["time/update_seconds"] = time.perf_counter() - update_started
        record["time/step_seconds"] = time.perf_counter() - started
        return record

    # ------------------------------------------------------------------------------------------------------ run
    def _after_resume(self, trainer: PolicyTrainer) -> None:
        """Warn when a resumed schedule is not where these options would have put it."""
        config = self.config
        start_step = trainer.global_step
        self._start_position = self._schedule_position(trainer)
        if self._start_position != start_step * config.optimizer_steps_per_step:
            logger.warning(
                "Resumed at step %d after %d optimizer steps (taken or skipped), but this config takes %d per step: "
                "the learning-rate schedule is not where these options would have put it.",
                start_step,
                self._start_position,
                config.optimizer_steps_per_step,
            )
        planned = config.max_steps * config.optimizer_steps_per_step
        if config.total_optimizer_steps is not None and config.total_optimizer_steps != planned:
            logger.info(
                "The learning-rate decay spans total_optimizer_steps=%d optimizer steps; this run takes %d.",
                config.total_optimizer_steps,
                planned,
            )

    def _after_last_step(self, trainer: PolicyTrainer, start_step: int) -> None:
        """Raises RuntimeError when the schedule did not advance by ``optimizer_steps_per_step`` per step (the
        checkpoint of the last step is already written)."""
        self._check_schedule(trainer, start_step, self._start_position)

    @staticmethod
    def _schedule_position(trainer: PolicyTrainer) -> int:
        """Optimizer steps the learning-rate schedule has advanced by: taken plus skipped."""
        return trainer.optimizer_steps + trainer.skipped_optimizer_steps

    def _check_schedule(self, trainer: PolicyTrainer, start_step: int, start_position: int) -> None:
        """Every training step must advance the schedule by exactly ``optimizer_steps_per_step``.

        Raises:
            RuntimeError: It did not, so the learning rate did not follow the steps the schedule was sized for.
        """
        steps = max(0, self.config.max_steps - start_step)
        expected = steps * self.config.optimizer_steps_per_step
        advanced = self._schedule_position(trainer) - start_position
        if advanced != expected:
            raise RuntimeError(
                f"the learning-rate schedule advanced by {advanced} optimizer steps over {steps} training steps, "
                f"expected {expected} ({self.config.optimizer_steps_per_step} per step)"
            )
