"""The torch side shared by the trainers of GRPO and SFT: model set-up, optimizer, schedule and checkpoints.

:class:`ModelTrainer` places the model on its device and dtype, wraps it with PEFT LoRA adapters (or makes every
weight trainable), optionally recomputes each transformer block in the backward pass, and owns an AdamW optimizer
over the trainable parameters only, a learning-rate schedule counted in optimizer steps (:func:`lr_multiplier`),
and everything needed to checkpoint and resume exactly: weights or adapter, optimizer, scheduler, step counters and
every RNG state. Each algorithm's trainer adds its loss and its update step on top.

Checkpoints are directories ``step_{N:06d}`` written under a staging name and renamed into place, so a crash or a
full disk while saving leaves the previous checkpoint as the latest valid one. Loading reads and checks every file
before changing anything, and names the file at fault.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from agentbolt.algorithm.finetuning.config import FinetuningConfig
from agentbolt.utils.imports import peft_wrapping

__all__ = [
    "CHECKPOINT_PREFIX",
    "CheckpointError",
    "ModelTrainer",
    "RUN_FILE",
    "check_checkpoint_dir",
    "check_data_order",
    "check_init_adapter",
    "checkpoint_state",
    "chunks",
    "grad_norm_metrics",
    "interrupted_run",
    "latest_checkpoint",
    "lr_multiplier",
    "remove_run_file",
    "resolve_device",
    "transformer_blocks",
    "write_run_file",
]

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECKPOINT_PREFIX = "step_"
STATE_FILE = "trainer_state.json"
RUN_FILE = "run.json"
"""Kept in a checkpoint directory from a run's start until its first checkpoint (or its end): the run's id and
``log_dir``, by which :func:`interrupted_run` finds a run that stopped before it had a checkpoint to resume from."""


class CheckpointError(ValueError):
    """A checkpoint cannot be written, or cannot be read back into this trainer; the message names the file."""


def resolve_device(name: Optional[str]) -> torch.device:
    """The torch device for ``name`` (``None``: CUDA when available, else the CPU).

    Raises:
        ValueError: Not a device name, or a device this machine does not have.
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"invalid device {name!r}: {exc}") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"device {name!r} is not available: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} is not available on this machine")
    return device


def check_init_adapter(config: FinetuningConfig) -> None:
    """Refuse an ``init_adapter`` that is not a PEFT adapter directory of the configured rank and alpha (read from its
    ``adapter_config.json``, so that it is checked before any model loads). No ``init_adapter`` passes.

    Raises:
        FileNotFoundError: No ``adapter_config.json`` in it.
        ValueError: The file cannot be read, or the adapter's rank or alpha differs from ``lora_r`` / ``lora_alpha``.
    """
    if config.init_adapter is None:
        return
    settings = Path(config.init_adapter) / "adapter_config.json"
    if not settings.is_file():
        raise FileNotFoundError(f"init_adapter: {config.init_adapter} holds no adapter_config.json (a PEFT adapter)")
    try:
        saved = json.loads(settings.read_text(encoding="utf-8"))
        found = (saved.get("r"), float(saved.get("lora_alpha") or 0.0))
    except (ValueError, TypeError, AttributeError, OSError) as exc:
        raise ValueError(f"init_adapter: cannot read {settings}: {exc}") from None
    if found != (config.lora_r, float(config.lora_alpha)):
        raise ValueError(
            f"init_adapter: {config.init_adapter} has rank {found[0]} and alpha {found[1]:g}, but lora_r is "
            f"{config.lora_r} and lora_alpha {config.lora_alpha:g}: set them to the adapter's"
        )


def lr_multiplier(optimizer_step: int, config: FinetuningConfig) -> float:
    """Learning-rate factor after ``optimizer_step`` optimizer steps: linear warmup, then the configured decay."""
    warmup = config.warmup_steps
    if warmup and optimizer_step < warmup:
        return (optimizer_step + 1) / (warmup + 1)
    if config.lr_scheduler == "constant":
        return 1.0
    total = config.schedule_steps()
    progress = min(1.0, (optimizer_step - warmup) / max(1, total - warmup))
    floor = config.min_lr_ratio
    if config.lr_scheduler == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _step_entries(root: Path) -> List[Tuple[int, Path]]:
    """The entries of ``root`` named as checkpoints are (``step_`` and digits), with their step, complete or not."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        suffix = child.name[len(CHECKPOINT_PREFIX) :]
        if child.name.startswith(CHECKPOINT_PREFIX) and suffix.isascii() and suffix.isdigit():
            found.append((int(suffix), child))
    return found


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> Optional[Path]:
    """The complete checkpoint with the highest step in ``checkpoint_dir`` (None if there is none)."""
    found = [(step, child) for step, child in _step_entries(Path(checkpoint_dir)) if (child / STATE_FILE).exists()]
    return max(found)[1] if found else None


def _unreadable(checkpoint: Path, problem: str) -> CheckpointError:
    """The error for a checkpoint whose file is missing or corrupt (``problem`` names the file). For a checkpoint of
    a checkpoint directory it names the earlier checkpoint a run resumes from once this one is moved away."""
    entries = _step_entries(checkpoint.parent)
    own = [step for step, child in entries if child.name == checkpoint.name]
    if not own:
        return CheckpointError(problem)
    earlier = [(step, child) for step, child in entries if step < own[0] and (child / STATE_FILE).exists()]
    resumes = (
        f"a resumed run then continues from the checkpoint before it, {max(earlier)[1].name}"
        if earlier
        else "it has no earlier checkpoint to resume from"
    )
    return CheckpointError(
        f"{problem}; so checkpoint {checkpoint} cannot be resumed. Move {checkpoint.name} out of "
        f"{checkpoint.parent} (keep it to inspect it): {resumes}."
    )


def checkpoint_state(path: str | os.PathLike[str]) -> Dict[str, Any]:
    """The ``trainer_state.json`` of the checkpoint ``path``: its kind, step counters, policy identity and the
    ``extra`` state saved with it (read without loading anything else).

    Raises:
        FileNotFoundError: ``path`` holds no ``trainer_state.json``.
        CheckpointError: The file is corrupt (not JSON, or without its step counters).
    """
    state_file = Path(path) / STATE_FILE
    if not state_file.exists():
        raise FileNotFoundError(f"{path} is not a checkpoint (no {STATE_FILE})")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        int(state["global_step"]), int(state["optimizer_steps"])
    except (ValueError, KeyError, TypeError) as exc:
        raise _unreadable(Path(path), f"{state_file} is corrupt: {exc}") from exc
    return state


def check_data_order(checkpoint: str | os.PathLike[str], options: Mapping[str, Any], new_run: str) -> None:
    """Refuse to resume ``checkpoint`` with other values of ``options`` than those saved in its ``extra`` state.

    ``options`` are the run's values of the options that decide which data each step draws (an order drawn from
    ``seed``, batches of ``train_batch_size``...): a checkpoint's position in the data is counted in the order and
    batches its own values draw, so with other ones the run would skip some data and repeat the rest without a word.
    An option the checkpoint does not record (one written before it was saved) is not checked, with a debug log.
    ``new_run`` says how to start a new run with these values instead (``"use another output_dir"``).

    Raises:
        FileNotFoundError: ``checkpoint`` holds no ``trainer_state.json``.
        CheckpointError: The state file is corrupt, or an option differs; the message names the option, the
            checkpoint's value and this run's.
    """
    extra = checkpoint_state(checkpoint).get("extra")
    saved = extra if isinstance(extra, dict) else {}
    unrecorded = [name for name in options if name not in saved]
    if unrecorded:
        logger.debug("Checkpoint %s does not record %s; resuming without checking them.", checkpoint, unrecorded)
    differences = [
        f"{name}={saved[name]!r} (this run: {value!r})"
        for name, value in options.items()
        if name in saved and saved[name] != value
    ]
    if differences:
        raise CheckpointError(
            f"{checkpoint} was trained with {', '.join(differences)}: its position in the data is counted in the "
            "order and batches those options draw, so resuming with other ones would skip some data and repeat the "
            f"rest. Resume with the checkpoint's values, or {new_run} to train with these."
        )


def interrupted_run(
    checkpoint_dir: Optional[str | os.PathLike[str]], log_dir: Optional[str | os.PathLike[str]]
) -> Optional[str]:
    """The id of the run that started with ``checkpoint_dir`` and ``log_dir`` and stopped before its first
    checkpoint (its :data:`RUN_FILE` is there and no checkpoint is), else None.

    A run resumed (``resume=True``) in that state starts that run again from step 0 under its id: an online run
    cancels the rollouts the stopped process left in the store, and the records of ``log_dir/metrics.jsonl`` are
    replaced rather than refused as another run's.
    """
    if not checkpoint_dir or latest_checkpoint(checkpoint_dir) is not None:
        return None
    try:
        saved = json.loads((Path(checkpoint_dir) / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no run file, or one cut short: no run to recognise
        return None
    run_id = saved.get("run_id") if isinstance(saved, dict) else None
    if not isinstance(run_id, str) or not run_id or saved.get("log_dir") != _resolved(log_dir):
        return None
    return run_id


def write_run_file(
    checkpoint_dir: str | os.PathLike[str], run_id: str, log_dir: Optional[str | os.PathLike[str]]
) -> None:
    """Record a starting run in ``checkpoint_dir`` (see :data:`RUN_FILE`); its first checkpoint removes the file."""
    path = Path(checkpoint_dir) / RUN_FILE
    staging = path.with_name(f".{RUN_FILE}.tmp")
    staging.write_text(json.dumps({"run_id": run_id, "log_dir": _resolved(log_dir)}), encoding="utf-8")
    os.replace(staging, path)


def remove_run_file(checkpoint_dir: str | os.PathLike[str]) -> None:
    """Forget the run recorded in ``checkpoint_dir``: it has a checkpoint, or it ended."""
    (Path(checkpoint_dir) / RUN_FILE).unlink(missing_ok=True)


def _resolved(log_dir: Optional[str | os.PathLike[str]]) -> Optional[str]:
    return str(Path(log_dir).resolve()) if log_dir else None


def check_checkpoint_dir(checkpoint_dir: str | os.PathLike[str], *, resume: bool = True) -> Path:
    """Create ``checkpoint_dir`` if needed and prove a file can be written in it; the directory's path.

    A run calls this before it loads its model, so that a directory that cannot hold checkpoints (under a regular
    file, read-only, on a full disk) fails at once rather than after the last step. A checkpoint directory holds one
    run: a run that does not resume (``resume=False``) refuses one that already holds checkpoints, whose steps it
    would overwrite one by one, leaving the later ones of the other run to be resumed from.

    An entry named as a checkpoint (``step_000012``) that is not a complete one (a file, or a directory without its
    ``trainer_state.json``), of a step after the checkpoint the run resumes from, is refused too: the run would
    write its own checkpoint of that step in its place.

    Raises:
        CheckpointError: The directory cannot be created or written to, it holds another run's checkpoints and
            ``resume`` is False, it holds an entry named as a later checkpoint that is not one, or it is itself a
            checkpoint (the message names it).
    """
    root = Path(checkpoint_dir)
    if (root / STATE_FILE).is_file():
        raise CheckpointError(
            f"checkpoint_dir {str(root)!r} is a checkpoint, not a directory of checkpoints: to resume from it, set "
            f"checkpoint_dir to the directory that holds it, {str(root.parent)!r} (a run resumes from the latest "
            "checkpoint there)."
        )
    existing = latest_checkpoint(root)
    if not resume and existing is not None:
        raise CheckpointError(
            f"checkpoint_dir {str(root)!r} already holds another run's checkpoints (latest: {existing.name}), and "
            "this run does not resume. Use a new checkpoint_dir, delete those checkpoints to start over in it, or "
            "resume that run (resume=True)."
        )
    start = int(existing.name[len(CHECKPOINT_PREFIX) :]) if existing is not None else 0
    in_the_way = sorted(str(child) for step, child in _step_entries(root) if step > start)
    if in_the_way:
        resumes = f"resumes from {existing.name}" if existing is not None else "starts from step 0"
        them = "them" if len(in_the_way) > 1 else "it"
        raise CheckpointError(
            f"checkpoint_dir {str(root)!r} holds {', '.join(in_the_way)}: named as a checkpoint, but without a "
            f"{STATE_FILE} (a file, or an incomplete copy), and this run would write its own checkpoint of that step "
            f"there. Move {them} out of checkpoint_dir (keep {them} if needed); the run then {resumes}."
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-check-{os.getpid()}"
        with open(probe, "wb") as handle:
            handle.write(b"ok")
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"checkpoint_dir {str(root)!r} cannot hold checkpoints: {exc}") from exc
    _remove_staging_left_behind(root)
    return root


def _remove_staging_left_behind(root: Path) -> None:
    """Remove the staging directories (``.step_N.tmp``) a run killed while saving a checkpoint left in ``root``.

    They are never checkpoints (a checkpoint is renamed into place whole) and each may hold a full model; a run
    that resumes with another ``checkpoint_interval`` would never write over them.
    """
    for child in root.iterdir():
        name = child.name
        step = name[len("." + CHECKPOINT_PREFIX) : -len(".tmp")]
        staging = name.startswith("." + CHECKPOINT_PREFIX) and name.endswith(".tmp") and step.isdigit()
        if staging and step.isascii() and child.is_dir() and not child.is_symlink():
            logger.info("Removing %s, a checkpoint left half-written by an interrupted run", child)
            shutil.rmtree(child, ignore_errors=True)


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Consecutive slices of ``items`` of ``size`` elements (the last one may be shorter)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def grad_norm_metrics(norms: Sequence[float]) -> Dict[str, float]:
    """Metrics of the gradient norms that optimizer steps returned (:meth:`ModelTrainer._clip_and_step`).

    Returns:
        ``grad_norm``: the mean of the finite norms, those of the steps taken (NaN when there is none);
        ``nonfinite_grad_steps``: how many steps were skipped because their norm was NaN or infinite.
    """
    finite = [norm for norm in norms if math.isfinite(norm)]
    return {
        "grad_norm": sum(finite) / len(finite) if finite else math.nan,
        "nonfinite_grad_steps": float(len(norms) - len(finite)),
    }


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``forward`` under non-reentrant activation checkpointing when gradients are being recorded."""
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def transformer_blocks(model: Any, purpose: str) -> List[Any]:
    """The transformer blocks of ``model`` (a causal LM or a PEFT model around one): the modules whose class the
    model lists in ``_no_split_modules`` (``LlamaDecoderLayer``...).

    Raises:
        ValueError: The model does not name its blocks; the message starts with ``purpose``.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    blocks = [module for module in base.modules() if type(module).__name__ in names]
    if not blocks:
        raise ValueError(f"{purpose}: {type(base).__name__} does not name its transformer blocks (_no_split_modules)")
    return blocks


def _is_quantized(model: Any) -> bool:
    """Whether ``model`` holds quantized weights (bitsandbytes 4/8-bit), which cannot be moved or cast."""
    return bool(
        getattr(model, "is_loaded_in_4bit", False)
        or getattr(model, "is_loaded_in_8bit", False)
        or getattr(model, "hf_quantizer", None) is not None
    )


def _name_or_path(model: Any) -> Optional[str]:
    """The name or directory a transformers model (or a PEFT model around one) was loaded from, if it says."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = getattr(getattr(base, "config", None), "name_or_path", None)
    return name if isinstance(name, str) and name else None


def _fsync_dir(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory descriptors
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class ModelTrainer:
    """A causal LM made trainable, with its optimizer, learning-rate schedule and checkpoints.

    Args:
        model: A transformers causal LM (a ``PeftModel`` is used as is). With ``finetune="lora"`` it is wrapped with
            fresh LoRA adapters; with ``"full"`` all its weights train. Quantized models (4/8-bit) stay where they
            were loaded.
        config: Model and optimisation options.
        pad_token_id: Id used for padding (masked out, any valid id works).

    Raises:
        ValueError: The model has no trainable parameters, or the device does not exist.
    """

    checkpoint_kind = "model"
    """Written into each checkpoint; a checkpoint of another kind is refused on load."""

    def __init__(self, model: Any, config: FinetuningConfig, *, pad_token_id: int = 0) -> None:
        self.config = config
        self.base_model_name: Optional[str] = config.model or _name_or_path(model)
        """The model trained: ``config.model`` as configured, else the path a model object was loaded from (None
        when it does not say)."""
        self.pad_token_id = pad_token_id
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.device = resolve_device(config.device)
        if not _is_quantized(model):
            model = model.to(device=self._placement(), dtype=DTYPES[config.dtype])
        if config.finetune == "lora":
            self.model = self._with_lora(model)
        else:
            self.model = model
            for param in self.model.parameters():
                param.requires_grad_(True)
        self._keep_reference(model)
        self.model.eval()
        if config.gradient_checkpointing:
            self._checkpoint_blocks()
        self._prepare_model()
        if self.device.type == "cpu":
            from agentbolt.utils.memory import return_large_blocks_to_os

            return_large_blocks_to_os()  # activation buffers go back to the system between steps
        self.trainable_parameters = [p for p in self.model.parameters() if p.requires_grad]
        if not self.trainable_parameters:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters,
            lr=config.learning_rate,
            betas=config.adam_betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_multiplier(step, config))
        self.global_step = 0
        self.optimizer_steps = 0
        self.skipped_optimizer_steps = 0

    # ------------------------------------------------------------------------------------------------ model set-up
    def _keep_reference(self, model: Any) -> None:
        """Hook called once the trained model is set up, before any step (a frozen reference can be copied here)."""

    def _placement(self) -> torch.device:
        """Where the loaded model is placed before training (the trainer's device; a sharded trainer keeps it on the
        CPU until each shard moves to the device)."""
        return self.device

    def _prepare_model(self) -> None:
        """Hook called once the trained model is complete (adapters, checkpointed blocks), before the optimizer is
        built over its trainable parameters (a data-parallel trainer shards it here)."""

    @property
    def served_model(self) -> Any:
        """The model whose full weights are served and checkpointed: the trained model itself (a sharded trainer
        keeps a full copy instead)."""
        return self.model

    def _with_lora(self, model: Any) -> Any:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError as exc:  # pragma: no cover - peft is part of the train extra
            raise ImportError("LoRA training needs peft: pip install 'agentbolt[train]'") from exc
        if isinstance(model, PeftModel):
            return model
        if self.config.init_adapter is not None:
            return self._load_adapter(model, self.config.init_adapter)
        lora = LoraConfig(
            r=self.config.lora_r,
            lora_alpha=self.config.lora_alpha,  # type: ignore[arg-type]  # peft accepts float scaling
            lora_dropout=self.config.lora_dropout,
            target_modules=self.config.lora_target_modules,
            task_type="CAUSAL_LM",
        )
        with peft_wrapping():
            return get_peft_model(model, lora)

    def _load_adapter(self, model: Any, adapter_dir: str) -> Any:
        """``model`` wrapped with the trainable LoRA adapter saved in ``adapter_dir`` (PEFT format).

        Raises:
            FileNotFoundError: No ``adapter_config.json`` in ``adapter_dir``.
            ValueError: The adapter's rank or alpha differs from ``lora_r`` / ``lora_alpha``.
        """
        from peft import PeftModel

        check_init_adapter(self.config.model_copy(update={"init_adapter": adapter_dir}))
        logger.info("Starting from the LoRA adapter in %s", adapter_dir)
        with peft_wrapping():
            return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)

    def _checkpoint_blocks(self) -> None:
        """Recompute every transformer block in the backward pass instead of keeping its activations.

        Blocks are the modules the model lists in ``_no_split_modules`` (``LlamaDecoderLayer``...). The wrapper works
        whatever ``train()``/``eval()`` says (transformers' own checkpointing only runs in training mode, and these
        forwards run in eval mode) and does nothing when gradients are off (scoring passes, the engine).

        Raises:
            ValueError: The model does not name its blocks.
        """
        for block in transformer_blocks(self.model, "gradient_checkpointing"):
            block.forward = functools.partial(_checkpointed, block.forward)

    @contextlib.contextmanager
    def update_threads(self) -> Iterator[None]:
        """Run the body with ``config.update_threads`` torch threads in the calling thread, restored after.

        torch's intra-op thread count is taken per thread, so a weight update in a worker thread can use more cores
        than the engine threads it pauses, without changing theirs.
        """
        wanted = self.config.update_threads
        before = torch.get_num_threads()
        if wanted is None or wanted == before:
            yield
            return
        torch.set_num_threads(wanted)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        """Release what the trainer holds besides memory (nothing here; a data-parallel trainer leaves its run)."""

    @property
    def uses_lora(self) -> bool:
        """True when the trained parameters are LoRA adapters."""
        return self.config.finetune == "lora"

    # ------------------------------------------------------------------------------------------- optimizer steps
    def schedule_metrics(self) -> Dict[str, float]:
        """``lr`` (current learning rate), ``optimizer_steps`` and ``skipped_optimizer_steps`` (cumulative)."""
        return {
            "lr": float(self.scheduler.get_last_lr()[0]),
            "optimizer_steps": float(self.optimizer_steps),
            "skipped_optimizer_steps": float(self.skipped_optimizer_steps),
        }

    def _skip_optimizer_step(self) -> None:
        with warnings.catch_warnings():  # stepping the schedule alone is intended here
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.skipped_optimizer_steps += 1

    def _clip_and_step(self) -> float:
        """Clip the gradient norm (when configured), step the optimizer and the schedule; returns the norm.

        A gradient that is not finite (an overflow somewhere in the loss) skips the step, with a warning: one such
        step would otherwise make every weight NaN for good. The schedule still advances, as for other skipped steps.
        """
        if self.config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters, self.config.max_grad_norm)
        else:
            grads = [p.grad for p in self.trainable_parameters if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.tensor(0.0)
        full_tensor = getattr(norm, "full_tensor", None)  # a DTensor when the gradients are sharded
        value = float(full_tensor() if full_tensor is not None else norm)
        if not math.isfinite(value):
            logger.warning(
                "The gradient norm is %s: this optimizer step is skipped and the weights are unchanged.", value
            )
            self.optimizer.zero_grad(set_to_none=True)
            self._skip_optimizer_step()
            return value
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return value

    # ---------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(
        self, checkpoint_dir: str | os.PathLike[str], extra_state: Optional[Dict[str, Any]] = None
    ) -> Path:
        """Write ``checkpoint_dir/step_{global_step:06d}`` atomically and return its path.

        Contents: ``adapter/`` (PEFT format, loadable by vLLM ``--lora-modules``) or ``model.safetensors``,
        ``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` and ``trainer_state.json`` (counters plus ``extra_state``).
        Everything is written under a staging name, flushed to disk, then renamed into place.

        Raises:
            CheckpointError: Writing failed (a full disk, say); the staging files are removed and the checkpoints
                already in ``checkpoint_dir`` are untouched.
        """
        from safetensors.torch import save_model

        root = Path(checkpoint_dir)
        final = root / f"{CHECKPOINT_PREFIX}{self.global_step:06d}"
        staging = root / f".{final.name}.tmp"
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            if self.uses_lora:
                self.served_model.save_pretrained(str(staging / "adapter"))
            else:
                save_model(self.served_model, str(staging / "model.safetensors"))
            torch.save(self._optimizer_state(), staging / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), staging / "scheduler.pt")
            torch.save(
                {
                    "python": random.getstate(),
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "generator": self.generator.get_state(),
                },
                staging / "rng.pt",
            )
            state = {
                "kind": self.checkpoint_kind,
                "global_step": self.global_step,
                "optimizer_steps": self.optimizer_steps,
                "skipped_optimizer_steps": self.skipped_optimizer_steps,
                "finetune": self.config.finetune,
                "policy": self.policy_identity(),
                "extra": extra_state or {},
            }
            with open(staging / STATE_FILE, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(state, indent=2))
                handle.flush()
                os.fsync(handle.fileno())
            for written in staging.rglob("*"):
                if written.is_file():
                    with open(written, "rb") as handle:
                        os.fsync(handle.fileno())
            shutil.rmtree(final, ignore_errors=True)
            os.replace(staging, final)
            _fsync_dir(root)
            remove_run_file(root)  # the checkpoint holds the run from now on
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            previous = latest_checkpoint(root)
            kept = f"the latest checkpoint is still {previous}" if previous else "no earlier checkpoint exists"
            raise CheckpointError(f"could not write checkpoint {final}: {exc}; {kept}") from exc
        logger.info("Saved checkpoint %s", final)
        return final

    def load_checkpoint(self, path: str | os.PathLike[str]) -> Dict[str, Any]:
        """Restore weights, optimizer, scheduler, counters and RNG states from a checkpoint directory.

        Every file is read and checked against this trainer before anything changes, so a refused checkpoint leaves
        the weights and the optimizer as they were.

        Returns:
            The ``extra_state`` saved with the checkpoint.

        Raises:
            FileNotFoundError: ``path`` holds no ``trainer_state.json``.
            CheckpointError: A file is missing, corrupt, or does not fit this model or configuration (the message
                names it).
        """
        path = Path(path)
        state_file = path / STATE_FILE
        state = checkpoint_state(path)
        counters = (int(state["global_step"]), int(state["optimizer_steps"]))
        kind = state.get("kind", self.checkpoint_kind)
        if kind != self.checkpoint_kind:
            raise CheckpointError(
                f"{state_file} is a {kind!r} checkpoint; this {self.checkpoint_kind!r} trainer cannot resume from it"
            )
        if state.get("finetune") != self.config.finetune:
            raise CheckpointError(
                f"checkpoint {path} was saved with finetune={state.get('finetune')!r}, but this run has "
                f"finetune={self.config.finetune!r}"
            )
        self._check_policy_identity(path, state.get("policy"))
        weights_file = path / "adapter" / "adapter_model.safetensors" if self.uses_lora else path / "model.safetensors"
        self._check_weights(path, weights_file)
        optimizer_state = self._read_torch(path, "optimizer.pt", weights_only=True)
        scheduler_state = self._read_torch(path, "scheduler.pt", weights_only=True)
        rng = self._read_torch(path, "rng.pt", weights_only=False)
        for name, content, keys in (
            ("optimizer.pt", optimizer_state, ("state", "param_groups")),
            ("scheduler.pt", scheduler_state, ("last_epoch",)),
            ("rng.pt", rng, ("python", "torch", "generator")),
        ):
            if not isinstance(content, dict) or not all(key in content for key in keys):
                raise _unreadable(path, f"{path / name} is corrupt: it does not hold the {', '.join(keys)} it should")
        saved_groups = [len(group["params"]) for group in optimizer_state.get("param_groups", [])]
        current_groups = [len(group["params"]) for group in self.optimizer.param_groups]
        if saved_groups != current_groups:
            raise CheckpointError(
                f"{path / 'optimizer.pt'} holds {saved_groups} parameters per group; this model trains {current_groups}"
            )
        self._apply_weights(weights_file)
        self._load_optimizer_state(optimizer_state)
        self.scheduler.load_state_dict(scheduler_state)
        self._apply_config_hyperparameters(path, int(scheduler_state.get("last_epoch", counters[1])))
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.generator.set_state(rng["generator"])
        self.global_step, self.optimizer_steps = counters
        self.skipped_optimizer_steps = int(state.get("skipped_optimizer_steps", 0))
        logger.info("Resumed from checkpoint %s (step %d)", path, self.global_step)
        return dict(state.get("extra") or {})

    def policy_identity(self) -> Dict[str, Any]:
        """What makes this trainer's weights mean what they mean, saved with each checkpoint: the base model
        (:attr:`base_model_name`) and, with LoRA, the rank, alpha and target modules as configured."""
        identity: Dict[str, Any] = {"model": self.base_model_name}
        if self.uses_lora:
            targets = self.config.lora_target_modules
            identity.update(
                lora_r=self.config.lora_r,
                lora_alpha=float(self.config.lora_alpha),
                lora_target_modules=targets if isinstance(targets, str) else sorted(targets),
            )
        return identity

    def _check_policy_identity(self, path: Path, saved: Any) -> None:
        """Refuse a checkpoint of another policy: another base model, or other LoRA settings.

        Tensor shapes alone cannot tell: a sibling base model of the same architecture, or another ``lora_alpha``,
        fits them exactly and would be trained on silently. A checkpoint saved before the identity was recorded is
        accepted with a warning; a base model that neither side names is not compared.

        Raises:
            CheckpointError: A setting differs; the message names the checkpoint's value and this run's.
        """
        if not isinstance(saved, dict):
            logger.warning(
                "Checkpoint %s does not record the base model and LoRA settings it was trained with; resuming "
                "without checking that they are this run's.",
                path,
            )
            return
        current = self.policy_identity()
        differences = [
            f"{name} {saved[name]!r} (this run: {value!r})"
            for name, value in current.items()
            if name in saved and saved[name] != value and not (name == "model" and None in (saved[name], value))
        ]
        if differences:
            raise CheckpointError(
                f"checkpoint {path} belongs to another policy: it was trained with {'; '.join(differences)}. Resume "
                "it with the settings it was trained with, or start a new run with another checkpoint_dir."
            )

    def _apply_config_hyperparameters(self, path: Path, optimizer_step: int) -> None:
        """Make the config's learning rate, weight decay, betas and epsilon win over those a checkpoint restored.

        ``load_state_dict`` brings back the hyperparameters the checkpoint was trained with; a resumed run whose
        config changes them means the new values. The schedule keeps its position: the learning rate becomes the
        config's peak times the schedule's factor at the restored optimizer step. Each change is logged.
        """
        config = self.config
        wanted: Dict[str, Any] = {
            "lr": config.learning_rate,
            "weight_decay": config.weight_decay,
            "betas": tuple(config.adam_betas),
            "eps": config.adam_eps,
        }
        changed: Dict[str, Tuple[Any, Any]] = {}
        for group in self.optimizer.param_groups:
            saved = {
                "lr": group.get("initial_lr", group["lr"]),
                "weight_decay": group["weight_decay"],
                "betas": tuple(group["betas"]),
                "eps": group["eps"],
            }
            for name, value in wanted.items():
                if saved[name] != value:
                    changed.setdefault(name, (saved[name], value))
            group["initial_lr"] = config.learning_rate
            group["lr"] = config.learning_rate * lr_multiplier(optimizer_step, config)
            group["weight_decay"], group["betas"], group["eps"] = wanted["weight_decay"], wanted["betas"], wanted["eps"]
        self.scheduler.base_lrs = [config.learning_rate for _ in self.optimizer.param_groups]
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what get_last_lr() reports
        if changed:
            options = {"lr": "learning_rate", "weight_decay": "weight_decay", "betas": "adam_betas", "eps": "adam_eps"}
            described = ", ".join(f"{options[name]} {old!r} -> {new!r}" for name, (old, new) in changed.items())
            logger.warning(
                "Resuming from %s with the config's %s (the checkpoint's values are replaced).", path, described
            )

    def _optimizer_state(self) -> Dict[str, Any]:
        """The optimizer state a checkpoint holds (``optimizer.state_dict()``: parameters numbered in the order of
        :attr:`trainable_parameters`)."""
        return self.optimizer.state_dict()

    def _load_optimizer_state(self, state: Dict[str, Any]) -> None:
        """Restore the optimizer from a checkpoint's :meth:`_optimizer_state` (already checked)."""
        self.optimizer.load_state_dict(state)

    @staticmethod
    def _read_torch(checkpoint: Path, name: str, *, weights_only: bool) -> Any:
        path = checkpoint / name
        if not path.exists():
            raise _unreadable(checkpoint, f"{path} is missing")
        try:
            return torch.load(path, weights_only=weights_only)
        except Exception as exc:  # torch raises several types for truncated or foreign files
            raise _unreadable(checkpoint, f"{path} is corrupt: {exc}") from exc

    def _check_weights(self, checkpoint: Path, path: Path) -> None:
        """Check that ``path`` holds exactly the trained weights' tensors, with their shapes (headers only)."""
        from safetensors import safe_open

        if not path.exists():
            raise _unreadable(checkpoint, f"{path} is missing")
        try:
            with safe_open(str(path), framework="pt") as handle:
                shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise _unreadable(checkpoint, f"{path} is corrupt: {exc}") from exc
        groups = self._saved_weight_groups()
        expected = {name: shape for names, shape in groups for name in names}
        unexpected = sorted(set(shapes) - set(expected))
        if unexpected:
            raise CheckpointError(f"{path} does not fit the model: unexpected tensors {unexpected[:3]}")
        missing = [names[0] for names, _ in groups if not any(name in shapes for name in names)]
        if missing:
            raise CheckpointError(f"{path} does not fit the model: missing tensors {missing[:3]}")
        for name, shape in shapes.items():
            if shape != expected[name]:
                raise CheckpointError(
                    f"{path} does not fit the model: {name} has shape {shape}, the model's is {expected[name]}"
                )

    def _saved_weight_groups(self) -> List[Tuple[List[str], Tuple[int, ...]]]:
        """The tensors a checkpoint of this trainer holds: names that share storage (tied weights, saved once)
        grouped, with their shape."""
        if self.uses_lora:
            from peft import get_peft_model_state_dict

            return [([name], tuple(t.shape)) for name, t in get_peft_model_state_dict(self.served_model).items()]
        groups: Dict[Tuple[int, Tuple[int, ...]], List[str]] = {}
        for name, tensor in self.served_model.state_dict().items():
            groups.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(name)
        return [(names, shape) for (_, shape), names in groups.items()]

    def _apply_weights(self, path: Path) -> None:
        if self.uses_lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.served_model, load_file(str(path)))
        else:
            from safetensors.torch import load_model

            load_model(self.served_model, str(path))
