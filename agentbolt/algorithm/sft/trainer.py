"""The torch trainer behind SFT: next-token cross-entropy on the target tokens only.

:class:`SFTTrainer` is a :class:`~agentbolt.algorithm.finetuning.trainer.ModelTrainer` (model set-up, LoRA, AdamW,
learning-rate schedule, checkpoints) that adds the supervised update. One optimizer step takes a batch of
:class:`~agentbolt.algorithm.sft.data.TokenSample` and

* lays each micro-batch out as rows: one sample per row, right-padded (``packing="none"``); several samples
  concatenated per row up to ``max_sequence_length`` tokens, each restarting its position ids so it attends only to
  itself (``"rows"``; transformers builds the block-diagonal mask from the position ids); or one prefix tree of the
  micro-batch's samples (``"prefix"``, :mod:`agentbolt.algorithm.grpo.packing`): a token several samples share at
  the same place of their common start is computed once, with a tree attention mask that gives it exactly the
  context it has in each of them, and samples are ordered so that those sharing a prefix fall in one micro-batch;
* runs the rows in micro-batches of ``micro_batch_size``, projecting to the vocabulary only the hidden states that
  predict a target token (float32 projection, as the inference engine does);
* sums the token NLL of every target and divides by the number of targets of the whole optimizer step, so the loss
  and the gradient are the same whatever the micro-batching, padding or packing;
* clips the gradient norm and steps the optimizer and the schedule.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from agentbolt.algorithm.finetuning.trainer import ModelTrainer, chunks, grad_norm_metrics
from agentbolt.algorithm.grpo.packing import (
    PrefixTree,
    attention_implementation,
    packable,
    prefix_order,
    prefix_tree,
    tree_logits,
)
from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import TokenSample

__all__ = ["PrefixBatch", "SFTTrainer", "TargetBatch", "layout_prefix_tree", "layout_rows", "pack_rows"]

logger = logging.getLogger(__name__)


@dataclass
class TargetBatch:
    """Rows ready for the forward pass.

    ``input_ids``, ``position_ids`` and ``targets`` are ``[B, L]``; ``attention_mask`` is ``[B, L]`` for padded rows
    and None for packed ones (the position ids then delimit the samples). ``targets[b, t]`` is True when the token at
    ``t + 1`` is a target, i.e. the hidden state at ``t`` predicts a target.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: Optional[torch.Tensor]
    targets: torch.Tensor

    @property
    def num_targets(self) -> int:
        """Target tokens in the batch."""
        return int(self.targets.sum())

    @property
    def num_tokens(self) -> int:
        """Positions processed, padding included."""
        return int(self.input_ids.numel())


@dataclass
class PrefixBatch:
    """A micro-batch laid out as one prefix tree (``packing="prefix"``).

    Attributes:
        tree: The samples' tokens, each shared prefix token once.
        sources: ``[N]`` the packed position whose hidden state predicts each target, sample after sample.
        labels: ``[N]`` the target tokens, in the same order.
    """

    tree: PrefixTree
    sources: torch.Tensor
    labels: torch.Tensor

    @property
    def num_targets(self) -> int:
        """Target tokens in the batch."""
        return int(self.labels.numel())

    @property
    def num_tokens(self) -> int:
        """Positions processed: the tree's nodes."""
        return self.tree.computed_tokens


def layout_prefix_tree(samples: Sequence[TokenSample]) -> PrefixBatch:
    """Lay ``samples`` out as their prefix tree; each target (any loss-mask segment) is read from the node of the
    token before it in its own sample.

    Raises:
        ValueError: No samples, or an empty one.
    """
    tree, paths = prefix_tree([sample.input_ids for sample in samples])
    sources: List[int] = []
    labels: List[int] = []
    for sample, path in zip(samples, paths, strict=True):
        for t in range(1, len(sample.input_ids)):
            if sample.loss_mask[t]:
                sources.append(path[t - 1])
                labels.append(sample.input_ids[t])
    return PrefixBatch(tree, torch.tensor(sources, dtype=torch.long), torch.tensor(labels, dtype=torch.long))


def pack_rows(samples: Sequence[TokenSample], row_length: int) -> List[List[TokenSample]]:
    """Group samples into rows of at most ``row_length`` tokens (first fit, longest first).

    Raises:
        ValueError: A sample is longer than ``row_length``.
    """
    rows: List[List[TokenSample]] = []
    free: List[int] = []
    for sample in sorted(samples, key=lambda s: -len(s.input_ids)):
        size = len(sample.input_ids)
        if size > row_length:
            raise ValueError(f"a sample of {size} tokens does not fit a packed row of {row_length}")
        for index, room in enumerate(free):
            if room >= size:
                rows[index].append(sample)
                free[index] -= size
                break
        else:
            rows.append([sample])
            free.append(row_length - size)
    return rows


def layout_rows(rows: Sequence[Sequence[TokenSample]], pad_token_id: int, packed: bool) -> TargetBatch:
    """Concatenate each row's samples and right-pad the rows to the longest.

    Padded rows (``packed=False``, one sample each) get an attention mask; packed rows get position ids that restart
    at 0 for each sample (padding counts as one more sample) and no attention mask.
    """
    if not rows:
        raise ValueError("cannot lay out an empty batch")
    length = max(sum(len(s.input_ids) for s in row) for row in rows)
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((batch, length), dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    mask = torch.zeros((batch, length), dtype=torch.bool)
    for b, row in enumerate(rows):
        start = 0
        for sample in row:
            size = len(sample.input_ids)
            input_ids[b, start : start + size] = torch.tensor(sample.input_ids, dtype=torch.long)
            position_ids[b, start : start + size] = torch.arange(size)
            attention_mask[b, start : start + size] = 1
            mask[b, start : start + size] = torch.tensor(sample.loss_mask, dtype=torch.bool)
            mask[b, start] = False  # a sample's first token has nothing of its own before it to be predicted from
            start += size
        if start < length:
            position_ids[b, start:] = torch.arange(length - start)
    targets = torch.zeros_like(mask)
    targets[:, :-1] = mask[:, 1:]
    return TargetBatch(input_ids, position_ids, None if packed else attention_mask, targets)


def target_logits(model: Any, batch: TargetBatch) -> torch.Tensor:
    """Float32 logits ``[N, V]`` of the positions that predict a target, in row-major order."""
    from agentbolt.serving.logits import float32_logits_at

    inputs: Dict[str, Any] = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    if batch.attention_mask is not None:
        inputs["attention_mask"] = batch.attention_mask
    return float32_logits_at(model, batch.targets, **inputs)


class SFTTrainer(ModelTrainer):
    """Supervised fine-tuning of a causal LM on target tokens.

    Args:
        model: A transformers causal LM (a ``PeftModel`` is used as is).
        config: The SFT options (LoRA or full, micro-batches, packing, optimizer, schedule...).
        pad_token_id: Id used for padding (never a target).
        max_length: Longest sample and packed row in tokens.

    Raises:
        ValueError: ``packing="prefix"`` with a model whose packed forward would not be exact (an attention that does
            not read a 4-D mask, such as flash attention, or logits post-processed after the output projection).
    """

    checkpoint_kind = "sft"
    config: SFTConfig

    def __init__(self, model: Any, config: SFTConfig, *, pad_token_id: int = 0, max_length: int = 2048) -> None:
        if config.packing == "prefix" and not packable(model):
            from agentbolt.serving.logits import plain_output_head

            raise ValueError(
                "packing='prefix' needs sdpa or eager attention and logits that are the output projection; this "
                f"model has attention {attention_implementation(model)!r} and "
                f"{'a plain' if plain_output_head(model) else 'a post-processed'} output head: load it with "
                "attn_implementation='sdpa', or use packing='rows'"
            )
        super().__init__(model, config, pad_token_id=pad_token_id)
        self.max_length = max_length

    def batches(self, samples: Sequence[TokenSample]) -> List[Union[TargetBatch, PrefixBatch]]:
        """The micro-batches one optimizer step over ``samples`` runs (rows padded or packed, or prefix trees)."""
        layout = self.config.packing
        if layout == "prefix":
            order = prefix_order([sample.input_ids for sample in samples], range(len(samples)))
            return [
                layout_prefix_tree([samples[i] for i in group]) for group in chunks(order, self.config.micro_batch_size)
            ]
        if layout == "rows":
            rows = pack_rows(samples, self.max_length)
        else:
            rows = [[sample] for sample in sorted(samples, key=lambda s: len(s.input_ids))]
        return [
            layout_rows(group, self.pad_token_id, packed=layout == "rows")
            for group in chunks(rows, self.config.micro_batch_size)
        ]

    def loss_sum(self, batch: Union[TargetBatch, PrefixBatch]) -> torch.Tensor:
        """Summed next-token NLL of the batch's targets (with the graph, for backward)."""
        if isinstance(batch, PrefixBatch):
            logits = tree_logits(self.model, batch.tree.to(self.device), batch.sources.to(self.device))
            return F.cross_entropy(logits, batch.labels.to(self.device), reduction="sum")
        batch = TargetBatch(
            batch.input_ids.to(self.device),
            batch.position_ids.to(self.device),
            None if batch.attention_mask is None else batch.attention_mask.to(self.device),
            batch.targets.to(self.device),
        )
        logits = target_logits(self.model, batch)
        labels = batch.input_ids[:, 1:][batch.targets[:, :-1]]
        return F.cross_entropy(logits, labels, reduction="sum")

    def optimizer_step(self, samples: Sequence[TokenSample]) -> Dict[str, float]:
        """One optimizer step on ``samples``: mean NLL over all their target tokens, gradients accumulated over
        micro-batches, clipped, AdamW and schedule stepped.

        Returns:
            Metrics: ``loss`` (mean NLL per target token), ``grad_norm``, ``lr``, ``optimizer_steps``,
            ``samples``, ``target_tokens``, ``tokens`` (positions processed, padding included), ``seconds``.

        Raises:
            ValueError: No sample, or a sample longer than the trainer's ``max_length``, or without targets.
        """
        if not samples:
            raise ValueError("an optimizer step needs at least one sample")
        for sample in samples:
            if len(sample.input_ids) > self.max_length:
                raise ValueError(f"a sample of {len(sample.input_ids)} tokens exceeds max_length={self.max_length}")
            if len(sample.loss_mask) != len(sample.input_ids) or not any(sample.loss_mask[1:]):
                raise ValueError("every sample needs one loss-mask flag per token and at least one target")
        started = time.perf_counter()
        normalizer = float(sum(sample.num_targets for sample in samples))
        self.model.train(self.config.lora_dropout > 0)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        tokens = 0
        try:
            for batch in self.batches(samples):
                loss = self.loss_sum(batch)
                (loss / normalizer).backward()
                total += float(loss.detach())
                tokens += batch.num_tokens
            grad_norm = self._clip_and_step()
        finally:
            self.model.eval()
            self.optimizer.zero_grad(set_to_none=True)
        return {
            "loss": total / normalizer,
            "grad_norm": grad_norm,
            **self.schedule_metrics(),
            "samples": float(len(samples)),
            "target_tokens": normalizer,
            "tokens": float(tokens),
            "seconds": time.perf_counter() - started,
        }

    def train_epochs(self, samples: Sequence[TokenSample]) -> Dict[str, float]:
        """One SFT training step: ``epochs`` shuffled passes over ``samples`` in optimizer steps of
        ``train_batch_size``; the step counter advances by one.

        Returns:
            Metrics averaged over the optimizer steps (``loss`` weighted by target tokens; ``grad_norm`` over the
            steps taken, with ``nonfinite_grad_steps`` counting those skipped for a NaN or infinite gradient: see
            :func:`~agentbolt.algorithm.finetuning.trainer.grad_norm_metrics`), plus ``first_loss`` and ``last_loss``
            (of the first and last optimizer step), ``optimizer_steps_taken``, ``samples_per_second`` and
            ``tokens_per_second``.
        """
        if not samples:
            raise ValueError("a training step needs at least one sample")
        config = self.config
        started = time.perf_counter()
        steps: List[Dict[str, float]] = []
        for _ in range(config.epochs):
            order = torch.randperm(len(samples), generator=self.generator).tolist()
            for batch in chunks(order, config.train_batch_size):
                steps.append(self.optimizer_step([samples[i] for i in batch]))
        self.global_step += 1
        elapsed = time.perf_counter() - started
        targets = sum(s["target_tokens"] for s in steps)
        processed = sum(s["samples"] for s in steps)
        return {
            "loss": sum(s["loss"] * s["target_tokens"] for s in steps) / targets,
            "first_loss": steps[0]["loss"],
            "last_loss": steps[-1]["loss"],
            **grad_norm_metrics([s["grad_norm"] for s in steps]),
            **self.schedule_metrics(),
            "optimizer_steps_taken": float(len(steps)),
            "samples": float(len(samples)),
            "target_tokens": targets,
            "tokens": sum(s["tokens"] for s in steps),
            "seconds": elapsed,
            "samples_per_second": processed / elapsed if elapsed > 0 else math.nan,
            "tokens_per_second": sum(s["tokens"] for s in steps) / elapsed if elapsed > 0 else math.nan,
        }

    def skip_step(self) -> Dict[str, float]:
        """Count a training step with nothing selected: the weights and the schedule stay as they are."""
        self.global_step += 1
        return self.schedule_metrics()

    @torch.no_grad()
    def evaluate(self, samples: Sequence[TokenSample]) -> float:
        """Mean NLL per target token of ``samples`` under the current weights (no update)."""
        total, count = 0.0, 0
        for batch in self.batches(samples):
            total += float(self.loss_sum(batch))
            count += batch.num_targets
        return total / count if count else math.nan
