"""``GRPO``: the algorithm that drives rollouts through the store and trains the policy on them.

One training step:

1. take ``batch_size`` tasks and enqueue each ``group_size`` times (one group per task) with the current
   ``main_llm`` resource;
2. wait for the rollouts; failed, cancelled, late and reward-less ones are counted and scored with
   ``failed_rollout_reward`` (or dropped when it is None);
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

import asyncio
import logging
import os
import random
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence, Tuple, Union

from agentbolt.algorithm.base import Algorithm
from agentbolt.algorithm.grpo.advantages import RolloutScore, assign_advantages
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import SampleStats, TokenSample, triplets_to_samples
from agentbolt.store.utils import wait_for_finished_rollouts
from agentbolt.types import LLM, EnqueueRolloutRequest, NamedResources, Rollout, RolloutMode, Span

if TYPE_CHECKING:
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore
    from agentbolt.utils.server_launcher import LaunchMode

__all__ = ["GRPO", "PolicyServer", "RolloutOutcome", "TaskSampler"]

logger = logging.getLogger(__name__)

POLICY_RESOURCE = "main_llm"
SPAN_SETTLE_SECONDS = 2.0


class PolicyServer(Protocol):
    """Serves the policy being trained over an OpenAI-compatible endpoint."""

    base_url: str
    """Endpoint agents (or the gateway) call, ending in ``/v1``."""
    model_name: str
    """Model name to request."""

    def weights_update(self) -> AbstractContextManager[Any]:
        """Context held while the trainer changes the weights (generation pauses)."""

    def after_update(self, trainer: PolicyTrainer) -> None:
        """Make the server use the weights just trained (no-op when it shares the model object)."""

    def stop(self) -> None:
        """Release the server."""


class TaskSampler:
    """Deterministic, resumable batches of dataset indices.

    Each epoch is a permutation drawn from ``seed`` and the epoch number; batches run through it and continue into the
    next epoch, so every task is used once per epoch. The state is two integers, saved with checkpoints.
    """

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("the training dataset is empty")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> List[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self) -> List[int]:
        """The next ``batch_size`` indices."""
        order = self._order()
        batch: List[int] = []
        while len(batch) < self.batch_size:
            if self.position >= self.size:
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            batch.append(order[self.position])
            self.position += 1
        return batch

    def state(self) -> Dict[str, int]:
        """Position to save."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: Dict[str, Any]) -> None:
        """Restore a saved position."""
        self.epoch, self.position = int(state.get("epoch", 0)), int(state.get("position", 0))


class RolloutOutcome:
    """What came back from one rollout.

    ``status`` is the rollout's final status, or ``"late"`` when it did not finish in time (it is then cancelled).
    ``reward`` is the final reward of a succeeded rollout (None otherwise); ``triplets`` are the LLM calls of its
    latest attempt, whatever its status.
    """

    def __init__(self, rollout_id: str, group_id: str, status: str, reward: Optional[float], triplets: List[Any]):
        self.rollout_id = rollout_id
        self.group_id = group_id
        self.status = status
        self.reward = reward
        self.triplets = triplets

    @property
    def usable(self) -> bool:
        """Succeeded with a reward."""
        return self.status == "succeeded" and self.reward is not None


def _mean_std(values: Sequence[float]) -> Tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


class GRPO(Algorithm):
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
    """

    def __init__(
        self,
        config: Union[GRPOConfig, Dict[str, Any], None] = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        adapter: Any = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        base = config.model_dump() if isinstance(config, GRPOConfig) else dict(config or {})
        base.update(overrides)
        if isinstance(model, str):
            base["model"] = model
            model = None
        self.config = GRPOConfig(**base)
        if model is not None and tokenizer is None:
            raise ValueError("a model object needs its tokenizer: GRPO(model=model, tokenizer=tokenizer)")
        self._model = model
        self._tokenizer = tokenizer
        self._adapter = adapter
        self._gateway: Optional[LLMProxy] = None  # the proxy recording the rollouts' LLM calls, once started
        self.trainer: Optional[PolicyTrainer] = None
        self.history: List[Dict[str, float]] = []

    @property
    def reports_progress(self) -> bool:
        """With ``console`` on, GRPO shows its own progress bar and per-step metrics."""
        return self.config.console

    # ------------------------------------------------------------------------------------------------ set-up
    def _load_policy(self) -> Tuple[Any, Any]:
        if self._model is not None:
            return self._model, self._tokenizer
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentbolt.models import DEFAULT_MODEL, resolve_model

        name = self.config.model or DEFAULT_MODEL
        resolved = resolve_model(name)
        if resolved.source == "gguf":
            raise ValueError(f"GRPO trains a Hugging Face model directory, not a GGUF file: {name!r}")
        tokenizer = AutoTokenizer.from_pretrained(resolved.path)
        model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype="float32")
        return model, tokenizer

    def _build_trainer(self) -> Tuple[PolicyTrainer, Any]:
        from agentbolt.algorithm.grpo.trainer import PolicyTrainer

        model, tokenizer = self._load_policy()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        return PolicyTrainer(model, self.config, pad_token_id=int(pad)), tokenizer

    def _served_name(self) -> str:
        return self.config.served_model_name or self.config.model or "policy"

    def _triplet_adapter(self) -> Any:
        if self._adapter is not None:
            return self._adapter
        from agentbolt.adapter import LlmProxyTraceToTriplet

        try:
            adapter = self.get_adapter()
        except ValueError:
            adapter = None
        return adapter if isinstance(adapter, LlmProxyTraceToTriplet) else LlmProxyTraceToTriplet()

    async def _start_gateway(self, store: LightningStore, server: PolicyServer) -> Tuple[LLMProxy, bool]:
        """Route the served policy through the LLM gateway (the trainer's proxy, or one started here)."""
        from agentbolt.llm_proxy import LLMProxy

        proxy = self.get_llm_proxy()
        owned = proxy is None
        if proxy is None:
            capabilities = store.capabilities
            mode: LaunchMode = (
                "thread" if capabilities.get("thread_safe") else "asyncio" if capabilities.get("async_safe") else "mp"
            )
            proxy = LLMProxy(store=store, launch_mode=mode, host="127.0.0.1")
            proxy.server_launcher_args.log_level = logging.WARNING  # an internal server: no uvicorn lifecycle lines
        else:
            proxy.set_store(store)
        changed = self._route(proxy, server)
        if not proxy.is_running():
            await proxy.start()
        elif changed and proxy.server_launcher_args.launch_mode == "mp":
            await proxy.restart()  # a server in another process only reads the model list when it starts
        self._gateway = proxy
        return proxy, owned

    @staticmethod
    def _route(proxy: LLMProxy, server: PolicyServer) -> bool:
        """Point the gateway's model list at the served policy; True when it changed."""
        entry = {
            "model_name": server.model_name,
            "litellm_params": {"model": f"agentbolt/{server.model_name}", "api_base": server.base_url},
        }
        if proxy.model_list == [entry]:
            return False
        proxy.update_model_list([entry])  # type: ignore[list-item]
        return True

    async def _publish(
        self, store: LightningStore, proxy: LLMProxy, server: PolicyServer, sampling_parameters: Dict[str, Any]
    ) -> str:
        """Store a new resource snapshot whose ``main_llm`` routes to the current policy weights."""
        if self._route(proxy, server) and proxy.is_running() and proxy.server_launcher_args.launch_mode == "mp":
            await proxy.restart()  # a server in another process only reads the model list when it starts
        resources: NamedResources = dict(self.get_initial_resources() or {})
        llm: LLM = proxy.as_resource(model=server.model_name, sampling_parameters=dict(sampling_parameters))
        resources[POLICY_RESOURCE] = llm
        update = await store.add_resources(resources)
        return update.resources_id

    # -------------------------------------------------------------------------------------------------- rollouts
    async def _run_rollouts(
        self,
        store: LightningStore,
        tasks: Sequence[Tuple[Any, str]],
        *,
        mode: RolloutMode,
        resources_id: str,
    ) -> List[RolloutOutcome]:
        """Enqueue ``(task, group_id)`` pairs, wait for them and collect rewards and triplets."""
        requests = [
            EnqueueRolloutRequest(
                input=task,
                mode=mode,
                resources_id=resources_id,
                metadata={"grpo_group": group},  # type: ignore[arg-type]
            )
            for task, group in tasks
        ]
        rollouts = list(await store.enqueue_many_rollouts(requests))
        groups = {r.rollout_id: group for r, (_, group) in zip(rollouts, tasks, strict=True)}
        finished = await self._wait(store, [r.rollout_id for r in rollouts])
        adapter = self._triplet_adapter()
        from agentbolt.emitter import find_final_reward

        outcomes: List[RolloutOutcome] = []
        for rollout in rollouts:
            done = finished.get(rollout.rollout_id)
            status = "late" if done is None else done.status
            if done is None:
                await store.update_rollout(rollout.rollout_id, status="cancelled")
            # The calls of failed and late rollouts are collected too: they are trained on with failed_rollout_reward.
            spans = await self._settled_spans(store, rollout.rollout_id)
            triplets = list(adapter.adapt(spans)) if spans else []
            reward = find_final_reward(spans) if status == "succeeded" else None
            outcomes.append(RolloutOutcome(rollout.rollout_id, groups[rollout.rollout_id], status, reward, triplets))
        return outcomes

    async def _settled_spans(self, store: LightningStore, rollout_id: str) -> List[Span]:
        """The latest attempt's spans, once every span whose sequence id the store issued has arrived.

        Spans are written asynchronously (the gateway writes its call spans off the hot path), so a rollout can be
        reported finished while the span of its last LLM call is still on its way: the gateway's ``flush`` waits
        for those. For spans of other sources, the store issues sequence ids 1, 2, 3... per rollout, so a gap below
        the highest stored id means a span is still in flight: wait for it, at most ``SPAN_SETTLE_SECONDS``.
        """
        if self._gateway is not None:
            await self._gateway.flush(SPAN_SETTLE_SECONDS)
        deadline = time.monotonic() + SPAN_SETTLE_SECONDS
        while True:
            spans = list(await store.query_spans(rollout_id))
            ids = {span.sequence_id for span in spans}
            if not ids or len(ids) >= max(ids) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        if ids and len(ids) < max(ids):
            logger.warning("Rollout %s: spans %s never arrived.", rollout_id, sorted(set(range(1, max(ids) + 1)) - ids))
        latest = await store.get_latest_attempt(rollout_id)
        return [span for span in spans if latest is None or span.attempt_id == latest.attempt_id]

    async def _wait(self, store: LightningStore, rollout_ids: List[str]) -> Dict[str, Rollout]:
        return await wait_for_finished_rollouts(store, rollout_ids, timeout=self.config.rollout_timeout)

    # -------------------------------------------------------------------------------------------------- phases
    async def _validate(
        self, store: LightningStore, proxy: LLMProxy, server: PolicyServer, val_dataset: Sequence[Any], step: int
    ) -> Dict[str, float]:
        resources_id = await self._publish(store, proxy, server, self.config.val_sampling_parameters)
        tasks = [(task, f"val-{step}-{i}") for i, task in enumerate(val_dataset)]
        outcomes = await self._run_rollouts(store, tasks, mode="val", resources_id=resources_id)
        correct = sum(1 for o in outcomes if o.usable and o.reward >= self.config.val_success_reward)  # type: ignore[operator]
        mean, _ = _mean_std([score for score in map(self._score, outcomes) if score is not None])
        return {
            "val/reward_mean": mean,
            "val/accuracy": correct / len(outcomes) if outcomes else float("nan"),
            "val/failed_rollouts": float(sum(1 for o in outcomes if not o.usable)),
        }

    def _score(self, outcome: RolloutOutcome) -> Optional[float]:
        """The final reward a rollout counts with: its own, else ``failed_rollout_reward`` (None: not counted)."""
        return outcome.reward if outcome.usable else self.config.failed_rollout_reward

    def _samples(self, outcomes: Sequence[RolloutOutcome]) -> Tuple[List[TokenSample], SampleStats, List[RolloutScore]]:
        """The samples of every counted rollout, what was skipped, and each counted rollout's score."""
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
            )
            samples.extend(found)
            stats.add(found_stats)
        return samples, stats, scores

    async def _train_step(
        self,
        store: LightningStore,
        server: PolicyServer,
        trainer: PolicyTrainer,
        tasks: Sequence[Any],
        resources_id: str,
        step: int,
    ) -> Dict[str, float]:
        config = self.config
        started = time.perf_counter()
        pairs = [(task, f"train-{step}-{i}") for i, task in enumerate(tasks) for _ in range(config.group_size)]
        outcomes = await self._run_rollouts(store, pairs, mode="train", resources_id=resources_id)
        rollout_seconds = time.perf_counter() - started
        samples, sample_stats, scores = self._samples(outcomes)
        kept, adv_stats = assign_advantages(
            samples, rollouts=scores, mode=config.advantage_mode, eps=config.advantage_eps
        )
        failed = {o.rollout_id for o in outcomes if not o.usable}
        mean, std = _mean_std([s.reward for s in scores])
        record: Dict[str, float] = {
            "train/reward_mean": mean,
            "train/reward_std": std,
            "rollouts/total": float(len(outcomes)),
            "rollouts/failed": float(len(failed)),
            "rollouts/failed_scored": float(sum(1 for s in scores if s.rollout_id in failed)),
            "rollouts/late": float(sum(1 for o in outcomes if o.status == "late")),
            "samples/calls": float(sample_stats.calls),
            "samples/from_failed": float(sum(1 for s in samples if s.rollout_id in failed)),
            "samples/trained": float(len(kept)),
            "samples/other_agents": float(sample_stats.other_agents),
            "samples/missing_tokens": float(sample_stats.missing_tokens),
            "samples/too_long": float(sample_stats.too_long),
            "samples/missing_logprobs": float(sample_stats.missing_logprobs),
            "groups/total": float(adv_stats.groups),
            "groups/zero_variance": float(adv_stats.zero_variance_groups),
        }
        update_started = time.perf_counter()
        if kept:

            def update() -> Dict[str, float]:
                with server.weights_update():
                    metrics = trainer.train_step(kept)
                server.after_update(trainer)
                return metrics

            metrics = await asyncio.to_thread(update)
        else:
            metrics = trainer.skip_step()
            logger.warning("Step %d: no sample with a non-zero advantage; the policy is unchanged.", step)
        record.update({f"update/{k}": v for k, v in metrics.items()})
        record["time/rollout_seconds"] = rollout_seconds
        record["time/update_seconds"] = time.perf_counter() - update_started
        record["time/step_seconds"] = time.perf_counter() - started
        return record

    # ------------------------------------------------------------------------------------------------------ run
    async def run(  # type: ignore[override]  # datasets must be sized sequences here
        self, train_dataset: Optional[Sequence[Any]] = None, val_dataset: Optional[Sequence[Any]] = None
    ) -> None:
        """Train on ``train_dataset`` for ``max_steps`` steps, validating on ``val_dataset``.

        Raises:
            ValueError: No training data while ``max_steps > 0``, or no store set.
            RuntimeError: After the last step, when the learning-rate schedule did not advance by exactly
                ``optimizer_steps_per_step`` per training step (an internal inconsistency; the checkpoint of the
                last step is already written).
        """
        config = self.config
        store = self.get_store()
        train = list(train_dataset or [])
        val = list(val_dataset or [])
        if config.max_steps > 0 and not train:
            raise ValueError("GRPO needs a non-empty train_dataset (or max_steps=0 to only validate)")
        from agentbolt.algorithm.grpo.metrics import TrainingLogger
        from agentbolt.algorithm.grpo.trainer import latest_checkpoint

        trainer, tokenizer = await asyncio.to_thread(self._build_trainer)
        self.trainer = trainer
        sampler = TaskSampler(len(train), config.batch_size, config.seed) if train else None
        if config.checkpoint_dir and config.resume:
            path = latest_checkpoint(config.checkpoint_dir)
            if path is not None:
                extra = await asyncio.to_thread(trainer.load_checkpoint, path)
                if sampler is not None:
                    sampler.load_state(extra.get("sampler", {}))
        start_step = trainer.global_step
        start_counts = self._schedule_position(trainer)
        if start_counts != start_step * config.optimizer_steps_per_step:
            logger.warning(
                "Resumed at step %d after %d optimizer steps (taken or skipped), but this config takes %d per step: "
                "the learning-rate schedule is not where these options would have put it.",
                start_step,
                start_counts,
                config.optimizer_steps_per_step,
            )
        planned = config.max_steps * config.optimizer_steps_per_step
        if config.total_optimizer_steps is not None and config.total_optimizer_steps != planned:
            logger.info(
                "The learning-rate decay spans total_optimizer_steps=%d optimizer steps; this run takes %d.",
                config.total_optimizer_steps,
                planned,
            )
        metrics = TrainingLogger(
            log_dir=config.log_dir,
            total_steps=config.max_steps,
            start_step=start_step,
            console=config.console,
            tensorboard=config.tensorboard,
            wandb_project=config.wandb_project,
            run_config=config.model_dump(),
        )
        try:
            server = await asyncio.to_thread(self._start_server, trainer, tokenizer)
        except BaseException:
            metrics.close()
            raise
        proxy: Optional[LLMProxy] = None
        owned_proxy = False
        try:
            proxy, owned_proxy = await self._start_gateway(store, server)
            if val and config.val_before_train and start_step == 0:
                self._record(metrics, 0, await self._validate(store, proxy, server, val, 0))
            resources_id = await self._publish(store, proxy, server, config.sampling_parameters)
            for step in range(start_step + 1, config.max_steps + 1):
                assert sampler is not None
                tasks = [train[i] for i in sampler.next_batch()]
                record = await self._train_step(store, server, trainer, tasks, resources_id, step)
                resources_id = await self._publish(store, proxy, server, config.sampling_parameters)
                periodic = config.val_interval > 0 and step % config.val_interval == 0
                if val and (periodic or step == config.max_steps):
                    record.update(await self._validate(store, proxy, server, val, step))
                    resources_id = await self._publish(store, proxy, server, config.sampling_parameters)
                self._record(metrics, step, record)
                last = step == config.max_steps
                if config.checkpoint_dir and (
                    last or (config.checkpoint_interval and step % config.checkpoint_interval == 0)
                ):
                    extra = {"sampler": sampler.state()}
                    await asyncio.to_thread(trainer.save_checkpoint, config.checkpoint_dir, extra)
            self._check_schedule(trainer, start_step, start_counts)
        finally:
            curve = metrics.close()
            if curve is not None:
                logger.info("Reward curve written to %s", curve)
            if proxy is not None and owned_proxy and proxy.is_running():
                await proxy.stop()
            await asyncio.to_thread(server.stop)

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

    def _record(self, metrics: Any, step: int, record: Dict[str, float]) -> None:
        self.history.append({"step": float(step), **record})
        metrics.log(step, record)

    def _start_server(self, trainer: PolicyTrainer, tokenizer: Any) -> PolicyServer:
        config = self.config
        if config.policy_server_url is not None:
            import tempfile

            from agentbolt.algorithm.grpo.serving import RemoteAdapterPolicyServer

            adapter_dir = config.adapter_dir or (
                os.path.join(config.checkpoint_dir, "adapters")
                if config.checkpoint_dir
                else tempfile.mkdtemp(prefix="agentbolt-adapters-")
            )
            return RemoteAdapterPolicyServer(
                trainer,
                base_url=config.policy_server_url,
                adapter_dir=adapter_dir,
                name_prefix=self._served_name().replace("/", "-"),
                api_key=config.policy_server_api_key,
            )
        from agentbolt.algorithm.grpo.serving import InProcessPolicyServer

        return InProcessPolicyServer(
            trainer,
            tokenizer,
            model_name=self._served_name(),
            threads=config.threads,
            max_batch_size=config.serve_max_batch_size,
        )
