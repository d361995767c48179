"""Configuration of the SFT algorithm (and of offline SFT from files).

Every option is validated when the config is built, so a bad value fails before any model is loaded. ``docs/sft.md``
explains each option with the data path it controls.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Literal, Optional

from pydantic import Field, field_validator, model_validator

from agentbolt.algorithm.finetuning.config import FinetuningConfig

__all__ = ["Packing", "SFTConfig"]

Packing = Literal["none", "rows", "prefix"]
"""Layouts of a micro-batch (:attr:`SFTConfig.packing`); all give the same loss and gradient."""


class SFTConfig(FinetuningConfig):
    """All options of :class:`agentbolt.algorithm.sft.SFT` and of its trainer.

    The model, serving, optimizer, schedule, validation, checkpoint and logging options are those of
    :class:`~agentbolt.algorithm.finetuning.config.FinetuningConfig`. A *training step* collects rollouts of
    ``batch_size`` tasks (``rollouts_per_task`` each), selects samples, trains ``epochs`` passes over them in optimizer
    steps of ``train_batch_size`` samples, and publishes the new weights.
    """

    learning_rate: float = Field(default=1e-4, gt=0, description="Peak AdamW learning rate (LoRA scale).")

    # --- collect -------------------------------------------------------------------------------------------------
    rollouts_per_task: int = Field(
        default=4, ge=1, description="Rollouts of each task per training step (best_of_n chooses among them)."
    )
    teacher_url: Optional[str] = Field(
        default=None,
        description="Distillation: OpenAI-compatible base URL (ending in /v1) of a teacher model that answers the "
        "training rollouts; the model being trained (the student) learns from its calls and answers validation.",
    )
    teacher_model: Optional[str] = Field(default=None, description="Model name to request from teacher_url.")
    teacher_api_key: Optional[str] = Field(
        default=None, description="Bearer token of teacher_url (or os.environ/NAME to read it from a variable)."
    )
    student_prompt: Optional[str] = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="Context distillation: 'module:function' that maps the prompt messages of a recorded call (one "
        "the agent made with a richer teacher prompt, e.g. more worked examples) to the prompt the trained model is "
        "asked with when deployed. Each call is learned from the prompt it returns, rendered from messages.",
    )
    data: Literal["auto", "tokens", "messages"] = Field(
        default="auto",
        description="What a call is trained on. 'tokens': the exact prompt/response token ids the gateway recorded "
        "(calls without them are skipped and counted). 'messages': the call's chat messages and tool calls, rendered "
        "with the trained model's chat template. 'auto': token ids when present and no teacher is set, else messages.",
    )
    reward_propagation: Literal["backward", "final", "none"] = Field(
        default="backward",
        description="Reward a call is ranked by. 'backward': the first reward emitted at or after the call (its own, "
        "else a later one: a trajectory's final reward reaches its earlier calls). 'final': the rollout's final "
        "reward for every call. 'none': only calls the agent rewarded directly.",
    )

    # --- select --------------------------------------------------------------------------------------------------
    min_reward: Optional[float] = Field(
        default=None, allow_inf_nan=False, description="Keep calls whose reward is at least this (None: no threshold)."
    )
    best_of_n: bool = Field(
        default=False,
        description="Keep, for each task, only the calls of its rollout with the highest final reward.",
    )
    top_k: Optional[int] = Field(default=None, ge=1, description="Keep the k highest-rewarded calls of the step.")
    top_fraction: Optional[float] = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Keep this share of the step's calls, highest rewards first (at least one); None keeps all. "
        "Setting top_k unsets the default share.",
    )
    dedup: bool = Field(default=True, description="Drop calls whose tokens and trained positions repeat another's.")

    # --- train ---------------------------------------------------------------------------------------------------
    max_sequence_length: Optional[int] = Field(
        default=None,
        ge=2,
        description="Longest sample in tokens (None: the model's context length); longer ones follow 'overlong'.",
    )
    overlong: Literal["skip", "truncate"] = Field(
        default="skip",
        description="'skip' drops samples longer than max_sequence_length; 'truncate' keeps their last "
        "max_sequence_length tokens (the start of the prompt is cut). Both are counted.",
    )
    epochs: int = Field(default=1, ge=1, description="Passes over the selected samples in each training step.")
    train_batch_size: int = Field(default=8, ge=1, description="Samples per optimizer step.")
    packing: Packing = Field(
        default="none",
        description="How each micro-batch's samples are laid out. 'none': one sample per row, right-padded to the "
        "longest. 'rows': concatenated into rows of up to max_sequence_length tokens, each attending only to itself. "
        "'prefix': one prefix tree, so tokens that samples share at their start (a system prompt, the earlier turns "
        "of a conversation) are computed once (needs sdpa or eager attention). true and false mean 'rows' and 'none'.",
    )
    backend: Literal["auto", "transformers", "unsloth"] = Field(
        default="auto",
        description="How the model is loaded and wrapped with LoRA: 'unsloth' (4-bit, CUDA only), 'transformers', "
        "or 'auto': unsloth when it is installed and CUDA is available, else transformers.",
    )
    load_in_4bit: bool = Field(default=True, description="Unsloth backend: load the base weights in 4 bits.")

    @field_validator("packing", mode="before")
    @classmethod
    def _packing_from_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # the earlier on/off option
            return "rows" if value else "none"
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SFTConfig:
        if self.top_k is not None and self.top_fraction is not None:
            if "top_fraction" in self.model_fields_set:
                raise ValueError(
                    "top_k and top_fraction both cut the ranked calls: set one of them (the other to None)"
                )
            self.top_fraction = None  # top_k replaces the default share
        if (self.teacher_url is None) != (self.teacher_model is None):
            raise ValueError("distillation needs both teacher_url and teacher_model")
        if self.teacher_url is not None and self.data == "tokens":
            raise ValueError("a teacher's token ids are not the student's: use data='messages' (or 'auto')")
        if self.student_prompt is not None and self.data == "tokens":
            raise ValueError(
                "student_prompt rewrites the recorded prompts, whose token ids no longer apply: use "
                "data='messages' (or 'auto')"
            )
        if self.teacher_model is not None and self.teacher_model == (self.served_model_name or self.model):
            raise ValueError("teacher_model must differ from the served name of the model being trained")
        if self.backend == "unsloth" and self.finetune != "lora":
            raise ValueError("the unsloth backend trains 4-bit LoRA adapters: it needs finetune='lora'")
        if self.backend == "unsloth" and self.packing == "prefix":
            raise ValueError("packing='prefix' needs an attention that reads a tree mask: use backend='transformers'")
        return self

    @property
    def uses_teacher(self) -> bool:
        """Whether training rollouts are answered by a teacher model."""
        return self.teacher_url is not None

    def trains_tokens(self) -> bool:
        """Whether recorded token ids are used when a call has them (``data`` 'tokens', or 'auto' without teacher)."""
        return self.data == "tokens" or (self.data == "auto" and not self.uses_teacher)

    def selection_options(self) -> Dict[str, Any]:
        """Keyword arguments of :func:`~agentbolt.algorithm.sft.selection.select_samples` from these options."""
        return self.model_dump(include={"min_reward", "best_of_n", "top_k", "top_fraction", "dedup"})

    def tokenize_options(self, max_length: int, vocab_size: Optional[int] = None) -> Dict[str, Any]:
        """Keyword arguments of :func:`~agentbolt.algorithm.sft.data.tokenize_sample` from these options, for a
        model of ``max_length`` tokens of context and ``vocab_size`` embedding rows (None: ids not checked)."""
        return {
            "use_token_ids": self.trains_tokens(),
            "require_token_ids": self.data == "tokens",
            "max_length": max_length,
            "overlong": self.overlong,
            "vocab_size": vocab_size,
        }

    def optimizer_steps_for(self, samples: int) -> int:
        """Optimizer steps of one training step over ``samples`` selected samples."""
        return self.epochs * math.ceil(samples / self.train_batch_size) if samples else 0
