"""The Unsloth backend: the model loaded in 4 bits with Unsloth's LoRA wrapper, on a CUDA device.

Unsloth patches transformers when it is imported and needs a CUDA GPU, so it is imported only here, only when the
backend is chosen (:func:`agentbolt.algorithm.sft.algorithm.resolve_backend`). The model it returns is a
``PeftModel`` over quantized weights: :class:`~agentbolt.algorithm.finetuning.trainer.ModelTrainer` keeps it where
Unsloth put it (no move, no cast) and trains its LoRA adapters with the same loss, optimizer, schedule and
checkpoints as the transformers backend. Saved adapters are PEFT adapters of the base model: a vLLM server of the
16-bit base model loads them (``policy_server_url``).
"""

from __future__ import annotations

import logging
from typing import Any, Tuple

from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.utils.imports import import_extra

__all__ = ["load_unsloth_model"]

logger = logging.getLogger(__name__)


def load_unsloth_model(config: SFTConfig) -> Tuple[Any, Any]:
    """Load ``config.model`` with Unsloth and add its LoRA adapters.

    Returns:
        ``(model, tokenizer)``: a PEFT model over the (4-bit when ``load_in_4bit``) base weights.

    Raises:
        ImportError: unsloth is not installed.
    """
    FastLanguageModel = import_extra(
        "unsloth", feature="backend='unsloth'", extra="unsloth", note="CUDA only"
    ).FastLanguageModel
    from agentbolt.models import DEFAULT_MODEL, resolve_model

    name = config.model or DEFAULT_MODEL
    path = resolve_model(name).path
    max_length = config.max_sequence_length or 2048
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(path), max_seq_length=max_length, dtype=None, load_in_4bit=config.load_in_4bit
    )
    targets = config.lora_target_modules
    model = FastLanguageModel.get_peft_model(
        model,
        r=config.lora_r,
        target_modules=targets if isinstance(targets, list) else "all-linear",
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        bias="none",
        use_gradient_checkpointing="unsloth" if config.gradient_checkpointing else False,
        random_state=config.seed,
        max_seq_length=max_length,
    )
    logger.info("Loaded %s with Unsloth (4-bit: %s), LoRA r=%d", name, config.load_in_4bit, config.lora_r)
    return model, tokenizer
