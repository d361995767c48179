"""Options shared by the algorithms that train the weights of the served model (GRPO, SFT).

:class:`FinetuningConfig` holds what every such algorithm needs: the model and how it is trained (LoRA or all
weights, dtype, device), how it is served while it trains (in process, or a remote vLLM-compatible server loading
each new adapter), the optimizer and its learning-rate schedule, rollouts, validation, checkpoints and logging.
Each algorithm's config adds its own options and says how long its learning-rate decay is
(:meth:`FinetuningConfig.schedule_steps`).
"""

from __future__ import annotations

import os
import re
import types
from typing import Any, Dict, List, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agentbolt.adapter.agent_match import compile_agent_match
from agentbolt.store.outage import DEFAULT_STORE_OUTAGE_TIMEOUT

__all__ = ["FinetuningConfig"]


class FinetuningConfig(BaseModel):
    """Model, serving, optimizer, schedule, rollout, validation, checkpoint and logging options.

    A *training step* is one round of rollouts followed by one update of the weights (GRPO: one policy update;
    SFT: collect, select, train, publish). An *optimizer step* is one ``optimizer.step()`` call; the learning-rate
    schedule counts optimizer steps.
    """

    # No float option means anything as an infinity or NaN (a learning rate of inf fills the weights with NaN).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # --- model ---------------------------------------------------------------------------------------------------
    model: Optional[str] = Field(
        default=None,
        description="Model to train when the algorithm loads it itself: a local Hugging Face directory or hub id "
        "(ignored when a model object is passed to the algorithm).",
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
        description="LoRA dropout. With 0 the training forward is the served model's forward; GRPO needs that "
        "(any dropout makes the importance ratio differ from 1 at identical weights).",
    )
    lora_target_modules: Union[List[str], Literal["all-linear"]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that receive LoRA adapters, or 'all-linear'.",
    )
    init_adapter: Optional[str] = Field(
        default=None,
        description="Start from this PEFT LoRA adapter directory (an SFT warm start, a checkpoint's adapter/) instead "
        "of fresh adapters; its rank and alpha must equal lora_r and lora_alpha. The KL reference stays the base "
        "model. Needs finetune='lora'.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Dtype of the model weights; log-probabilities are always computed in float32."
    )
    threads: Optional[int] = Field(default=None, ge=1, description="torch intra-op threads (None keeps torch's).")
    update_threads: Optional[int] = Field(
        default=None,
        ge=1,
        description="torch intra-op threads of the weight updates (None: as threads). Rollouts and updates take turns, "
        "so an update may use the cores that the engines leave idle meanwhile; the engines keep `threads`.",
    )
    device: Optional[str] = Field(
        default=None,
        description="Device of the model being trained and of its in-process engine: 'cpu', 'cuda', 'cuda:1', "
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
    max_steps: int = Field(default=100, ge=0, description="Training steps to run (0: validate only).")
    rollout_timeout: Optional[float] = Field(
        default=None, gt=0, description="Seconds to wait for the rollouts of a step; late ones count as failed."
    )
    store_outage_timeout: Optional[float] = Field(
        default=DEFAULT_STORE_OUTAGE_TIMEOUT,
        ge=0,
        allow_inf_nan=False,
        description="Seconds each store call of the run (enqueueing, waiting for and reading rollouts, publishing "
        "resources) keeps retrying while the store server is unreachable (a restart) before the run fails; the "
        "runners' default. None or 0: the client's own short retry policy.",
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
        description="Regex searched in the agent name of each LLM call (re.search: anchor it, '^planner$', to match "
        "one name exactly); only matching agents' calls are trained (None: every call).",
    )

    # --- optimisation --------------------------------------------------------------------------------------------
    micro_batch_size: int = Field(
        default=4,
        ge=1,
        description="Samples per forward/backward; gradients accumulate over the micro-batches of an optimizer step.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Keep only each transformer block's input during the training forward and recompute the "
        "block in the backward pass: activation memory drops from every block's to one block's (plus the inputs), "
        "for about one more forward of compute.",
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
        description="Length of the linear/cosine decay in optimizer steps (None: the run's length, as each "
        "algorithm counts it).",
    )
    seed: int = Field(
        default=0,
        ge=-(2**63),
        le=2**64 - 1,
        description="Seed of Python, torch and of the data order (torch accepts -2**63 to 2**64 - 1).",
    )

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
        default=True,
        description="Resume from the latest checkpoint in checkpoint_dir when there is one: the same run, with its "
        "run id and log (a checkpoint of another base model, LoRA settings or seed is refused).",
    )
    log_dir: Optional[str] = Field(
        default=None,
        description="Directory for metrics.jsonl and reward_curve.png (None: console only). It holds one run: a new "
        "run refuses one whose metrics.jsonl holds records; a resumed run continues it.",
    )
    console: bool = Field(default=True, description="Show a rich progress bar and per-step metrics.")
    tensorboard: bool = Field(default=False, description="Also log to TensorBoard under log_dir.")
    wandb_project: Optional[str] = Field(default=None, description="Also log to this Weights & Biases project.")

    @field_validator("model", "init_adapter", "adapter_dir", "checkpoint_dir", "log_dir", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        """A model or directory given as a path object (``pathlib.Path``) is kept as its text."""
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean is not a count or an amount: ``max_steps: yes`` in a YAML file is a mistake, not one step."""
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
            if bool not in members and any(t in (int, float) for t in members):
                kind = "an integer" if int in members else "a number"
                raise ValueError(f"Input should be {kind}, not a boolean")
        return value

    @field_validator("policy_server_url")
    @classmethod
    def _http_url(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(r"https?://[^/\s]+", value):
            raise ValueError(f"policy_server_url must be an http:// or https:// URL (ending in /v1), got {value!r}")
        return value

    @field_validator("sampling_parameters")
    @classmethod
    def _one_choice_per_call(cls, value: Dict[str, Any]) -> Dict[str, Any]:
        """Training rollouts ask for one choice per call: a call's recorded span holds its first choice only."""
        choices = value.get("n")
        if choices is not None and (isinstance(choices, bool) or choices != 1):
            raise ValueError(
                f"sampling_parameters['n']={choices!r} asks for several choices per call, but a call's recorded span "
                "holds the token ids of its first choice only and the rollout's reward is for the answer its agent "
                "used: the other choices would be sampled and never trained on. Remove it (or set n=1) and ask for "
                "more rollouts per task (GRPO's group_size, SFT's rollouts_per_task); val_sampling_parameters may "
                "set it."
            )
        return value

    @field_validator("lora_target_modules")
    @classmethod
    def _non_empty_targets(cls, value: Union[List[str], str]) -> Union[List[str], str]:
        if isinstance(value, list) and not value:
            raise ValueError("lora_target_modules must name at least one module (or be 'all-linear')")
        return value

    @field_validator("agent_match")
    @classmethod
    def _compiles(cls, value: Optional[str]) -> Optional[str]:
        compile_agent_match(value)
        return value

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            import torch

            try:
                torch.device(value)
            except RuntimeError as exc:
                raise ValueError(
                    f"device must be a torch device name such as 'cpu', 'cuda', 'cuda:1' or 'mps'; got {value!r} "
                    f"({exc})"
                ) from None
        return value

    @field_validator("adam_betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= beta < 1.0 for beta in value):
            raise ValueError(f"adam_betas must lie in [0, 1), got {value}")
        return value

    @model_validator(mode="after")
    def _consistent_serving(self) -> FinetuningConfig:
        if self.policy_server_url is not None and self.finetune != "lora":
            raise ValueError("policy_server_url publishes LoRA adapters: it needs finetune='lora'")
        if self.init_adapter is not None and self.finetune != "lora":
            raise ValueError("init_adapter starts from LoRA adapters: it needs finetune='lora'")
        if self.tensorboard and self.log_dir is None:
            raise ValueError("tensorboard=True needs a log_dir")
        return self

    def schedule_steps(self) -> int:
        """Optimizer steps the learning-rate decay spans: ``total_optimizer_steps``, else the run's length.

        Each algorithm says how long its run is; this base only knows ``total_optimizer_steps`` (else 1).
        """
        return self.total_optimizer_steps or 1
