"""``SFT``: supervised fine-tuning of the model behind your agent, from the LLM calls of its best rollouts.

One training step:

1. **collect**: take ``batch_size`` tasks, enqueue each ``rollouts_per_task`` times with the current ``main_llm``
   resource (the model being trained, or a teacher model when distilling), wait for the rollouts and read the LLM
   calls of each succeeded one from its spans; each call's reward is propagated from the rewards the agent emitted
   (``reward_propagation``) and calls of agents not matching ``agent_match`` are dropped;
2. **select**: turn the calls into token sequences (the gateway's exact token ids, or the chat messages rendered with
   the model's chat template) and keep those the selection rules accept (:mod:`~agentbolt.algorithm.sft.selection`);
3. **train**: ``epochs`` passes over the selection, loss on the response tokens only
   (:class:`~agentbolt.algorithm.sft.trainer.SFTTrainer`), while the serving engine is paused;
4. **publish**: a new ``main_llm`` resource snapshot routes the next rollouts to the new weights (in the in-process
   engine, or loaded as a new adapter by a remote vLLM-compatible server);

then log metrics, validate every ``val_interval`` steps and checkpoint every ``checkpoint_interval`` steps. A step
whose selection is empty is logged and skipped: the weights stay as they are.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import time
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Type

from agentbolt.algorithm.base import refuse_data_parallel_launch
from agentbolt.algorithm.finetuning.algorithm import (
    FinetuningAlgorithm,
    PolicyServer,
    RolloutOutcome,
    mean_std,
    model_vocab_size,
    padding_token_id,
)
from agentbolt.algorithm.finetuning.config import FinetuningConfig
from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import (
    CallStats,
    ChatSample,
    StudentPrompt,
    TokenizeStats,
    load_student_prompt,
    samples_from_triplets,
    tokenize_samples,
)
from agentbolt.algorithm.sft.selection import SelectionStats, select_samples

if TYPE_CHECKING:
    from agentbolt.algorithm.sft.trainer import SFTTrainer
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore

__all__ = ["SFT", "LLM_CALL_SPANS", "model_vocab_size", "resolve_backend"]

logger = logging.getLogger(__name__)

LLM_CALL_SPANS = r"^(agentbolt\.llm_call|openai\.(chat\.)?completion)$"
"""Span names SFT reads LLM calls from: the gateway's records and the OpenAI SDK instrumentation's, of chat and of
text completions (a text completion is learned as raw text, see :class:`~agentbolt.algorithm.sft.data.ChatSample`)."""


def resolve_backend(config: SFTConfig) -> str:
    """``"unsloth"`` or ``"transformers"``: the backend ``config.backend`` asks for on this machine.

    Raises:
        ImportError: ``backend="unsloth"`` but unsloth is not installed.
        ValueError: ``backend="unsloth"`` without a CUDA device.
    """
    if config.backend == "transformers":
        return "transformers"
    installed = importlib.util.find_spec("unsloth") is not None
    import torch

    cuda = torch.cuda.is_available()
    if config.backend == "unsloth":
        if not installed:
            raise ImportError("backend='unsloth' needs unsloth: pip install 'agentbolt[unsloth]' (CUDA machines only)")
        if not cuda:
            raise ValueError("backend='unsloth' needs a CUDA device; use backend='transformers' on this machine")
        return "unsloth"
    prefix = config.packing == "prefix"  # unsloth's attention does not read tree masks
    return "unsloth" if installed and cuda and config.finetune == "lora" and not prefix else "transformers"


class SFT(FinetuningAlgorithm):
    """Supervised fine-tuning from traces: collect, select, train, publish, repeated ``max_steps`` times.

    Args:
        config: An :class:`SFTConfig`, a dict of its fields, or None for the defaults.
        model: The model to train: a model name or directory (overrides ``config.model``), or an already loaded
            transformers causal LM (then ``tokenizer`` is required). Default: the embedded model.
        tokenizer: Tokenizer of a model object (its chat template renders prompts and training messages).
        adapter: Spans-to-triplets adapter; it must keep each call's messages (``raw_content``) and token ids.
            Default: :class:`~agentbolt.algorithm.sft.data.CallTraceToTriplet` over the gateway's and the OpenAI
            SDK's call spans (:data:`LLM_CALL_SPANS`), every agent kept (``agent_match`` filters after reward
            propagation).
        **overrides: Config fields overriding ``config`` (``SFT(batch_size=16, min_reward=1.0)``).

    Raises:
        pydantic.ValidationError: An option is invalid.
    """

    config_class: ClassVar[Type[FinetuningConfig]] = SFTConfig
    group_metadata_key: ClassVar[str] = "sft_task"
    title: ClassVar[str] = "SFT"
    config: SFTConfig
    trainer: Optional[SFTTrainer] = None
    _student_prompt: Optional[StudentPrompt] = None

    # ------------------------------------------------------------------------------------------------ set-up
    def _run_as_follower(self) -> bool:
        refuse_data_parallel_launch(self)
        return False

    def _default_adapter(self) -> Any:
        from agentbolt.algorithm.sft.data import CallTraceToTriplet

        return CallTraceToTriplet(llm_call_match=LLM_CALL_SPANS)

    def _load_policy(self) -> Tuple[Any, Any]:
        if self._model is None and resolve_backend(self.config) == "unsloth":
            from agentbolt.algorithm.sft.unsloth import load_unsloth_model

            return load_unsloth_model(self.config)
        return super()._load_policy()

    def _build_trainer(self) -> Tuple[SFTTrainer, Any]:
        model, tokenizer = self._load_policy()
        config = self.config
        if self._model is None and resolve_backend(config) == "unsloth":
            config = config.model_copy(update={"gradient_checkpointing": False})  # unsloth checkpoints itself
        return build_sft_trainer(model, tokenizer, config), tokenizer

    def _model_entries(self, server: PolicyServer) -> List[Dict[str, Any]]:
        entries = super()._model_entries(server)
        config = self.config
        if config.uses_teacher:
            params: Dict[str, Any] = {"model": f"openai/{config.teacher_model}", "api_base": config.teacher_url}
            if config.teacher_api_key:
                params["api_key"] = config.teacher_api_key
            entries.append({"model_name": config.teacher_model, "litellm_params": params})
        return entries

    # -------------------------------------------------------------------------------------------------- phases
    def _chat_samples(self, outcomes: Sequence[RolloutOutcome]) -> Tuple[List[ChatSample], CallStats]:
        """The chat samples of every succeeded rollout (a task is a rollout group), and the calls skipped."""
        samples: List[ChatSample] = []
        stats = CallStats()
        for outcome in outcomes:
            if outcome.status != "succeeded":
                continue
            found, found_stats = samples_from_triplets(
                outcome.triplets,
                final_reward=outcome.reward,
                propagation=self.config.reward_propagation,
                agent_match=self.config.agent_match,
                rollout_id=outcome.rollout_id,
                task_id=outcome.group_id,
                student_prompt=self._student_prompt,
            )
            samples.extend(found)
            stats.add(found_stats)
        return samples, stats

    async def _train_step(
        self,
        store: LightningStore,
        proxy: LLMProxy,
        server: PolicyServer,
        trainer: SFTTrainer,
        tokenizer: Any,
        tasks: Sequence[Any],
        resources_id: str,
        step: int,
    ) -> Dict[str, float]:
        config = self.config
        started = time.perf_counter()
        if config.uses_teacher:  # training rollouts call the teacher
            resources_id = await self._publish(
                store, proxy, server, config.sampling_parameters, model=config.teacher_model
            )
        outcomes = await self._run_rollouts(
            store, tasks, mode="train", step=step, resources_id=resources_id, copies=config.rollouts_per_task
        )
        collect_seconds = time.perf_counter() - started
        chat_samples, call_stats = self._chat_samples(outcomes)
        tokenized, token_stats = tokenize_samples(
            chat_samples, tokenizer, **config.tokenize_options(trainer.max_length, model_vocab_size(trainer.model))
        )
        selected, selection = select_samples(
            tokenized, **config.selection_options(), rng=random.Random(config.seed * 1_000_003 + step)
        )
        usable = [o for o in outcomes if o.usable]
        mean, std = mean_std([o.reward for o in usable])  # type: ignore[misc]
        with_calls = {s.rollout_id for s in chat_samples}
        record: Dict[str, float] = {
            "train/reward_mean": mean,
            "train/reward_std": std,
            "train/success": sum(1 for o in outcomes if o.reached(config.val_success_reward)) / len(outcomes),
            "rollouts/total": float(len(outcomes)),
            "rollouts/failed": float(sum(1 for o in outcomes if not o.usable)),
            "rollouts/late": float(sum(1 for o in outcomes if o.status == "late")),
            "rollouts/without_calls": float(
                sum(1 for o in outcomes if o.status == "succeeded" and o.rollout_id not in with_calls)
            ),
            **call_stats.as_metrics("samples/"),
            **token_stats.as_metrics("samples/"),
            **selection.as_metrics("select/"),
        }
        update_started = time.perf_counter()
        if selected:
            metrics = await self._update_weights(server, trainer, lambda: trainer.train_epochs(selected))
        else:
            metrics = trainer.skip_step()
            logger.warning(
                "Step %d: no sample was selected (%d calls from %d rollouts; %s); the step is skipped and the "
                "weights are unchanged.",
                step,
                len(chat_samples),
                len(outcomes),
                empty_selection_reasons(call_stats, token_stats, selection),
            )
        record.update({f"update/{k}": v for k, v in metrics.items()})
        record["time/collect_seconds"] = collect_seconds
        record["time/update_seconds"] = time.perf_counter() - update_started
        record["time/step_seconds"] = time.perf_counter() - started
        return record

    def _check_run(self) -> None:
        """A decaying learning rate needs its length (how many optimizer steps a run takes depends on what each
        step selects), and a student prompt must be importable before anything runs.

        Raises:
            ValueError: ``lr_scheduler`` is not constant and ``total_optimizer_steps`` is not set, or periodic
                checkpoints have no directory (the base class's checks).
            agentbolt.utils.imports.ImportReferenceError: ``student_prompt`` names no importable function.
        """
        super()._check_run()
        config = self.config
        self._student_prompt = load_student_prompt(config.student_prompt)
        if config.lr_scheduler != "constant" and config.total_optimizer_steps is None:
            raise ValueError(
                f"lr_scheduler={config.lr_scheduler!r} needs total_optimizer_steps: the optimizer steps of a run "
                "depend on how many samples each step selects"
            )


def empty_selection_reasons(calls: CallStats, tokens: TokenizeStats, selection: SelectionStats) -> str:
    """The non-zero drop counters (``"too long: 4, below_min_reward: 2"``), saying why a selection is empty."""
    reasons = {
        "other agents' calls (agent_match)": calls.other_agents,
        "without usable data": tokens.unusable + tokens.missing_tokens + calls.without_data,
        "too long": tokens.too_long,
        **selection.as_metrics(""),
    }
    shown = {name: int(value) for name, value in reasons.items() if value and name not in ("candidates", "selected")}
    return ", ".join(f"{name}: {count}" for name, count in shown.items()) or "no LLM call was recorded"


def sample_length_limit(model: Any, config: SFTConfig) -> int:
    """Longest sample in tokens: ``max_sequence_length``, else the model's context length (2048 if unknown)."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    limit = config.max_sequence_length or int(context or 2048)
    if context and limit > int(context):
        logger.warning("max_sequence_length=%d exceeds the model's context (%d tokens)", limit, context)
    return limit


def build_sft_trainer(model: Any, tokenizer: Any, config: SFTConfig) -> SFTTrainer:
    """An :class:`SFTTrainer` for ``model``, padding with the tokenizer's pad (else EOS) token."""
    from agentbolt.algorithm.sft.trainer import SFTTrainer

    return SFTTrainer(
        model, config, pad_token_id=padding_token_id(tokenizer), max_length=sample_length_limit(model, config)
    )
