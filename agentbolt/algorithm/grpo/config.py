"""Configuration of the GRPO algorithm.

Every option is validated when the config is built, so a bad value fails before any model is loaded. The reference
page ``docs/grpo.md`` explains each option together with the maths it controls.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["GRPOConfig"]


class GRPOConfig(BaseModel):
    """All options of :class:`agentbolt.algorithm.GRPO` and of the torch policy trainer.

    Counting conventions: a *training step* is one batch of tasks, each rolled out ``group_size`` times, followed by
    one policy update; an *optimizer step* is one ``optimizer.step()`` call (one per minibatch per PPO epoch).
    Every training step takes exactly :attr:`optimizer_steps_per_step` optimizer steps (a minibatch with nothing to
    train, or a step without any signal, still advances the learning-rate schedule by its share), so learning-rate
    warmup and decay, counted in optimizer steps, follow the training steps.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- model ---------------------------------------------------------------------------------------------------
    model: Optional[str] = Field(
        default=None,
        description="Model to train when GRPO loads it itself: a local Hugging Face directory or hub id "
        "(ignored when a model object is passed to GRPO).",
    )
    served_model_name: Optional[str] = Field(
        default=None, description="Model name published in the ``main_llm`` resource (defaults to ``model``)."
    )
    finetune: Literal["lora", "full"] = Field(default="lora", description="Train LoRA adapters or all weights.")
    lora_r: int = Field(default=8, ge=1, description="LoRA rank.")
    lora_alpha: float = Field(default=16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    lora_dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="LoRA dropout. Keep 0: any dropout makes the training forward differ from the sampling "
        "forward, so the importance ratio is no longer 1 at identical weights.",
    )
    lora_target_modules: Union[List[str], Literal["all-linear"]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that receive LoRA adapters, or 'all-linear'.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Dtype of the model weights; log-probabilities are always computed in float32."
    )
    threads: Optional[int] = Field(default=None, ge=1, description="torch intra-op threads (None keeps torch's).")
    device: Optional[str] = Field(
        default=None,
        description="Device of the policy being trained and of its in-process engine: 'cpu', 'cuda', 'cuda:1', "
        "'mps'... None: CUDA when available, else the CPU.",
    )

    policy_server_url: Optional[str] = Field(
        default=None,
        description="Serve rollouts from this external vLLM (--enable-lora) or `agentbolt serve` server of the same "
        "base model (OpenAI base URL ending in /v1) instead of in process; each update is published as a new LoRA "
        "adapter. Needs finetune='lora'.",
    )
    policy_server_api_key: Optional[str] = Field(default=None, description="Bearer token of policy_server_url.")
    adapter_dir: Optional[str] = Field(
        default=None,
        description="Where adapters for policy_server_url are saved (default: checkpoint_dir/adapters, else a "
        "temporary directory); the server must be able to read it.",
    )

    # --- rollouts ------------------------------------------------------------------------------------------------
    batch_size: int = Field(default=8, ge=1, description="Tasks per training step.")
    group_size: int = Field(default=4, ge=2, description="Rollouts per task; advantages are relative to this group.")
    max_steps: int = Field(default=100, ge=0, description="Training steps to run (0: validate only).")
    rollout_timeout: Optional[float] = Field(
        default=None, gt=0, description="Seconds to wait for the rollouts of a step; late ones count as failed."
    )
    failed_rollout_reward: Optional[float] = Field(
        default=0.0,
        allow_inf_nan=False,
        description="Final reward of a rollout that failed, was cancelled, was late or emitted no reward: it counts "
        "in its group's statistics with this reward and the LLM calls it made are trained on with it (validation "
        "reward means count it too). None drops such rollouts and their calls, so groups are judged on the "
        "survivors only.",
    )
    serve_max_batch_size: int = Field(
        default=16, ge=1, description="Sequences the in-process engine decodes together while rolling out."
    )
    sampling_parameters: Dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 1.0},
        description="Sampling parameters published with the ``main_llm`` resource for training rollouts.",
    )
    val_sampling_parameters: Dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 0.0},
        description="Sampling parameters published for validation rollouts.",
    )
    agent_match: Optional[str] = Field(
        default=None,
        description="Regex over the triplet's agent name; only matching agents' LLM calls are trained "
        "(None: every call).",
    )
    credit: Literal["final", "per_call"] = Field(
        default="final",
        description="'final': every call of a rollout gets the rollout's final reward. 'per_call': a call gets the "
        "reward the agent emitted right after it, falling back to the final reward when it has none.",
    )
    max_sequence_length: Optional[int] = Field(
        default=None,
        ge=2,
        description="Samples with more prompt+response tokens are dropped and counted (never truncated, which "
        "would change the context the response was sampled in).",
    )

    # --- advantages ----------------------------------------------------------------------------------------------
    advantage_mode: Literal["std", "mean"] = Field(
        default="std", description="'std': (r - mean) / (std + eps) within the group; 'mean': r - mean (Dr. GRPO)."
    )
    advantage_eps: float = Field(default=1e-6, gt=0, description="Epsilon added to the group std.")

    # --- loss ----------------------------------------------------------------------------------------------------
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="Ratio clipped below at 1 - clip_low.")
    clip_high: float = Field(default=0.28, ge=0, description="Ratio clipped above at 1 + clip_high.")
    kl_coef: float = Field(
        default=0.0, ge=0, description="Weight of the per-token k3 KL to the frozen reference (0: no reference pass)."
    )

    # --- optimisation --------------------------------------------------------------------------------------------
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over the step's samples.")
    minibatch_size: Optional[int] = Field(
        default=None,
        ge=1,
        description="Rollouts per optimizer step (None: all of a step's rollouts in one). Each PPO epoch splits the "
        "step's trained rollouts, every rollout's calls kept together, into exactly "
        "ceil(batch_size * group_size / minibatch_size) minibatches of near-equal rollout counts.",
    )
    micro_batch_size: int = Field(
        default=4,
        ge=1,
        description="Samples per forward/backward (at most a minibatch); gradients accumulate over the "
        "micro-batches of a minibatch.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Keep only each transformer block's input during the training forward and recompute the "
        "block in the backward pass: activation memory drops from every block's to one block's (plus the inputs), "
        "for about one more forward of compute.",
    )
    pack_shared_prefixes: bool = Field(
        default=True,
        description="Pack the samples of a micro-batch as one prefix tree, so tokens they share (a group's prompt) "
        "are computed once; exact, and used when the model's attention reads 4-D masks (sdpa, eager) and its logits "
        "are its output projection. Micro-batches are formed from samples sorted by their tokens, so a group's samples "
        "share micro-batches. False: left-padded batches.",
    )
    learning_rate: float = Field(default=2e-5, gt=0, description="Peak AdamW learning rate.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    adam_eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: Optional[float] = Field(
        default=1.0, gt=0, description="Clip the global gradient norm to this value (None: no clipping)."
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        default="constant", description="Shape of the learning rate after warmup."
    )
    warmup_steps: int = Field(default=0, ge=0, description="Linear warmup length in optimizer steps.")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Final LR of linear/cosine decay / peak LR.")
    total_optimizer_steps: Optional[int] = Field(
        default=None,
        ge=1,
        description="Length of the linear/cosine decay in optimizer steps (None: the run's length, "
        "max_steps * ppo_epochs * ceil(batch_size * group_size / minibatch_size)).",
    )
    seed: int = Field(default=0, description="Seed of Python, torch and minibatch shuffling.")

    # --- validation, checkpoints, logging ------------------------------------------------------------------------
    val_before_train: bool = Field(default=True, description="Validate on val_dataset before the first step.")
    val_success_reward: float = Field(
        default=1.0, description="A validation rollout counts as correct when its final reward is at least this."
    )
    val_interval: int = Field(default=0, ge=0, description="Validate every N training steps (0: never mid-run).")
    checkpoint_dir: Optional[str] = Field(default=None, description="Directory of checkpoints (None: none saved).")
    checkpoint_interval: int = Field(
        default=0, ge=0, description="Save every N training steps (0: only after the last step)."
    )
    resume: bool = Field(
        default=True, description="Resume from the latest checkpoint in checkpoint_dir when there is one."
    )
    log_dir: Optional[str] = Field(
        default=None, description="Directory for metrics.jsonl and reward_curve.png (None: console only)."
    )
    console: bool = Field(default=True, description="Show a rich progress bar and per-step metrics.")
    tensorboard: bool = Field(default=False, description="Also log to TensorBoard under log_dir.")
    wandb_project: Optional[str] = Field(default=None, description="Also log to this Weights & Biases project.")

    @field_validator("lora_target_modules")
    @classmethod
    def _non_empty_targets(cls, value: Union[List[str], str]) -> Union[List[str], str]:
        if isinstance(value, list) and not value:
            raise ValueError("lora_target_modules must name at least one module (or be 'all-linear')")
        return value

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= beta < 1.0 for beta in value):
            raise ValueError(f"adam_betas must lie in [0, 1), got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.policy_server_url is not None and self.finetune != "lora":
            raise ValueError("policy_server_url publishes LoRA adapters: it needs finetune='lora'")
        if self.tensorboard and self.log_dir is None:
            raise ValueError("tensorboard=True needs a log_dir")
        return self

    @property
    def rollouts_per_step(self) -> int:
        """Rollouts per training step (``batch_size * group_size``)."""
        return self.batch_size * self.group_size

    @property
    def minibatches_per_epoch(self) -> int:
        """Minibatches each PPO epoch of a training step is split into (``minibatch_size`` counts rollouts)."""
        return math.ceil(self.rollouts_per_step / (self.minibatch_size or self.rollouts_per_step))

    @property
    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps (taken or skipped) of every training step: ``ppo_epochs * minibatches_per_epoch``."""
        return self.ppo_epochs * self.minibatches_per_epoch

    def schedule_steps(self) -> int:
        """Optimizer steps the LR decay spans: ``total_optimizer_steps``, else the run's ``max_steps`` steps."""
        if self.total_optimizer_steps is not None:
            return self.total_optimizer_steps
        return max(1, self.max_steps * self.optimizer_steps_per_step)
