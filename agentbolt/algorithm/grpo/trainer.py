"""The torch policy trainer behind GRPO.

:class:`PolicyTrainer` owns the policy (optionally wrapped with PEFT LoRA), the frozen reference used for the KL
term, an AdamW optimizer over the trainable parameters only, a learning-rate schedule counted in optimizer steps,
and everything needed to checkpoint and resume exactly (weights or adapter, optimizer, scheduler, step counters and
every RNG state).

Batches are left-padded with explicit position ids, so each response ends at the last position and the model only
projects the last ``max_response_length + 1`` hidden states to the vocabulary. All forwards run with dropout off
(``eval()``) unless ``lora_dropout > 0``.

The PPO ratio's old and new log-probs are both the trainer's own, of the distribution each response was sampled from
(``softmax(logits / T)`` at the sample's temperature), in the trainer's precision; the engine's log-probs only
measure how closely the served model agrees with the trained one (``logprob_engine_diff_*``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import random
import shutil
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.loss import logprobs_and_entropy, policy_loss, token_logprobs
from agentbolt.algorithm.grpo.packing import PackedBatch, pack_samples, prefix_order
from agentbolt.algorithm.grpo.samples import TokenSample

__all__ = [
    "PolicyTrainer",
    "ResponseBatch",
    "collate",
    "engine_logprob_diff",
    "latest_checkpoint",
    "lr_multiplier",
    "resolve_device",
    "rollout_minibatches",
]

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECKPOINT_PREFIX = "step_"


@dataclass
class ResponseBatch:
    """A left-padded batch and its response-aligned views.

    ``targets``, ``response_mask`` and the log-prob tensors have shape ``[B, R]`` with ``R`` the longest response:
    column ``j`` is the token predicted by the logits at input position ``L - R - 1 + j``, so each response occupies
    the last ``len(response)`` columns of its row.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor

    @property
    def response_width(self) -> int:
        """``R``, the number of response-aligned columns."""
        return int(self.targets.shape[1])

    @property
    def computed_tokens(self) -> int:
        """Tokens a forward over this batch computes (padding excluded)."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device) -> ResponseBatch:
        """The same batch with every tensor on ``device``."""
        return ResponseBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.targets.to(device),
            self.response_mask.to(device),
        )


def collate(samples: Sequence[TokenSample], pad_token_id: int = 0) -> ResponseBatch:
    """Left-pad prompt+response sequences and build the response mask.

    The mask is 1 exactly on the sampled response tokens; prompt tokens and padding are 0.
    """
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    length = max(s.num_tokens for s in samples)
    width = max(len(s.response_ids) for s in samples)
    batch = len(samples)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    response_mask = torch.zeros((batch, width), dtype=torch.bool)
    for row, sample in enumerate(samples):
        tokens = sample.prompt_ids + sample.response_ids
        input_ids[row, length - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
        attention_mask[row, length - len(tokens) :] = 1
        response_mask[row, width - len(sample.response_ids) :] = True
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    targets = input_ids[:, length - width :]
    return ResponseBatch(input_ids, attention_mask, position_ids, targets, response_mask)


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


def right_aligned(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D float tensors right-aligned into ``[len(rows), width]`` (zeros on the left)."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        if len(row):
            out[i, width - len(row) :] = row
    return out


def lr_multiplier(optimizer_step: int, config: GRPOConfig) -> float:
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


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> Optional[Path]:
    """The complete checkpoint with the highest step in ``checkpoint_dir`` (None if there is none)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return None
    found = []
    for child in root.iterdir():
        suffix = child.name[len(CHECKPOINT_PREFIX) :]
        if child.name.startswith(CHECKPOINT_PREFIX) and suffix.isdigit() and (child / "trainer_state.json").exists():
            found.append((int(suffix), child))
    return max(found)[1] if found else None


def rollout_minibatches(samples: Sequence[TokenSample], count: int, generator: torch.Generator) -> List[List[int]]:
    """Split sample indices into exactly ``count`` minibatches of whole rollouts.

    The rollouts are shuffled with ``generator`` and dealt into ``count`` consecutive runs whose rollout counts
    differ by at most one; a rollout's samples stay together, in call order. With fewer rollouts than ``count`` the
    last minibatches are empty.
    """
    by_rollout: Dict[str, List[int]] = {}
    for index, sample in enumerate(samples):
        by_rollout.setdefault(sample.rollout_id, []).append(index)
    rollouts = list(by_rollout.values())
    order = torch.randperm(len(rollouts), generator=generator).tolist()
    base, extra = divmod(len(rollouts), count)
    minibatches: List[List[int]] = []
    start = 0
    for position in range(count):
        size = base + (1 if position < extra else 0)
        minibatches.append([index for r in order[start : start + size] for index in rollouts[r]])
        start += size
    return minibatches


def engine_logprob_diff(samples: Sequence[TokenSample], trainer_logprobs: Sequence[torch.Tensor]) -> Dict[str, float]:
    """How far the engine's log-probs are from the trainer's, over the response tokens of samples that carry them.

    Args:
        samples: Samples, with the engine's untempered log-probs in ``logprobs`` (or None).
        trainer_logprobs: The trainer's untempered log-probs of the same tokens, one tensor per sample.

    Returns:
        ``logprob_engine_diff_mean`` and ``logprob_engine_diff_max`` of ``|engine - trainer|`` in nats (NaN when no
        sample carries engine log-probs).
    """
    diffs = [
        (torch.tensor(sample.logprobs, dtype=torch.float32) - mine.float().cpu()).abs()
        for sample, mine in zip(samples, trainer_logprobs, strict=True)
        if sample.logprobs is not None
    ]
    if not diffs:
        return {"logprob_engine_diff_mean": math.nan, "logprob_engine_diff_max": math.nan}
    flat = torch.cat(diffs)
    return {"logprob_engine_diff_mean": float(flat.mean()), "logprob_engine_diff_max": float(flat.max())}


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``forward`` under non-reentrant activation checkpointing when gradients are being recorded."""
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _packable(model: Any) -> bool:
    """Whether packed forwards are exact for ``model``: a plain output head and an attention that reads 4-D masks."""
    from agentbolt.serving.logits import plain_output_head

    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return plain_output_head(model) and attention in ("sdpa", "eager")


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class PolicyTrainer:
    """GRPO policy optimisation on a causal LM.

    Args:
        model: A transformers causal LM (a ``PeftModel`` is used as is). With ``finetune="lora"`` it is wrapped with
            fresh LoRA adapters; with ``"full"`` all its weights train.
        config: Optimisation options (see :class:`GRPOConfig`).
        pad_token_id: Id used for padding (masked out, any valid id works).
    """

    def __init__(self, model: Any, config: GRPOConfig, *, pad_token_id: int = 0) -> None:
        self.config = config
        self.pad_token_id = pad_token_id
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.device = resolve_device(config.device)
        model = model.to(device=self.device, dtype=_DTYPES[config.dtype])
        self.ref_model: Optional[Any] = None
        if config.finetune == "lora":
            self.model = self._with_lora(model)
        else:
            self.model = model
            for param in self.model.parameters():
                param.requires_grad_(True)
            if config.kl_coef > 0:
                import copy

                self.ref_model = copy.deepcopy(model).eval()
                for param in self.ref_model.parameters():
                    param.requires_grad_(False)
        self.model.eval()
        self.packs_prefixes = config.pack_shared_prefixes and _packable(self.model)
        if config.gradient_checkpointing:
            self._checkpoint_blocks()
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
    def _with_lora(self, model: Any) -> Any:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError as exc:  # pragma: no cover - peft is part of the train extra
            raise ImportError("LoRA training needs peft: pip install 'agentbolt[train]'") from exc
        if isinstance(model, PeftModel):
            return model
        lora = LoraConfig(
            r=self.config.lora_r,
            lora_alpha=self.config.lora_alpha,  # type: ignore[arg-type]  # peft accepts float scaling
            lora_dropout=self.config.lora_dropout,
            target_modules=self.config.lora_target_modules,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)

    def _checkpoint_blocks(self) -> None:
        """Recompute every transformer block in the backward pass instead of keeping its activations.

        Blocks are the modules the model lists in ``_no_split_modules`` (``LlamaDecoderLayer``...). The wrapper works
        whatever ``train()``/``eval()`` says (transformers' own checkpointing only runs in training mode, and these
        forwards run in eval mode) and does nothing when gradients are off (scoring passes, the engine).

        Raises:
            ValueError: The model does not name its blocks.
        """
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        names = set(getattr(base, "_no_split_modules", None) or ())
        blocks = [module for module in base.modules() if type(module).__name__ in names]
        if not blocks:
            raise ValueError(
                f"gradient_checkpointing: {type(base).__name__} does not name its transformer blocks (_no_split_modules)"
            )
        for block in blocks:
            block.forward = functools.partial(_checkpointed, block.forward)

    @property
    def uses_lora(self) -> bool:
        """True when the trained parameters are LoRA adapters."""
        return self.config.finetune == "lora"

    # ---------------------------------------------------------------------------------------------------- forwards
    def _batch(self, samples: Sequence[TokenSample]) -> Union[ResponseBatch, PackedBatch]:
        """The forward batch of ``samples``: packed by shared prefix (:mod:`.packing`) or left-padded."""
        if self.packs_prefixes:
            return pack_samples(samples).to(self.device)
        return collate(samples, self.pad_token_id).to(self.device)

    def _response_logits(self, model: Any, batch: Union[ResponseBatch, PackedBatch]) -> torch.Tensor:
        """Float32 logits ``[B, R, V]`` predicting the response-aligned targets.

        The output projection runs in float32 (:func:`~agentbolt.serving.logits.float32_logits`), as in the inference
        engine, so bfloat16 rounding of the logits does not separate the trainer's log-probs from the engine's. A
        packed batch runs the body once over the prefix tree and projects only the hidden states that predict
        response tokens.
        """
        from agentbolt.serving.logits import body_hidden_states, float32_head, float32_logits

        if isinstance(batch, PackedBatch):
            hidden = body_hidden_states(
                model,
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask(self.model.dtype, self.device),
                position_ids=batch.position_ids,
                use_cache=False,
            )[0]
            return float32_head(model, hidden[batch.source_positions])
        width = batch.response_width
        logits = float32_logits(
            model,
            width + 1,
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        return logits[:, :-1, :]

    def _reference_context(self) -> ContextManager[Any]:
        return self.model.disable_adapter() if self.uses_lora else nullcontext()

    def _temperatures(self, samples: Sequence[TokenSample]) -> Optional[torch.Tensor]:
        """Each sample's scoring temperature, on the device; None when all are 1 (nothing to divide)."""
        values = [sample.scoring_temperature for sample in samples]
        if all(value == 1.0 for value in values):
            return None
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    @staticmethod
    def _rows(values: torch.Tensor, samples: Sequence[TokenSample]) -> List[torch.Tensor]:
        """Each sample's response columns of ``[B, R]`` response-aligned ``values``, as CPU tensors."""
        width = values.shape[1]
        cpu = values.detach().cpu()
        return [cpu[row, width - len(sample.response_ids) :].clone() for row, sample in enumerate(samples)]

    @torch.no_grad()
    def compute_logprobs(
        self, samples: Sequence[TokenSample], *, reference: bool = False, tempered: bool = True
    ) -> List[torch.Tensor]:
        """Log-prob of every response token under the current policy (or the frozen reference).

        Args:
            samples: The samples to score.
            reference: Score with the frozen reference (adapters disabled, or the initial weights).
            tempered: True: under ``softmax(logits / T)`` with ``T`` each sample's
                :attr:`~TokenSample.scoring_temperature`, the distribution the response was sampled from (what the
                PPO ratio, the entropy and the KL use). False: under the untempered ``softmax(logits)``, the
                convention inference engines report.

        Returns:
            One float32 tensor of length ``len(sample.response_ids)`` per sample.
        """
        untempered, at_temperature = self._score(samples, reference=reference)
        return at_temperature if tempered else untempered

    @torch.no_grad()
    def _score(
        self, samples: Sequence[TokenSample], *, reference: bool = False
    ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Untempered and tempered log-probs of every response token, from one forward per micro-batch."""
        model = self.ref_model if (reference and self.ref_model is not None) else self.model
        context = self._reference_context() if (reference and self.ref_model is None) else nullcontext()
        untempered: List[torch.Tensor] = [torch.empty(0)] * len(samples)
        tempered: List[torch.Tensor] = [torch.empty(0)] * len(samples)
        with context:
            for micro in _chunks(prefix_order(samples, range(len(samples))), self.config.micro_batch_size):
                chunk = [samples[i] for i in micro]
                batch = self._batch(chunk)
                logits = self._response_logits(model, batch)
                raw = token_logprobs(logits, batch.targets)
                temperature = self._temperatures(chunk)
                scaled = raw if temperature is None else token_logprobs(logits, batch.targets, temperature)
                for i, raw_row, scaled_row in zip(
                    micro, self._rows(raw, chunk), self._rows(scaled, chunk), strict=True
                ):
                    untempered[i], tempered[i] = raw_row, scaled_row
        return untempered, tempered

    # -------------------------------------------------------------------------------------------------- update
    def train_step(self, samples: Sequence[TokenSample]) -> Dict[str, float]:
        """One GRPO update on samples whose ``advantage`` is set.

        Log-probs are those of each sample's sampling distribution, ``softmax(logits / T)`` at its temperature, for the
        ratio's old and new terms, the entropy and the reference alike. The old log-probs are the policy's before
        the update: with one optimizer step per update (one epoch, one minibatch) the training forward's own values
        (the ratio is exactly 1), otherwise a no-grad pass over the samples before the first step. Reference
        log-probs are computed once when ``kl_coef > 0``. Then ``ppo_epochs`` passes, each over
        ``config.minibatches_per_epoch`` minibatches of whole rollouts (:func:`rollout_minibatches`), one optimizer
        step per minibatch, gradients accumulated over micro-batches; an empty minibatch (fewer rollouts than
        minibatches) advances the learning-rate schedule without a step.

        Returns:
            Metrics: ``loss``, ``pg_loss``, ``kl``, ``clip_fraction``, ``entropy``, ``ratio_mean``,
            ``first_minibatch_ratio_max_dev`` (max |ratio - 1| in the first minibatch of the first epoch: 0 with one
            optimizer step per update, else the rounding between the scoring pass and the training forward),
            ``logprob_engine_diff_mean`` and ``logprob_engine_diff_max`` (see :func:`engine_logprob_diff`: the
            engine's untempered log-probs of the sampled tokens against the trainer's, before the update),
            ``grad_norm``, ``lr``, ``optimizer_steps``, ``skipped_optimizer_steps``, ``samples``, ``response_tokens``,
            ``update_tokens`` (prompt + response tokens of the samples, times ``ppo_epochs``), ``forward_tokens`` (tokens
            the training forwards computed: fewer when packing shares prefixes), ``update_seconds``,
            ``tokens_per_second`` (``update_tokens`` per second).
        """
        if not samples:
            raise ValueError("train_step needs at least one sample")
        config = self.config
        started = time.perf_counter()
        for index, sample in enumerate(samples):
            if sample.logprobs is not None and len(sample.logprobs) != len(sample.response_ids):
                raise ValueError(
                    f"sample {index} has {len(sample.logprobs)} engine log-probs for {len(sample.response_ids)} "
                    "response tokens"
                )
        # Old log-probs (CPU tensors, like compute_logprobs' results) and the trainer's untempered log-probs for the
        # engine comparison; with a single optimizer step both come from the training forward below.
        single_step = config.optimizer_steps_per_step == 1
        untempered: List[Optional[torch.Tensor]] = [None] * len(samples)
        old: List[torch.Tensor] = []
        if not single_step:
            scored, old = self._score(samples)
            untempered = list(scored)
        ref = self.compute_logprobs(samples, reference=True) if config.kl_coef > 0 else None

        training_mode = config.lora_dropout > 0
        self.model.train(training_mode)
        totals = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "ratio": 0.0, "clipped": 0.0, "tokens": 0.0, "entropy": 0.0}
        forward_tokens = 0
        grad_norms: List[float] = []
        first_dev = 0.0
        try:
            for epoch in range(config.ppo_epochs):
                minibatches = rollout_minibatches(samples, config.minibatches_per_epoch, self.generator)
                for mb_index, mb in enumerate(minibatches):
                    if not mb:
                        self._skip_optimizer_step()
                        continue
                    normalizer = float(sum(len(samples[i].response_ids) for i in mb))
                    self.optimizer.zero_grad(set_to_none=True)
                    for micro in _chunks(prefix_order(samples, mb), config.micro_batch_size):
                        chunk = [samples[i] for i in micro]
                        batch = self._batch(chunk)
                        forward_tokens += batch.computed_tokens
                        logits = self._response_logits(self.model, batch)
                        temperature = self._temperatures(chunk)
                        logp, entropy = logprobs_and_entropy(logits, batch.targets, temperature)
                        width = batch.response_width
                        if single_step:
                            old_aligned = logp.detach()
                            with torch.no_grad():
                                raw = old_aligned if temperature is None else token_logprobs(logits, batch.targets)
                            for i, row in zip(micro, self._rows(raw, chunk), strict=True):
                                untempered[i] = row
                        else:
                            old_aligned = right_aligned([old[i] for i in micro], width).to(self.device)
                        del logits
                        parts = policy_loss(
                            logp,
                            old_aligned,
                            torch.tensor(
                                [samples[i].advantage for i in micro], dtype=torch.float32, device=self.device
                            ),
                            batch.response_mask,
                            clip_low=config.clip_low,
                            clip_high=config.clip_high,
                            normalizer=normalizer,
                            ref_logp=None
                            if ref is None
                            else right_aligned([ref[i] for i in micro], width).to(self.device),
                            kl_coef=config.kl_coef,
                        )
                        parts.loss.backward()
                        with torch.no_grad():
                            totals["entropy"] += float((entropy * batch.response_mask).sum())
                            if epoch == 0 and mb_index == 0:
                                dev = (torch.exp(logp.detach() - old_aligned) - 1.0).abs()[batch.response_mask]
                                first_dev = max(first_dev, float(dev.max()) if dev.numel() else 0.0)
                        totals["loss"] += float(parts.loss.detach()) * normalizer
                        totals["pg"] += parts.pg_sum
                        totals["kl"] += parts.kl_sum
                        totals["ratio"] += parts.ratio_sum
                        totals["clipped"] += parts.clipped_tokens
                        totals["tokens"] += parts.tokens
                    grad_norms.append(self._clip_and_step())
        finally:
            self.model.eval()
            self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        elapsed = time.perf_counter() - started
        tokens = max(totals["tokens"], 1.0)
        update_tokens = float(sum(s.num_tokens for s in samples) * config.ppo_epochs)
        return {
            "loss": totals["loss"] / tokens,
            "pg_loss": totals["pg"] / tokens,
            "kl": totals["kl"] / tokens,
            "clip_fraction": totals["clipped"] / tokens,
            "entropy": totals["entropy"] / tokens,
            "ratio_mean": totals["ratio"] / tokens,
            "first_minibatch_ratio_max_dev": first_dev,
            **engine_logprob_diff(samples, [row for row in untempered if row is not None]),
            "grad_norm": sum(grad_norms) / len(grad_norms),
            **self.schedule_metrics(),
            "samples": float(len(samples)),
            "response_tokens": float(sum(len(s.response_ids) for s in samples)),
            "update_tokens": update_tokens,
            "forward_tokens": float(forward_tokens),
            "update_seconds": elapsed,
            "tokens_per_second": update_tokens / elapsed if elapsed > 0 else 0.0,
        }

    def skip_step(self) -> Dict[str, float]:
        """Count a training step with nothing to train: the learning-rate schedule advances by the step's share.

        Returns:
            :meth:`schedule_metrics` after the skip.
        """
        for _ in range(self.config.optimizer_steps_per_step):
            self._skip_optimizer_step()
        self.global_step += 1
        return self.schedule_metrics()

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
        if self.config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters, self.config.max_grad_norm)
        else:
            grads = [p.grad.detach().norm() for p in self.trainable_parameters if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(grads)) if grads else torch.tensor(0.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return float(norm)

    # ---------------------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(
        self, checkpoint_dir: str | os.PathLike[str], extra_state: Optional[Dict[str, Any]] = None
    ) -> Path:
        """Write ``checkpoint_dir/step_{global_step:06d}`` atomically and return its path.

        Contents: ``adapter/`` (PEFT format, loadable by vLLM ``--lora-modules``) or ``model.safetensors``,
        ``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` and ``trainer_state.json`` (counters plus ``extra_state``).
        """
        from safetensors.torch import save_model

        root = Path(checkpoint_dir)
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"{CHECKPOINT_PREFIX}{self.global_step:06d}"
        staging = root / f".{final.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        if self.uses_lora:
            self.model.save_pretrained(str(staging / "adapter"))
        else:
            save_model(self.model, str(staging / "model.safetensors"))
        torch.save(self.optimizer.state_dict(), staging / "optimizer.pt")
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
            "global_step": self.global_step,
            "optimizer_steps": self.optimizer_steps,
            "skipped_optimizer_steps": self.skipped_optimizer_steps,
            "finetune": self.config.finetune,
            "extra": extra_state or {},
        }
        (staging / "trainer_state.json").write_text(json.dumps(state, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        logger.info("Saved checkpoint %s", final)
        return final

    def load_checkpoint(self, path: str | os.PathLike[str]) -> Dict[str, Any]:
        """Restore weights, optimizer, scheduler, counters and RNG states from a checkpoint directory.

        Returns:
            The ``extra_state`` saved with the checkpoint.
        """
        from safetensors.torch import load_file, load_model

        path = Path(path)
        state_file = path / "trainer_state.json"
        if not state_file.exists():
            raise FileNotFoundError(f"{path} is not a checkpoint (no trainer_state.json)")
        state = json.loads(state_file.read_text())
        if state.get("finetune") != self.config.finetune:
            raise ValueError(f"checkpoint {path} was saved with finetune={state.get('finetune')!r}")
        if self.uses_lora:
            from peft import set_peft_model_state_dict

            weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
            result = set_peft_model_state_dict(self.model, weights)
            unexpected = getattr(result, "unexpected_keys", None)
            if unexpected:
                raise ValueError(f"adapter in {path} does not fit the model: {unexpected[:3]}")
        else:
            load_model(self.model, str(path / "model.safetensors"))
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        rng = torch.load(path / "rng.pt", weights_only=False)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.generator.set_state(rng["generator"])
        self.global_step = int(state["global_step"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_optimizer_steps = int(state.get("skipped_optimizer_steps", 0))
        logger.info("Resumed from checkpoint %s (step %d)", path, self.global_step)
        return dict(state.get("extra") or {})
