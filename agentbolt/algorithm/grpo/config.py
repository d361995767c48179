"""Configuration of the GRPO algorithm.

Every option is validated when the config is built, so a bad value fails before any model is loaded. The reference
page ``docs/grpo.md`` explains each option together with the maths it controls.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Dict, FrozenSet, Literal, Optional

from pydantic import Field, field_validator, model_validator

from agentbolt.algorithm.finetuning.config import FinetuningConfig
from agentbolt.openai_api.sampling import DISTRIBUTION_CHANGING, is_number
from agentbolt.openai_api.schema import ChatCompletionRequest, CompletionRequest

__all__ = ["GRPOConfig", "SAMPLING_PARAMETER_NAMES"]


# vLLM's sampling extensions of the OpenAI request (agentbolt serve implements some and refuses the others by name).
_ENGINE_EXTENSIONS = frozenset(
    {
        "add_generation_prompt",
        "add_special_tokens",
        "continue_final_message",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "include_stop_str_in_output",
        "length_penalty",
        "priority",
        "prompt_logprobs",
        "return_tokens_as_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
    }
)

SAMPLING_PARAMETER_NAMES: FrozenSet[str] = frozenset(
    (set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)) - {"model", "messages", "prompt"}
).union(_ENGINE_EXTENSIONS, DISTRIBUTION_CHANGING)
"""The keys ``sampling_parameters`` and ``val_sampling_parameters`` may hold: the fields of the OpenAI chat and text
completion requests (:mod:`agentbolt.openai_api.schema`) other than the model, messages and prompt, and vLLM's
sampling extensions. The gateway adds them to each request of a rollout that does not set them itself."""


def _check_names(value: Dict[str, Any], option: str) -> None:
    """Refuse a key of the sampling parameters ``value`` of ``option`` that no serving engine knows.

    Raises:
        ValueError: The first unknown key, with the closest known name (or every known name when none is close).
    """
    for name in value:
        if name in SAMPLING_PARAMETER_NAMES:
            continue
        close = difflib.get_close_matches(name, SAMPLING_PARAMETER_NAMES, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(SAMPLING_PARAMETER_NAMES))}"
        raise ValueError(
            f"{option} has an unknown key {name!r} ({hint}): the serving engines would ignore or refuse it. Use the "
            "names of the OpenAI completion request or of vLLM's sampling extensions."
        )


def _checked_temperature(value: Dict[str, Any], option: str) -> Optional[float]:
    """The ``temperature`` of the sampling parameters ``value`` of ``option``: None or a finite number >= 0.

    Raises:
        ValueError: Any other value (a string, a boolean, a negative number, NaN), which no engine takes.
    """
    temperature = value.get("temperature")
    if temperature is not None and (not is_number(temperature) or not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"{option}['temperature'] must be a number >= 0, got {temperature!r}")
    return temperature


class GRPOConfig(FinetuningConfig):
    """All options of :class:`agentbolt.algorithm.GRPO` and of the torch policy trainer.

    The model, serving, optimizer, schedule, validation, checkpoint and logging options are those of
    :class:`~agentbolt.algorithm.finetuning.config.FinetuningConfig`; the rest are GRPO's own.

    Counting conventions: a *training step* is one batch of tasks, each rolled out ``group_size`` times, followed by
    one policy update; an *optimizer step* is one ``optimizer.step()`` call (one per minibatch per PPO epoch).
    Every training step takes exactly :attr:`optimizer_steps_per_step` optimizer steps (a minibatch with nothing to
    train, or a step without any signal, still advances the learning-rate schedule by its share), so learning-rate
    warmup and decay, counted in optimizer steps, follow the training steps.
    """

    # --- rollouts ------------------------------------------------------------------------------------------------
    group_size: int = Field(default=4, ge=2, description="Rollouts per task; advantages are relative to this group.")
    failed_rollout_reward: Optional[float] = Field(
        default=0.0,
        allow_inf_nan=False,
        description="Final reward of a rollout that failed, was cancelled, was late or emitted no reward: it counts "
        "in its group's statistics with this reward and the LLM calls it made are trained on with it (validation "
        "reward means count it too). None drops such rollouts and their calls, so groups are judged on the "
        "survivors only.",
    )
    resample_rounds: int = Field(
        default=0,
        ge=0,
        description="Dynamic sampling: while fewer than batch_size of a step's groups carry a learning signal (the "
        "rewards their samples train on, final or per call by credit, are all equal in the others), run up to this "
        "many more rounds, each with as many fresh training tasks as signal-carrying groups are missing (each "
        "rolled out group_size times); the update trains on every group "
        "with a signal. The extra tasks come from the same sampler (they count towards its epoch) and the step's "
        "minibatches grow instead of multiplying, so the learning-rate schedule is unchanged. 0: off.",
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
    loss_aggregation: Literal["token_mean", "rollout_mean"] = Field(
        default="token_mean",
        description="'token_mean': every response token of the minibatch weighs the same. 'rollout_mean' (Flow-GRPO's "
        "objective): every rollout weighs the same, split equally among its trained calls and each call's share "
        "among its tokens, so a group's advantages, which sum to zero over its rollouts, also sum to zero in the "
        "gradient whatever the rollouts' lengths. With several trained calls per rollout, 'token_mean' weighs a "
        "rollout by its token count: when failed rollouts take more turns, the tokens all rollouts share (the "
        "reply format, the most common action) are pushed down.",
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
    pack_shared_prefixes: bool = Field(
        default=True,
        description="Pack the samples of a micro-batch as one prefix tree, so tokens they share (a group's prompt) "
        "are computed once; exact, and used when the model's attention reads 4-D masks (sdpa, eager) and its logits "
        "are its output projection. Micro-batches are formed from samples sorted by their tokens, so a group's samples "
        "share micro-batches. False: left-padded batches.",
    )

    # --- data parallelism ---------------------------------------------------------------------------------------
    distributed_timeout: float = Field(
        default=1800.0,
        gt=0,
        description="Under torchrun (data-parallel updates, docs/scaling.md): seconds a rank waits for the others in "
        "an update's collective before failing. A rank that dies fails the others at once; one that stalls, after "
        "this.",
    )

    data_parallel: Literal["replicate", "fsdp"] = Field(
        default="replicate",
        description="Under torchrun, how the ranks hold the policy. 'replicate': every rank holds the whole model, its "
        "gradients and optimizer state, and gradients are summed over ranks. 'fsdp': the trained model's parameters, "
        "gradients and optimizer state are sharded over the ranks with PyTorch FSDP2 (fully_shard), each rank "
        "holding about 1/N of them; the leader keeps a full copy of the policy to serve and checkpoint. Alone "
        "(no torchrun), both train the same way.",
    )

    @field_validator("sampling_parameters")
    @classmethod
    def _samples_the_policy(cls, value: Dict[str, Any]) -> Dict[str, Any]:
        """Training rollouts must be sampled from the policy's own (tempered) distribution, one choice per call.

        Every key must be one the serving engines know (:data:`SAMPLING_PARAMETER_NAMES`). The trainer scores every
        sampled token under ``softmax(logits / T)`` itself (the old log-probs are its own, never the engine's), so a
        sampler that truncates or reshapes that distribution, or guided decoding that constrains it, would make the
        importance ratio and the policy gradient biased; a greedy sampler, or one seed shared by every call, gives
        every rollout of a task the same answer; and of ``n > 1`` choices only the first is recorded and trained on.
        ``val_sampling_parameters`` are only checked for known keys and a valid temperature: validation may decode
        greedily, seed, truncate or guide.
        """
        _check_names(value, "sampling_parameters")
        temperature = _checked_temperature(value, "sampling_parameters")
        if temperature is not None and temperature <= 0:
            raise ValueError(
                f"sampling_parameters['temperature']={temperature!r} samples training rollouts greedily: the rollouts "
                "of a task all give the same answer, every group's rewards are equal and GRPO has no advantage to "
                "train on. Use a temperature > 0 (1.0 samples the policy itself); val_sampling_parameters may stay "
                "greedy."
            )
        seed = value.get("seed")
        if seed is not None:
            raise ValueError(
                f"sampling_parameters['seed']={seed!r} seeds every training call alike: the rollouts of a task send "
                "the same prompt, so they all sample the same answer, every group's rewards are equal and GRPO has "
                "no advantage to train on. Remove it (an agent may seed each of its calls differently); "
                "val_sampling_parameters may set one."
            )
        for name, (unchanged, neutral) in DISTRIBUTION_CHANGING.items():
            setting = value.get(name)
            if setting is not None and not unchanged(setting):
                instead = f" (or set {name}={neutral})" if neutral is not None else ""
                raise ValueError(
                    f"sampling_parameters[{name!r}]={setting!r} makes training rollouts sample from another "
                    "distribution than the policy's softmax(logits / T), under which GRPO scores them (the trainer "
                    "computes the old log-probs itself): the importance ratio and the policy gradient would be "
                    f"biased towards what the sampler favours. Remove it{instead} for training (reward or parse a "
                    "format the task needs instead of guiding the decoding); val_sampling_parameters may use it."
                )
        return value

    @field_validator("val_sampling_parameters")
    @classmethod
    def _valid_temperature(cls, value: Dict[str, Any]) -> Dict[str, Any]:
        """Validation may decode greedily, truncate or guide, but its keys must be known and its temperature one an
        engine takes."""
        _check_names(value, "val_sampling_parameters")
        _checked_temperature(value, "val_sampling_parameters")
        return value

    @model_validator(mode="after")
    def _warmup_within_the_schedule(self) -> GRPOConfig:
        """The learning rate reaches ``learning_rate`` after ``warmup_steps`` optimizer steps: a warmup as long as
        the schedule (the run, or ``total_optimizer_steps``) never reaches it and never decays."""
        if self.max_steps > 0 and self.warmup_steps >= self.schedule_steps():
            span = (
                f"total_optimizer_steps={self.total_optimizer_steps}"
                if self.total_optimizer_steps is not None
                else f"the run's {self.schedule_steps()} optimizer steps (max_steps={self.max_steps} x "
                f"{self.optimizer_steps_per_step} per step)"
            )
            raise ValueError(
                f"warmup_steps={self.warmup_steps} is not shorter than {span}: the learning rate would never reach "
                "learning_rate. Use fewer warmup_steps (they count optimizer steps)."
            )
        return self

    @model_validator(mode="after")
    def _shardable(self) -> GRPOConfig:
        if (
            self.data_parallel == "fsdp"
            and self.device is not None
            and self.device.split(":")[0] not in ("cpu", "cuda")
        ):
            raise ValueError(
                f"data_parallel='fsdp' shards over CPU (gloo) or CUDA (NCCL) ranks, not device={self.device!r}: "
                "set device='cpu' or 'cuda', or data_parallel='replicate'"
            )
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
