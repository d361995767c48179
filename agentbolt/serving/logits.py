"""Float32 logits from a transformers causal LM whatever its dtype.

A bfloat16 model rounds its logits to bfloat16: 8 significant bits, so a logit near 20 moves by up to 1/16. That
rounding is one part of what separates two bfloat16 computations of the same log-probs (the inference engine's
incremental decoding and the trainer's full-sequence forward): removing it took the mean gap over sampled tokens of
the embedded model from about 0.024 to 0.020 nats. Both the engine and the GRPO trainer therefore run the transformer
body in the model's dtype and the output projection in float32, through :func:`float32_logits`, so a logit is
rounded only once, in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["body_hidden_states", "float32_head", "float32_logits", "float32_logits_at", "plain_output_head"]


def _language_model(model: Any) -> Any:
    """The transformers causal LM inside a PEFT wrapper (or ``model`` itself)."""
    return model.get_base_model() if getattr(model, "peft_config", None) else model


def plain_output_head(model: Any) -> bool:
    """Whether ``model``'s logits are exactly its output projection of the body's last hidden states.

    False for models that post-process logits (Gemma-2's soft-capping, Cohere's logit scale) or have no separate body.
    """
    model = _language_model(model)
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1, 1.0):
        return False
    body = getattr(model, "base_model", None)
    return body is not None and body is not model and model.get_output_embeddings() is not None


def float32_logits(model: Any, keep: int, **inputs: Any) -> torch.Tensor:
    """Float32 logits ``[batch, keep, vocab]`` of the last ``keep`` positions.

    The body runs in the model's dtype (PEFT adapters included, as they sit inside its modules); the output projection
    runs in float32 on the float32 value of the (possibly bfloat16) weight, so the result differs from an exact
    product only by float32 rounding. Models whose logits are more than the projection (:func:`plain_output_head`)
    go through their own forward, with the logits cast to float32.

    Args:
        model: A transformers causal LM or a PEFT model around one.
        keep: Positions to return, counted from the end.
        **inputs: Keyword arguments of the model's forward (``input_ids``, ``attention_mask``, ``position_ids``,
            ``past_key_values``, ``use_cache``...).
    """
    if not plain_output_head(model):
        return model(**inputs).logits[:, -keep:, :].float()
    return float32_head(model, body_hidden_states(model, **inputs)[:, -keep:, :])


def float32_logits_at(model: Any, positions: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """Float32 logits ``[N, vocab]`` of the ``N`` positions where the boolean ``positions`` ``[batch, length]`` is
    True, in row-major order: only those hidden states are projected (as :func:`float32_logits` does).

    Args:
        model: A transformers causal LM or a PEFT model around one.
        positions: Which positions to return.
        **inputs: Keyword arguments of the model's forward.
    """
    if not plain_output_head(model):
        return model(**inputs).logits[positions].float()
    return float32_head(model, body_hidden_states(model, **inputs)[positions])


def body_hidden_states(model: Any, **inputs: Any) -> torch.Tensor:
    """The last hidden states of ``model``'s body (everything before the output projection), in the model's dtype.

    Only for models with a :func:`plain_output_head`.
    """
    return _language_model(model).base_model(**inputs).last_hidden_state


def float32_head(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """``model``'s output projection of ``hidden`` (``[..., hidden_size]``) computed in float32.

    Only for models with a :func:`plain_output_head`.
    """
    import torch.nn.functional as F

    head = _language_model(model).get_output_embeddings()
    bias = None if getattr(head, "bias", None) is None else head.bias.float()
    return F.linear(hidden.float(), head.weight.float(), bias)
