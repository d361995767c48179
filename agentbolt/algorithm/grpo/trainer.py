"""The torch policy trainer behind GRPO.

:class:`PolicyTrainer` is a :class:`~agentbolt.algorithm.finetuning.trainer.ModelTrainer` (the policy, optionally
wrapped with PEFT LoRA, an AdamW optimizer over the trainable parameters only, a learning-rate schedule counted in
optimizer steps, and exact checkpoints and resume) that adds the frozen reference used for the KL term and the GRPO
update.

Micro-batches are packed as one prefix tree (:mod:`~agentbolt.algorithm.grpo.packing`, ``pack_shared_prefixes``), so
tokens shared by samples are computed once, or left-padded with explicit position ids, so each response ends at the
last position and the model only projects the last ``max_response_length + 1`` hidden states to the vocabulary. All forwards run with dropout off
(``eval()``) unless ``lora_dropout > 0``.

The PPO ratio's old and new log-probs are both the trainer's own, of the distribution each response was sampled from
(``softmax(logits / T)`` at the sample's temperature), in the trainer's precision; the engine's log-probs only
measure how closely the served model agrees with the trained one (``logprob_engine_diff_*``).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Dict, List, Literal, Optional, Sequence, Tuple, Union

import torch

from agentbolt.algorithm.finetuning.trainer import (
    CHECKPOINT_PREFIX,
    ModelTrainer,
    chunks,
    grad_norm_metrics,
    latest_checkpoint,
    lr_multiplier,
    resolve_device,
)
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.loss import logprobs_and_entropy, policy_loss, token_logprobs
from agentbolt.algorithm.grpo.packing import PackedBatch, pack_samples, packable, prefix_order, tree_logits
from agentbolt.algorithm.grpo.samples import TokenSample

if TYPE_CHECKING:
    from agentbolt.algorithm.grpo.distributed import DataParallel

__all__ = [
    "CHECKPOINT_PREFIX",
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

_chunks = chunks


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


def right_aligned(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D float tensors right-aligned into ``[len(rows), width]`` (zeros on the left)."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        if len(row):
            out[i, width - len(row) :] = row
    return out


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


def sample_weights(samples: Sequence[TokenSample], aggregation: str) -> List[float]:
    """What each sample weighs in the loss, summed over its response tokens.

    ``"token_mean"``: its response token count (every token weighs 1). ``"rollout_mean"``: ``1 / T`` for each of the
    ``T`` samples of its rollout, so every rollout weighs 1 in all, shared equally among its calls (and each call's
    share equally among its tokens). A minibatch's normalizer is the sum over its samples.

    Raises:
        ValueError: Unknown aggregation.
    """
    if aggregation == "token_mean":
        return [float(len(sample.response_ids)) for sample in samples]
    if aggregation == "rollout_mean":
        calls: Dict[str, int] = {}
        for sample in samples:
            calls[sample.rollout_id] = calls.get(sample.rollout_id, 0) + 1
        return [1.0 / calls[sample.rollout_id] for sample in samples]
    raise ValueError(f"loss aggregation must be 'token_mean' or 'rollout_mean', got {aggregation!r}")


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


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: its local shard when it is a sharded DTensor, else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


class PolicyTrainer(ModelTrainer):
    """GRPO policy optimisation on a causal LM.

    Args:
        model: A transformers causal LM (a ``PeftModel`` is used as is). With ``finetune="lora"`` it is wrapped with
            fresh LoRA adapters; with ``"full"`` all its weights train.
        config: Optimisation options (see :class:`GRPOConfig`).
        pad_token_id: Id used for padding (masked out, any valid id works).
        data_parallel: This process's place in a data-parallel run (:mod:`.distributed`), or None to train alone.
            Every rank then calls :meth:`train_step` with the same samples (the leader's call sends them to the
            followers, whose :meth:`DataParallel.follow` loop makes theirs) and computes its share of each minibatch.
            With ``config.data_parallel="fsdp"`` the model (and a full fine-tuning reference) is sharded over the
            ranks and the leader keeps a full copy, :attr:`served_model`; every rank must then build its trainer at
            the same time (the reference weights are shared while building).

    Raises:
        ValueError: ``data_parallel`` runs on another device than ``config.device`` resolves to, or a sharded
            trainer is given a quantized model.
    """

    checkpoint_kind = "grpo"
    config: GRPOConfig

    def __init__(
        self,
        model: Any,
        config: GRPOConfig,
        *,
        pad_token_id: int = 0,
        data_parallel: Optional[DataParallel] = None,
    ) -> None:
        self.ref_model: Optional[Any] = None
        if data_parallel is not None and data_parallel.device.type != resolve_device(config.device).type:
            raise ValueError(
                f"the data-parallel ranks communicate on {data_parallel.device.type} but the trainer runs on "
                f"{resolve_device(config.device)}: launch with the same device option on every rank"
            )
        self.data_parallel = data_parallel
        self.shards_model = data_parallel is not None and config.data_parallel == "fsdp"
        """Whether the model is sharded over the ranks (``data_parallel="fsdp"`` under torchrun)."""
        self._full_copy: Optional[Any] = None  # the leader's unsharded policy, when the model is sharded
        self._sharded_roots: Dict[int, Any] = {}  # id(model) -> its root FSDP unit
        self._resumed_optimizer_state: Optional[Dict[str, Any]] = None  # a checkpoint's, until shared
        super().__init__(model, config, pad_token_id=pad_token_id)
        self.packs_prefixes = config.pack_shared_prefixes and packable(self.model)

    def _keep_reference(self, model: Any) -> None:
        """Full fine-tuning with a KL term keeps a frozen copy of the initial weights as the reference."""
        if self.uses_lora or self.config.kl_coef <= 0:
            return  # LoRA's reference is the base model with the adapters disabled
        import copy

        self.ref_model = copy.deepcopy(model).eval()
        for param in self.ref_model.parameters():
            param.requires_grad_(False)

    # ---------------------------------------------------------------------------------------------------- forwards
    def _batch(self, samples: Sequence[TokenSample]) -> Union[ResponseBatch, PackedBatch]:
        """The forward batch of ``samples``: packed by shared prefix (:mod:`.packing`) or left-padded."""
        if self.packs_prefixes:
            return pack_samples(samples).to(self.device)
        return collate(samples, self.pad_token_id).to(self.device)

    def _response_logits(self, model: Any, batch: Union[ResponseBatch, PackedBatch]) -> torch.Tensor:
        """:meth:`_logits` of ``model``, through its root FSDP unit when it is sharded."""
        root = self._sharded_roots.get(id(model))
        return root(batch) if root is not None else self._logits(model, batch)

    @staticmethod
    def _logits(model: Any, batch: Union[ResponseBatch, PackedBatch]) -> torch.Tensor:
        """Float32 logits ``[B, R, V]`` predicting the response-aligned targets.

        The output projection runs in float32 (:func:`~agentbolt.serving.logits.float32_logits`), as in the inference
        engine, so bfloat16 rounding of the logits does not separate the trainer's log-probs from the engine's. A
        packed batch runs the body once over the prefix tree and projects only the hidden states that predict
        response tokens.
        """
        from agentbolt.serving.logits import float32_logits

        if isinstance(batch, PackedBatch):
            return tree_logits(model, batch, batch.source_positions)
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

    def named_models(self) -> List[Tuple[str, Any]]:
        """``(prefix, module)`` of the trained model (``""``) and of a frozen reference (``"ref."``) when there is one."""
        return [("", self.model)] + ([("ref.", self.ref_model)] if self.ref_model is not None else [])

    # ------------------------------------------------------------------------------------------------ sharding
    def _placement(self) -> torch.device:
        return torch.device("cpu") if self.shards_model else self.device

    def _prepare_model(self) -> None:
        """Shard the model (and a full fine-tuning reference) over the ranks; the leader keeps a full copy of the
        policy. The reference takes the leader's weights here; the policy takes them before the first update
        (:meth:`load_leader_state`), after the leader has resumed from a checkpoint if it does."""
        if not self.shards_model:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        from agentbolt.algorithm.finetuning.trainer import _is_quantized
        from agentbolt.algorithm.grpo.distributed import module_tensors, shard_model

        dp = self.data_parallel
        assert dp is not None
        if _is_quantized(self.model):
            raise ValueError("data_parallel='fsdp' cannot shard a quantized (4/8-bit) model: load it unquantized")
        models = self.named_models()
        dp.check_same_models(module_tensors(models))
        if dp.is_leader:
            import copy

            self._full_copy = copy.deepcopy(self.model).to(self.device).eval()
            for param in self._full_copy.parameters():
                param.requires_grad_(False)
        reference_state = self.ref_model.state_dict() if self.ref_model is not None and dp.is_leader else {}
        for _, model in models:
            self._sharded_roots[id(model)] = shard_model(model, self._logits, dp.device, dp.world_size)
        if self.ref_model is not None:
            with dp.failures("sharing the leader's reference weights"):
                set_model_state_dict(
                    self.ref_model,
                    reference_state,
                    options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
                )
        logger.info(
            "Rank %d holds %d of the policy's %d parameters (data_parallel='fsdp' over %d ranks)",
            dp.rank,
            sum(_local(p).numel() for p in self.model.parameters()),
            sum(p.numel() for p in self.model.parameters()),
            dp.world_size,
        )

    @property
    def served_model(self) -> Any:
        """The unsharded policy that is served and checkpointed: the trained model itself, or, when the model is
        sharded, the leader's full copy (refreshed after every update)."""
        return self._full_copy if self._full_copy is not None else self.model

    def load_leader_state(self) -> None:
        """Every rank, once before the first update of a sharded run: the shards take the leader's full weights
        (its initial or resumed ones) and, after a resume, the checkpoint's optimizer state."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        dp = self.data_parallel
        assert dp is not None and self.shards_model
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        resumed = self._resumed_optimizer_state
        with dp.failures("sharing the leader's weights"):
            set_model_state_dict(
                self.model, self._full_copy.state_dict() if self._full_copy is not None else {}, options=options
            )
        if dp.broadcast_object(resumed is not None, "telling whether the leader resumed"):
            state = self._named_optimizer_state(resumed) if resumed is not None else {}
            with dp.failures("sharing the leader's optimizer state"):
                set_optimizer_state_dict(self.model, self.optimizer, state, options=options)
        self._resumed_optimizer_state = None

    def gather_optimizer_state(self) -> Dict[str, Any]:
        """Every rank of a sharded run: the full optimizer state, numbered like ``optimizer.state_dict()``'s, on the
        leader (an empty dict elsewhere)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        dp = self.data_parallel
        assert dp is not None and self.shards_model
        with dp.failures("gathering the optimizer state"):
            named = get_optimizer_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        if not dp.is_leader:
            return {}
        index = {name: i for i, name in enumerate(self._trainable_names())}
        return {
            "state": {index[name]: value for name, value in named["state"].items()},
            "param_groups": [
                {**group, "params": [index[name] for name in group["params"]]} for group in named["param_groups"]
            ],
        }

    def _named_optimizer_state(self, numbered: Dict[str, Any]) -> Dict[str, Any]:
        """A numbered optimizer state (``optimizer.state_dict()``'s layout) keyed by parameter names instead."""
        names = self._trainable_names()
        return {
            "state": {names[int(i)]: value for i, value in numbered["state"].items()},
            "param_groups": [
                {**group, "params": [names[int(i)] for i in group["params"]]} for group in numbered["param_groups"]
            ],
        }

    def _trainable_names(self) -> List[str]:
        """Names of :attr:`trainable_parameters`, in their order (the optimizer's numbering)."""
        return [name for name, param in self.model.named_parameters() if param.requires_grad]

    def _optimizer_state(self) -> Dict[str, Any]:
        if not self.shards_model:
            return super()._optimizer_state()
        self._lead("checkpoint")
        return self.gather_optimizer_state()

    def _load_optimizer_state(self, state: Dict[str, Any]) -> None:
        if not self.shards_model:
            super()._load_optimizer_state(state)
        else:
            self._resumed_optimizer_state = state  # shared with the shards before the first update

    @torch.no_grad()
    def _refresh_full_copy(self) -> None:
        """Every rank of a sharded run, after an update: gather each trained parameter into the leader's full copy."""
        dp = self.data_parallel
        assert dp is not None
        full_params = dict(self._full_copy.named_parameters()) if self._full_copy is not None else {}
        with dp.failures("gathering the updated weights"):
            for name, param in self.model.named_parameters():
                if param.requires_grad:
                    full = param.full_tensor()
                    if full_params:
                        full_params[name].copy_(full)

    def _idle_pass(self, model: Any, *, backward: bool) -> None:
        """A forward (and backward) over one padding token that changes nothing: a sharded rank with fewer
        micro-batches than another runs these, so that every rank calls FSDP's collectives equally often."""
        idle = TokenSample(
            prompt_ids=[self.pad_token_id],
            response_ids=[self.pad_token_id],
            logprobs=None,
            reward=0.0,
            group_id="",
            rollout_id="",
        )
        logits = self._response_logits(model, self._batch([idle]))
        if backward:
            (logits.sum() * 0.0).backward()

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
        self, samples: Sequence[TokenSample], *, reference: bool = False, across_ranks: bool = False
    ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Untempered and tempered log-probs of every response token, from one forward per micro-batch.

        ``across_ranks`` (inside a data-parallel update, on every rank): each rank scores its share of the
        micro-batches and the ranks exchange the results.
        """
        model = self.ref_model if (reference and self.ref_model is not None) else self.model
        context = self._reference_context() if (reference and self.ref_model is None) else nullcontext()
        if self.shards_model and not across_ranks:  # one rank alone cannot run the sharded model
            if self._full_copy is None or (self.ref_model is not None and reference):
                raise ValueError(
                    "with data_parallel='fsdp', log-probs outside an update are computed on the leader from its full "
                    "copy of the policy (or of the LoRA base model); the full fine-tuning reference is sharded"
                )
            model = self._full_copy
            context = model.disable_adapter() if reference and self.uses_lora else nullcontext()
        untempered: List[torch.Tensor] = [torch.empty(0)] * len(samples)
        tempered: List[torch.Tensor] = [torch.empty(0)] * len(samples)
        sequences = [sample.token_ids for sample in samples]
        micro_batches = list(_chunks(prefix_order(sequences, range(len(samples))), self.config.micro_batch_size))
        with context:
            for micro in self._local_share(micro_batches, across_ranks):
                if micro is None:
                    self._idle_pass(model, backward=False)
                    continue
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
        if across_ranks and self.data_parallel is not None:
            local = {i for micro in self.data_parallel.shard(micro_batches) for i in micro}
            merged = self.data_parallel.merge_per_sample(
                [(untempered[i], tempered[i]) if i in local else None for i in range(len(samples))]
            )
            untempered = [row[0] for row in merged if row is not None]
            tempered = [row[1] for row in merged if row is not None]
        return untempered, tempered

    def _local_share(
        self, micro_batches: Sequence[Sequence[int]], across_ranks: bool = True
    ) -> List[Optional[Sequence[int]]]:
        """The micro-batches this rank computes: all of them alone, else every ``world_size``-th from its rank; a
        sharded rank's share is padded with None (an idle pass) to the longest share, ``ceil(M / world_size)``."""
        if not across_ranks or self.data_parallel is None:
            return list(micro_batches)
        share: List[Optional[Sequence[int]]] = list(self.data_parallel.shard(micro_batches))
        if self.shards_model:
            share += [None] * (-(-len(micro_batches) // self.data_parallel.world_size) - len(share))
        return share

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
            ``grad_norm`` and ``nonfinite_grad_steps`` (see :func:`grad_norm_metrics`: the mean norm of the steps
            taken, and the steps skipped for a NaN or infinite gradient), ``lr``, ``optimizer_steps``,
            ``skipped_optimizer_steps``, ``samples``, ``response_tokens``,
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
        self._lead("train_step", samples)
        dp = self.data_parallel
        # Old log-probs (CPU tensors, like compute_logprobs' results) and the trainer's untempered log-probs for the
        # engine comparison; with a single optimizer step both come from the training forward below.
        single_step = config.optimizer_steps_per_step == 1
        untempered: List[Optional[torch.Tensor]] = [None] * len(samples)
        old: List[torch.Tensor] = []
        if not single_step:
            scored, old = self._score(samples, across_ranks=True)
            untempered = list(scored)
        ref = self._score(samples, reference=True, across_ranks=True)[1] if config.kl_coef > 0 else None

        training_mode = config.lora_dropout > 0
        self.model.train(training_mode)
        totals = {
            "loss": 0.0, "weight": 0.0, "pg": 0.0, "kl": 0.0, "ratio": 0.0, "clipped": 0.0, "tokens": 0.0, "entropy": 0.0
        }  # fmt: skip
        forward_tokens = 0
        grad_norms: List[float] = []
        first_dev = 0.0
        sequences = [sample.token_ids for sample in samples]
        weights = sample_weights(samples, config.loss_aggregation)
        try:
            for epoch in range(config.ppo_epochs):
                minibatches = rollout_minibatches(samples, config.minibatches_per_epoch, self.generator)
                for mb_index, mb in enumerate(minibatches):
                    if not mb:
                        self._skip_optimizer_step()
                        continue
                    # Every rank divides by the whole minibatch's weight, so the gradients summed over ranks are the
                    # one-process gradient (see distributed.py).
                    normalizer = float(sum(weights[i] for i in mb))
                    self.optimizer.zero_grad(set_to_none=True)
                    micro_batches = list(_chunks(prefix_order(sequences, mb), config.micro_batch_size))
                    for micro in self._local_share(micro_batches):
                        if micro is None:
                            self._idle_pass(self.model, backward=True)
                            continue
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
                            token_weights=None
                            if config.loss_aggregation == "token_mean"
                            else torch.tensor(
                                [weights[i] / max(len(samples[i].response_ids), 1) for i in micro],
                                dtype=torch.float32,
                                device=self.device,
                            ),
                        )
                        parts.loss.backward()
                        with torch.no_grad():
                            totals["entropy"] += float((entropy * batch.response_mask).sum())
                            if epoch == 0 and mb_index == 0:
                                dev = (torch.exp(logp.detach() - old_aligned) - 1.0).abs()[batch.response_mask]
                                first_dev = max(first_dev, float(dev.max()) if dev.numel() else 0.0)
                        totals["loss"] += float(parts.loss.detach()) * normalizer
                        totals["weight"] += sum(weights[i] for i in micro)
                        totals["pg"] += parts.pg_sum
                        totals["kl"] += parts.kl_sum
                        totals["ratio"] += parts.ratio_sum
                        totals["clipped"] += parts.clipped_tokens
                        totals["tokens"] += parts.tokens
                    if dp is not None and not self.shards_model:  # FSDP sums them in each backward
                        dp.sum_gradients(self.trainable_parameters)
                    grad_norms.append(self._clip_and_step())
        finally:
            self.model.eval()
            self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        if self.shards_model:
            self._refresh_full_copy()
        if dp is not None:
            totals = dp.sum_values({**totals, "forward_tokens": float(forward_tokens)})
            forward_tokens = int(totals.pop("forward_tokens"))
            first_dev = dp.max_values({"first_dev": first_dev})["first_dev"]
            if single_step:
                untempered = dp.merge_per_sample(untempered)
        elapsed = time.perf_counter() - started
        tokens = max(totals["tokens"], 1.0)
        update_tokens = float(sum(s.num_tokens for s in samples) * config.ppo_epochs)
        return {
            "loss": totals["loss"] / max(totals["weight"], 1e-12),
            "pg_loss": totals["pg"] / tokens,
            "kl": totals["kl"] / tokens,
            "clip_fraction": totals["clipped"] / tokens,
            "entropy": totals["entropy"] / tokens,
            "ratio_mean": totals["ratio"] / tokens,
            "first_minibatch_ratio_max_dev": first_dev,
            **engine_logprob_diff(samples, [row for row in untempered if row is not None]),
            **grad_norm_metrics(grad_norms),
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
        self._lead("skip_step")
        for _ in range(self.config.optimizer_steps_per_step):
            self._skip_optimizer_step()
        self.global_step += 1
        return self.schedule_metrics()

    # ---------------------------------------------------------------------------------------------- data parallel
    def _lead(
        self, kind: Literal["train_step", "skip_step", "checkpoint", "stop"], samples: Sequence[TokenSample] = ()
    ) -> None:
        """On the leader of a data-parallel run, have the followers do ``kind`` too (with the leader's state first,
        before the first update)."""
        from agentbolt.algorithm.grpo.distributed import UpdateCommand

        dp = self.data_parallel
        if dp is None or not dp.is_leader or dp.closed:
            return
        share_state = kind != "stop" and not dp.state_shared
        dp.send(UpdateCommand(kind=kind, samples=list(samples), share_state=share_state))
        if share_state:
            dp.share_state(self)

    def close(self) -> None:
        """Release the data-parallel run: the leader tells the followers to stop; every rank leaves the process
        groups. Without data parallelism, nothing to do."""
        if self.data_parallel is None:
            return
        from agentbolt.algorithm.grpo.distributed import DistributedUpdateError

        try:
            self._lead("stop")
        except DistributedUpdateError as exc:  # a follower already gone: nothing left to stop
            logger.warning("Could not tell the data-parallel followers to stop: %s", exc)
        self.data_parallel.close()
