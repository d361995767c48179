"""Offline SFT: train a model on chat data from a file, a list or a store, without serving or rollouts.

:func:`train_from_messages` is the library entry point: give it a JSONL file (or parquet, or a list of records or
:class:`~agentbolt.algorithm.sft.data.ChatSample`) of chat conversations with tool calls and a model, and it trains
LoRA adapters (or all weights) on the assistant turns and returns the trained model, its tokenizer and where the
adapter was saved. :func:`train_from_store` does the same from the LLM calls recorded in a store.

The run is ``epochs`` passes over the samples in optimizer steps of ``train_batch_size``; each epoch's order is a
permutation drawn from the seed and the epoch number, so a run stopped after any checkpoint and resumed is the same
run (same batches, same optimizer state, same final weights).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import ChatSample, DataError, TokenSample, load_student_prompt, tokenize_samples
from agentbolt.algorithm.sft.selection import select_samples

if TYPE_CHECKING:
    from agentbolt.algorithm.sft.export import ExportFilter

__all__ = ["OfflineResult", "load_chat_samples", "train_from_messages", "train_from_store", "train_samples"]

logger = logging.getLogger(__name__)

ChatData = Union[str, "os.PathLike[str]", Sequence[Union[ChatSample, Dict[str, Any]]]]


@dataclass
class OfflineResult:
    """What an offline SFT run produced.

    Attributes:
        model: The trained model (a ``PeftModel`` with LoRA; the merged plain model when ``merge=True``).
        tokenizer: Its tokenizer.
        adapter_dir: The LoRA adapter in PEFT format (``output_dir/adapter``), when LoRA was trained and an
            ``output_dir`` given. ``PeftModel.from_pretrained(base, adapter_dir)`` or vLLM ``--lora-modules`` load it.
        model_dir: A full model directory (weights and tokenizer) loadable by any model-name argument, when
            ``merge=True`` or full fine-tuning, and an ``output_dir`` given.
        checkpoint: The last checkpoint written (None without ``output_dir``).
        history: One metrics record per optimizer step taken in this call.
        data: Counters of the data path (samples read, tokenized, dropped, selected).
        optimizer_steps: Optimizer steps done in total (resumed steps included).
        total_optimizer_steps: Optimizer steps of the whole run.
    """

    model: Any
    tokenizer: Any
    adapter_dir: Optional[Path] = None
    model_dir: Optional[Path] = None
    checkpoint: Optional[Path] = None
    history: List[Dict[str, float]] = field(default_factory=list)
    data: Dict[str, float] = field(default_factory=dict)
    optimizer_steps: int = 0
    total_optimizer_steps: int = 0

    @property
    def finished(self) -> bool:
        """Every optimizer step of the run is done."""
        return self.optimizer_steps >= self.total_optimizer_steps


def load_chat_samples(data: ChatData) -> List[ChatSample]:
    """Chat samples from a JSONL or parquet file, or a list of records / samples.

    Raises:
        DataError: A missing file, a bad line or record (named), or no sample at all.
    """
    from agentbolt.algorithm.sft.export import read_records, samples_from_records

    if isinstance(data, (str, os.PathLike)):
        samples = samples_from_records(read_records(data), str(data))
        where = str(data)
    else:
        samples = [
            item if isinstance(item, ChatSample) else ChatSample.from_record(item, f"record {i + 1}")
            for i, item in enumerate(data)
        ]
        where = "the data"
    if not samples:
        raise DataError(f"{where} holds no sample")
    return samples


def _epoch_order(size: int, seed: int, epoch: int) -> List[int]:
    order = list(range(size))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def _config(config: Union[SFTConfig, Dict[str, Any], None], overrides: Dict[str, Any]) -> SFTConfig:
    # Offline data is usually curated: keep every sample unless a selection rule is asked for.
    base: Dict[str, Any] = {"top_fraction": None, "console": False}
    base.update(config.model_dump(exclude_unset=True) if isinstance(config, SFTConfig) else dict(config or {}))
    base.update(overrides)
    return SFTConfig(**base)


def train_samples(
    samples: Sequence[TokenSample],
    trainer: Any,
    *,
    checkpoint_dir: Optional[Path] = None,
    stop_after: Optional[int] = None,
) -> List[Dict[str, float]]:
    """Run (or resume) the optimizer steps of ``epochs`` passes over ``samples`` with an SFT trainer.

    The trainer's ``global_step`` counts optimizer steps done; checkpoints go to ``checkpoint_dir`` every
    ``checkpoint_interval`` optimizer steps and after the last one, with the position in the data.

    Args:
        samples: Tokenized samples.
        trainer: An :class:`~agentbolt.algorithm.sft.trainer.SFTTrainer` (possibly resumed).
        checkpoint_dir: Where checkpoints go (None: none).
        stop_after: Take at most this many optimizer steps in this call (the run can be resumed later).

    Returns:
        The metrics of each optimizer step taken.
    """
    config: SFTConfig = trainer.config
    batch = config.train_batch_size
    per_epoch = math.ceil(len(samples) / batch)
    total = config.epochs * per_epoch
    history: List[Dict[str, float]] = []
    end = total if stop_after is None else min(total, trainer.global_step + stop_after)
    for step in range(trainer.global_step, end):
        epoch, index = divmod(step, per_epoch)
        order = _epoch_order(len(samples), config.seed, epoch)
        metrics = trainer.optimizer_step([samples[i] for i in order[index * batch : (index + 1) * batch]])
        trainer.global_step += 1
        history.append({"optimizer_step": float(trainer.global_step), "epoch": float(epoch), **metrics})
        logger.info("SFT optimizer step %d/%d: loss %.4f", trainer.global_step, total, metrics["loss"])
        due = config.checkpoint_interval and trainer.global_step % config.checkpoint_interval == 0
        if checkpoint_dir is not None and (due or trainer.global_step == end):
            trainer.save_checkpoint(checkpoint_dir, {"epoch": epoch, "samples": len(samples)})
    return history


def train_from_messages(
    data: ChatData,
    *,
    model: Any = None,
    tokenizer: Any = None,
    output_dir: Union[str, os.PathLike[str], None] = None,
    config: Union[SFTConfig, Dict[str, Any], None] = None,
    val_data: Optional[ChatData] = None,
    merge: bool = False,
    stop_after: Optional[int] = None,
    **overrides: Any,
) -> OfflineResult:
    """Fine-tune a model on chat conversations (with tool calls): LoRA by default, on a local model.

    Each record is ``{"messages": [...], "tools": [...]}`` (every assistant turn is learned) or
    ``{"prompt": [...], "completion": [...], "tools": [...]}`` (only the completion is learned; the layout
    ``agentbolt export --what samples`` writes), OpenAI message format: ``tool_calls`` on assistant messages,
    ``role: "tool"`` results. The messages are rendered with the model's chat template; the loss covers the
    assistant tokens only. Recorded ``prompt_token_ids`` / ``response_token_ids`` are used instead when present and
    ``data`` is not ``"messages"``.

    Args:
        data: A JSONL or parquet file, or a list of records or :class:`ChatSample`.
        model: A model name or directory (default: ``config.model``, else the embedded model), or a loaded
            transformers causal LM (then ``tokenizer`` is required).
        tokenizer: The tokenizer of a model object.
        output_dir: Where ``checkpoints/``, ``adapter/`` (LoRA) and ``model/`` (merged or full weights) go; with
            ``resume`` (the default) a run finds its latest checkpoint here and continues. None keeps everything in
            memory.
        config: An :class:`SFTConfig` or a dict of its fields. Offline defaults: ``top_fraction=None`` (every sample
            kept) and ``console=False``; ``epochs``, ``train_batch_size``, ``micro_batch_size``, ``learning_rate``,
            ``lr_scheduler``, ``warmup_steps``, ``finetune``, ``lora_*``, ``packing``, ``max_sequence_length``,
            ``overlong``, ``checkpoint_interval`` (in optimizer steps), ``min_reward``/``top_k``... apply.
        val_data: Held-out chat data; its mean NLL per target token is measured before and after training.
        merge: Also save (and return) the model with the LoRA weights merged into it.
        stop_after: Take at most this many optimizer steps now (call again with the same ``output_dir`` to resume).
        **overrides: :class:`SFTConfig` fields overriding ``config``.

    Returns:
        An :class:`OfflineResult` with the trained model.

    Raises:
        DataError: Unreadable data, or no usable sample after tokenization and selection (the counters say why).
        pydantic.ValidationError: An invalid option.
        CheckpointError: A checkpoint in ``output_dir`` is corrupt or does not fit this model and configuration.

    Example:
        >>> from agentbolt.algorithm.sft import train_from_messages
        >>> result = train_from_messages("planner.jsonl", model="smollm2-135m-instruct",
        ...                              output_dir="runs/planner-sft", epochs=2)  # doctest: +SKIP
        >>> result.adapter_dir  # doctest: +SKIP
        PosixPath('runs/planner-sft/adapter')
    """
    settings = _config(config, overrides)
    samples = load_chat_samples(data)
    val_samples = load_chat_samples(val_data) if val_data is not None else None
    return _train(samples, settings, model, tokenizer, output_dir, val_samples, merge, stop_after)


def train_from_store(
    store: Any,
    *,
    filters: Optional[ExportFilter] = None,
    model: Any = None,
    tokenizer: Any = None,
    output_dir: Union[str, os.PathLike[str], None] = None,
    config: Union[SFTConfig, Dict[str, Any], None] = None,
    merge: bool = False,
    stop_after: Optional[int] = None,
    **overrides: Any,
) -> OfflineResult:
    """Fine-tune a model on the LLM calls recorded in a store (a store object, a SQLite file or a server URL).

    Calls are read as SFT reads them while collecting (rewards propagated by ``reward_propagation``, agents
    filtered by ``agent_match``, prompts replaced by ``student_prompt``), then tokenized, selected and trained on as
    in :func:`train_from_messages`.

    Args:
        store: A :class:`~agentbolt.store.base.LightningStore`, a SQLite store file, or an ``http://`` store URL.
        filters: An :class:`~agentbolt.algorithm.sft.export.ExportFilter`. Its fields left at None take the
            defaults: ``status`` succeeded rollouts only, ``agent`` the ``agent_match`` option; ``mode`` and the
            reward bounds none. ``ExportFilter(mode=["train"])`` thus reads the succeeded training rollouts of the
            matched agents; list the statuses to read others (``status=["succeeded", "failed"]``).
        model: See :func:`train_from_messages`.
        tokenizer: See :func:`train_from_messages`.
        output_dir: See :func:`train_from_messages`.
        config: See :func:`train_from_messages`.
        merge: See :func:`train_from_messages`.
        stop_after: See :func:`train_from_messages`.
        **overrides: :class:`SFTConfig` fields overriding ``config``.
    """
    from agentbolt.algorithm.sft.export import ExportFilter, close_store, open_store, store_samples

    settings = _config(config, overrides)
    chosen = _store_filter(filters or ExportFilter(), settings)
    student_prompt = load_student_prompt(settings.student_prompt)

    async def read() -> List[ChatSample]:
        opened = open_store(store) if isinstance(store, (str, os.PathLike)) else None
        try:
            return await store_samples(
                opened or store, chosen, propagation=settings.reward_propagation, student_prompt=student_prompt
            )
        finally:
            if opened is not None:
                await close_store(opened)

    samples = asyncio.run(read())
    if not samples:
        raise DataError(f"the store holds no LLM call to learn from (filters: {chosen})")
    return _train(samples, settings, model, tokenizer, output_dir, None, merge, stop_after)


def _store_filter(filters: ExportFilter, settings: SFTConfig) -> ExportFilter:
    """``filters`` with the fields left at None set to :func:`train_from_store`'s defaults."""
    return replace(
        filters,
        status=filters.status if filters.status is not None else ["succeeded"],
        agent=filters.agent if filters.agent is not None else settings.agent_match,
    )


def _load_model(settings: SFTConfig, model: Any, tokenizer: Any) -> tuple[Any, Any]:
    if model is not None and not isinstance(model, (str, os.PathLike)):
        if tokenizer is None:
            raise ValueError("a model object needs its tokenizer: train_from_messages(..., tokenizer=tokenizer)")
        return model, tokenizer
    from agentbolt.algorithm.sft.algorithm import SFT

    name = str(model) if model is not None else settings.model
    return SFT(settings.model_copy(update={"model": name}))._load_policy()


def _train(
    samples: List[ChatSample],
    settings: SFTConfig,
    model: Any,
    tokenizer: Any,
    output_dir: Union[str, os.PathLike[str], None],
    val_samples: Optional[List[ChatSample]],
    merge: bool,
    stop_after: Optional[int],
) -> OfflineResult:
    from agentbolt.algorithm.finetuning.trainer import latest_checkpoint
    from agentbolt.algorithm.sft.algorithm import build_sft_trainer, sample_length_limit

    loaded, tokenizer = _load_model(settings, model, tokenizer)
    options = settings.tokenize_options(sample_length_limit(loaded, settings))
    tokenized, token_stats = tokenize_samples(samples, tokenizer, **options)
    selected, selection = select_samples(tokenized, **settings.selection_options(), rng=random.Random(settings.seed))
    counters = {**token_stats.as_metrics("samples/"), **selection.as_metrics("select/")}
    if not selected:
        raise DataError(f"no usable sample to train on: {counters}")
    total = settings.optimizer_steps_for(len(selected))
    if settings.total_optimizer_steps is None:
        settings = settings.model_copy(update={"total_optimizer_steps": total})
    trainer = build_sft_trainer(loaded, tokenizer, settings)
    out = Path(output_dir) if output_dir is not None else None
    checkpoint_dir = out / "checkpoints" if out is not None else None
    if checkpoint_dir is not None and settings.resume:
        path = latest_checkpoint(checkpoint_dir)
        if path is not None:
            extra = trainer.load_checkpoint(path)
            if extra.get("samples") not in (None, len(selected)):
                logger.warning(
                    "Resuming %s: it was trained on %s samples, this data gives %d",
                    path,
                    extra["samples"],
                    len(selected),
                )
    val_tokens: List[TokenSample] = []
    if val_samples is not None:
        val_tokens, _ = tokenize_samples(val_samples, tokenizer, **options)
        counters["val/loss_before"] = trainer.evaluate(val_tokens) if val_tokens else math.nan
    history = train_samples(selected, trainer, checkpoint_dir=checkpoint_dir, stop_after=stop_after)
    if val_tokens:
        counters["val/loss_after"] = trainer.evaluate(val_tokens)
    result = OfflineResult(
        model=trainer.model,
        tokenizer=tokenizer,
        checkpoint=latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None,
        history=history,
        data=counters,
        optimizer_steps=trainer.global_step,
        total_optimizer_steps=total,
    )
    if out is not None and result.finished:
        _save_outputs(result, trainer, out, merge)
    elif merge and result.finished:
        result.model = trainer.model.merge_and_unload() if trainer.uses_lora else trainer.model
    return result


def _save_outputs(result: OfflineResult, trainer: Any, out: Path, merge: bool) -> None:
    """Write ``adapter/`` (LoRA) and ``model/`` (merged or full weights, with the tokenizer) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    if trainer.uses_lora:
        result.adapter_dir = out / "adapter"
        trainer.model.save_pretrained(str(result.adapter_dir))
        result.tokenizer.save_pretrained(str(result.adapter_dir))
    if merge or not trainer.uses_lora:
        model = trainer.model.merge_and_unload() if trainer.uses_lora else trainer.model
        result.model_dir = out / "model"
        model.save_pretrained(str(result.model_dir))
        result.tokenizer.save_pretrained(str(result.model_dir))
        result.model = model
