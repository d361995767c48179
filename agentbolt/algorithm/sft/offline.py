"""Offline SFT: train a model on chat data from a file, a list or a store, without serving or rollouts.

:func:`train_from_messages` is the library entry point: give it a JSONL file (or parquet, or a list of records or
:class:`~agentbolt.algorithm.sft.data.ChatSample`) of chat conversations with tool calls and a model, and it trains
LoRA adapters (or all weights) on the assistant turns and returns the trained model, its tokenizer and where the
adapter was saved. :func:`train_from_store` does the same from the LLM calls recorded in a store.

The run is ``epochs`` passes over the samples in optimizer steps of ``train_batch_size``; each epoch's order is a
permutation drawn from the seed and the epoch number, so a run stopped after any checkpoint and resumed is the same
run (same batches, same optimizer state, same final weights). Each checkpoint holds a digest of the samples it was
trained on, so a run is only resumed on the same data, and the metrics of every step so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Union

from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import (
    CallStats,
    ChatSample,
    DataError,
    TokenSample,
    load_student_prompt,
    outside_vocabulary,
    tokenize_samples,
)
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
        history: One metrics record per optimizer step taken in this call; when the run was already complete (its
            checkpoint in ``output_dir`` holds every step), the records of the whole run, saved with it.
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
        DataError: A missing or unreadable file, a bad record (named by its file and line, ``chat.jsonl:7``, or
            parquet row, ``chat.parquet row 7``; in a list, ``record 7``), or no sample at all.
    """
    from agentbolt.algorithm.sft.export import iter_located_records

    if isinstance(data, (str, os.PathLike)):
        samples = [ChatSample.from_record(record, where) for where, record in iter_located_records(data)]
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


def data_digest(samples: Sequence[TokenSample]) -> str:
    """SHA-256 of ``samples``' tokens and loss masks, in order: equal for the same training data."""
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(json.dumps([sample.input_ids, [int(m) for m in sample.loss_mask]]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


class _Progress:
    """A console progress bar over the run's optimizer steps, with one line per step (``console=True``)."""

    def __init__(self, total: int, start: int) -> None:
        from agentbolt.algorithm.grpo.metrics import ConsoleSink

        self._sink = ConsoleSink(total_steps=total, start_step=start, title="SFT")

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        record = {f"update/{name}": value for name, value in metrics.items()}
        if metrics.get("seconds"):
            record["update/tokens_per_second"] = metrics["tokens"] / metrics["seconds"]
        self._sink.log(step, record)

    def close(self) -> None:
        self._sink.close()


def train_samples(
    samples: Sequence[TokenSample],
    trainer: Any,
    *,
    checkpoint_dir: Optional[Path] = None,
    stop_after: Optional[int] = None,
    checkpoint_extra: Optional[Dict[str, Any]] = None,
    earlier_history: Sequence[Dict[str, float]] = (),
    on_step: Optional[Callable[[int, Dict[str, float]], None]] = None,
) -> List[Dict[str, float]]:
    """Run (or resume) the optimizer steps of ``epochs`` passes over ``samples`` with an SFT trainer.

    The trainer's ``global_step`` counts optimizer steps done; checkpoints go to ``checkpoint_dir`` every
    ``checkpoint_interval`` optimizer steps and after the last one, with the position in the data, the
    ``data_sha256`` of ``samples`` (:func:`data_digest`) and the metrics of every step of the run. With the trainer's
    ``console`` option a progress bar shows the steps and their loss.

    Args:
        samples: Tokenized samples.
        trainer: An :class:`~agentbolt.algorithm.sft.trainer.SFTTrainer` (possibly resumed).
        checkpoint_dir: Where checkpoints go (None: none).
        stop_after: Take at most this many optimizer steps in this call (the run can be resumed later).
        checkpoint_extra: More state saved with each checkpoint (a ``data_sha256`` computed already is used as it is).
        earlier_history: The metrics of the steps taken before this call (a resumed run's), saved with the
            checkpoints ahead of this call's.
        on_step: Called after each optimizer step with the step number and its metrics (the run's log).

    Returns:
        The metrics of each optimizer step taken.
    """
    config: SFTConfig = trainer.config
    batch = config.train_batch_size
    per_epoch = math.ceil(len(samples) / batch)
    total = config.epochs * per_epoch
    history: List[Dict[str, float]] = []
    end = total if stop_after is None else min(total, trainer.global_step + stop_after)
    extra = dict(checkpoint_extra or {})
    if checkpoint_dir is not None and "data_sha256" not in extra:
        extra["data_sha256"] = data_digest(samples)
    progress = _Progress(total, trainer.global_step) if config.console and trainer.global_step < end else None
    try:
        for step in range(trainer.global_step, end):
            epoch, index = divmod(step, per_epoch)
            order = _epoch_order(len(samples), config.seed, epoch)
            metrics = trainer.optimizer_step([samples[i] for i in order[index * batch : (index + 1) * batch]])
            trainer.global_step += 1
            history.append({"optimizer_step": float(trainer.global_step), "epoch": float(epoch), **metrics})
            logger.info("SFT optimizer step %d/%d: loss %.4f", trainer.global_step, total, metrics["loss"])
            if progress is not None:
                progress.log(trainer.global_step, metrics)
            if on_step is not None:
                on_step(trainer.global_step, history[-1])
            due = config.checkpoint_interval and trainer.global_step % config.checkpoint_interval == 0
            if checkpoint_dir is not None and (due or trainer.global_step == end):
                state = {**extra, "epoch": epoch, "samples": len(samples), "history": [*earlier_history, *history]}
                trainer.save_checkpoint(checkpoint_dir, state)
    finally:
        if progress is not None:
            progress.close()
    return history


def train_from_messages(
    source: Optional[ChatData] = None,
    /,
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
        source: A JSONL or parquet file, or a list of records or :class:`ChatSample` (positional). Earlier versions
            named this argument ``data``; ``data=`` given as a keyword *without* a positional argument is still read
            as the chat data (with a ``DeprecationWarning``). With the chat data given positionally, ``data=`` is
            the :class:`SFTConfig` option (``"auto"``, ``"tokens"`` or ``"messages"``).
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
        stop_after: Take at most this many optimizer steps now (call again with the same ``output_dir`` to resume);
            0 takes none (the data is read and checked, the model loaded).
        **overrides: :class:`SFTConfig` fields overriding ``config`` (``data="messages"``, ``epochs=3``...).

    Returns:
        An :class:`OfflineResult` with the trained model. A run whose checkpoint in ``output_dir`` already holds
        every step trains nothing (a warning says so) and returns the trained model with the run's history.

    Raises:
        DataError: Unreadable data, no usable sample after tokenization and selection (the counters say why), or
            recorded token ids outside the model's vocabulary where they cannot be replaced by the messages.
        pydantic.ValidationError: An invalid option.
        CheckpointError: A checkpoint in ``output_dir`` is corrupt, does not fit this model and configuration, or
            was trained on other data (a resumed run must see the same samples).
        TypeError: No chat data.
        ValueError: ``stop_after`` is negative or not an integer.

    Example:
        >>> from agentbolt.algorithm.sft import train_from_messages
        >>> result = train_from_messages("planner.jsonl", model="smollm2-135m-instruct",
        ...                              output_dir="runs/planner-sft", epochs=2)  # doctest: +SKIP
        >>> result.adapter_dir  # doctest: +SKIP
        PosixPath('runs/planner-sft/adapter')
    """
    if source is None:
        source = _chat_data_by_keyword(overrides)
    _check_stop_after(stop_after)
    settings = _config(config, overrides)
    samples = load_chat_samples(source)
    val_samples = load_chat_samples(val_data) if val_data is not None else None
    return _train(samples, settings, model, tokenizer, output_dir, val_samples, merge, stop_after)


def _check_stop_after(stop_after: Optional[int]) -> None:
    """Refuse a ``stop_after`` that is not None or a whole number of optimizer steps (0 or more)."""
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int) or stop_after < 0):
        raise ValueError(f"stop_after must be None or a number of optimizer steps (0 or more), got {stop_after!r}")


def _chat_data_by_keyword(overrides: Dict[str, Any]) -> ChatData:
    """The chat data passed as ``data=`` (the earlier keyword of the first argument), taken out of ``overrides``.

    Raises:
        TypeError: No chat data, or ``data=`` holds one of the ``data`` option's values.
    """
    if "data" not in overrides:
        raise TypeError("train_from_messages() needs the chat data first: train_from_messages('chat.jsonl', ...)")
    value = overrides["data"]
    if value in ("auto", "tokens", "messages") and not Path(value).exists():
        raise TypeError(
            f"train_from_messages() got data={value!r} (the SFTConfig option) but no chat data: pass the chat data "
            f"first, train_from_messages('chat.jsonl', data={value!r})"
        )
    warnings.warn(
        "train_from_messages(data=...) naming the chat data is deprecated: pass the chat data as the first argument "
        "(data= then names SFTConfig's data option)",
        DeprecationWarning,
        stacklevel=3,
    )
    return overrides.pop("data")  # type: ignore[no-any-return]


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

    _check_stop_after(stop_after)
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


@contextlib.contextmanager
def _naming_last_checkpoint(output_dir: Union[str, os.PathLike[str], None], resume: bool) -> Iterator[None]:
    """On Ctrl-C, log the last checkpoint saved (the one a rerun resumes from) or that none was, then re-raise."""
    try:
        yield
    except KeyboardInterrupt:
        from agentbolt.algorithm.finetuning.trainer import latest_checkpoint

        if output_dir is None:
            logger.warning("SFT interrupted: no output_dir was given, so no checkpoint was saved.")
            raise
        checkpoint_dir = Path(output_dir) / "checkpoints"
        last = latest_checkpoint(checkpoint_dir)
        if last is None:
            logger.warning("SFT interrupted before any checkpoint was saved in %s.", checkpoint_dir)
        else:
            rerun = "; a rerun with the same output_dir resumes from it" if resume else ""
            logger.warning("SFT interrupted: the last checkpoint saved is %s%s.", last, rerun)
        raise


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
    """Train on ``samples`` (see :func:`train_from_messages`); on Ctrl-C, log which checkpoint the run left, then
    re-raise the ``KeyboardInterrupt``."""
    from agentbolt.algorithm.finetuning.algorithm import check_run_directories, forget_interrupted_log, new_run_id
    from agentbolt.algorithm.finetuning.trainer import (
        check_data_order,
        interrupted_run,
        latest_checkpoint,
        write_run_file,
    )
    from agentbolt.algorithm.grpo.metrics import JsonlSink
    from agentbolt.algorithm.sft.algorithm import (
        build_sft_trainer,
        empty_selection_reasons,
        model_vocab_size,
        sample_length_limit,
    )

    with _naming_last_checkpoint(output_dir, settings.resume):
        out = Path(output_dir) if output_dir is not None else None
        checkpoint_dir = out / "checkpoints" if out is not None else None
        # Before the model loads: another run's checkpoints or metrics, or no room for checkpoints.
        resume_from = check_run_directories(checkpoint_dir, settings.log_dir, resume=settings.resume)
        if checkpoint_dir is not None and resume_from is None:
            restarted = interrupted_run(checkpoint_dir, settings.log_dir) if settings.resume else None
            if restarted:
                forget_interrupted_log(restarted, settings.log_dir)
            write_run_file(checkpoint_dir, restarted or new_run_id(settings.log_dir, "sft"), settings.log_dir)
        loaded, tokenizer = _load_model(settings, model, tokenizer)
        vocab_size = model_vocab_size(loaded)
        if settings.trains_tokens():
            _warn_other_models(samples, vocab_size, *_trained_names(settings, model, loaded))
        options = settings.tokenize_options(sample_length_limit(loaded, settings), vocab_size)
        tokenized, token_stats = tokenize_samples(samples, tokenizer, **options)
        selected, selection = select_samples(
            tokenized, **settings.selection_options(), rng=random.Random(settings.seed)
        )
        counters = {**token_stats.as_metrics("samples/"), **selection.as_metrics("select/")}
        if not selected:
            raise DataError(
                f"no usable sample to train on: of {len(samples)} samples, "
                f"{empty_selection_reasons(CallStats(), token_stats, selection)}"
            )
        total = settings.optimizer_steps_for(len(selected))
        if settings.total_optimizer_steps is None:
            settings = settings.model_copy(update={"total_optimizer_steps": total})
        trainer = build_sft_trainer(loaded, tokenizer, settings)
        earlier: List[Dict[str, float]] = []
        extra: Dict[str, Any] = {}
        batches = {name: getattr(settings, name) for name in _BATCH_OPTIONS}
        if checkpoint_dir is not None:
            extra = {"data_sha256": data_digest(selected), **batches}
        if checkpoint_dir is not None and resume_from is not None:
            _check_same_data(resume_from, extra["data_sha256"], len(selected), checkpoint_dir)
            check_data_order(resume_from, batches, f"use another output_dir (or delete {checkpoint_dir})")
            saved = trainer.load_checkpoint(resume_from).get("history")
            earlier = list(saved) if isinstance(saved, list) else []
        complete = trainer.global_step >= total
        if complete:
            logger.warning(
                "This run is already complete: its checkpoint %s holds %d optimizer steps, and this run has %d, so "
                "nothing is trained. To train again, use another output_dir.",
                latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None,
                trainer.global_step,
                total,
            )
        val_tokens: List[TokenSample] = []
        if val_samples is not None:
            val_tokens, _ = tokenize_samples(val_samples, tokenizer, **options)
            counters["val/loss_before"] = trainer.evaluate(val_tokens) if val_tokens else math.nan
        # The run's log, as online runs keep it: a resumed run continues it from its checkpoint's step.
        log = (
            JsonlSink(Path(settings.log_dir), trainer.global_step if resume_from is not None else None)
            if settings.log_dir
            else None
        )
        try:
            history = train_samples(
                selected,
                trainer,
                checkpoint_dir=checkpoint_dir,
                stop_after=stop_after,
                checkpoint_extra=extra,
                earlier_history=earlier,
                on_step=log.log if log is not None else None,
            )
        finally:
            if log is not None:
                log.close()
        if val_tokens:
            counters["val/loss_after"] = trainer.evaluate(val_tokens)
        result = OfflineResult(
            model=trainer.model,
            tokenizer=tokenizer,
            checkpoint=latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None,
            history=earlier if complete else history,
            data=counters,
            optimizer_steps=trainer.global_step,
            total_optimizer_steps=total,
        )
        if out is not None and result.finished:
            _save_outputs(result, trainer, out, merge)
        elif merge and result.finished:
            result.model = trainer.model.merge_and_unload() if trainer.uses_lora else trainer.model
        return result


_BATCH_OPTIONS = ("train_batch_size", "seed")
"""The options that say which samples each optimizer step takes, saved with each checkpoint: a checkpoint's step
counts batches of its ``train_batch_size``, drawn in its ``seed``'s order."""


def _check_same_data(checkpoint: Path, digest: str, count: int, checkpoint_dir: Path) -> None:
    """Refuse to resume ``checkpoint`` on data other than the samples it was trained on.

    Its batches were drawn from those samples; continuing on others would make one run of two datasets, neither
    trained as asked. Checkpoints written before the digest was saved are compared by their number of samples.

    Raises:
        CheckpointError: The data differs; the message says how to train on the new data.
    """
    from agentbolt.algorithm.finetuning.trainer import CheckpointError, checkpoint_state

    extra = checkpoint_state(checkpoint).get("extra")
    extra = extra if isinstance(extra, dict) else {}
    saved_digest, saved_count = extra.get("data_sha256"), extra.get("samples")
    if saved_digest == digest or (saved_digest is None and saved_count in (None, count)):
        return
    was = f"{saved_count} samples" + (f", digest {saved_digest[:12]}" if isinstance(saved_digest, str) else "")
    raise CheckpointError(
        f"{checkpoint} was trained on other data ({was}; this data: {count} samples, digest {digest[:12]}): "
        f"resuming would mix two datasets in one run. To train on this data, use another output_dir, or delete "
        f"{checkpoint_dir} to start over in this one."
    )


def _trained_names(settings: SFTConfig, model: Any, loaded: Any) -> tuple[str, Set[str]]:
    """The model being trained, and every name its calls may be recorded under (as given, its directory's name,
    its served name)."""
    from agentbolt.models import DEFAULT_MODEL

    loaded_from = getattr(getattr(loaded, "config", None), "_name_or_path", None)
    if isinstance(model, (str, os.PathLike)):
        given: Optional[str] = os.fspath(model)
    elif model is None:
        given = settings.model or DEFAULT_MODEL
    else:
        given = loaded_from if isinstance(loaded_from, str) else None
    names: Set[str] = set()
    for name in (given, settings.served_model_name, loaded_from):
        if isinstance(name, str) and name:
            names |= {name, Path(name).name}
    return given or "the given model", names


def _warn_other_models(samples: Sequence[ChatSample], vocab_size: Optional[int], trained: str, names: Set[str]) -> None:
    """Warn when samples whose token ids are trained on were answered by another model than the one being trained
    (``gen_ai.response.model`` of their calls). Ids outside the vocabulary are not trained on (see
    :func:`~agentbolt.algorithm.sft.data.tokenize_sample`)."""
    others: Dict[str, int] = {}
    for sample in samples:
        if not sample.has_token_ids or not sample.model or outside_vocabulary(sample, vocab_size) is not None:
            continue
        if not {sample.model, Path(sample.model).name} & names:
            others[sample.model] = others.get(sample.model, 0) + 1
    if others:
        recorded = ", ".join(f"{count} by {name!r}" for name, count in sorted(others.items()))
        logger.warning(
            "Samples whose token ids are trained on were recorded by another model (%s) than the one being trained "
            "(%r): token ids mean the same text only to the tokenizer that made them. If the tokenizers differ, "
            "train on the messages (data='messages').",
            recorded,
            trained,
        )


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
