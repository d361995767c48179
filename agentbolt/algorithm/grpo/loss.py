"""Token-level clipped GRPO objective, k3 KL and entropy.

Notation for one response token ``t`` of sample ``i`` with advantage ``A_i``:

* ``logp_t = log_softmax(logits_t / T_i)[token_t]`` with ``T_i`` the temperature sample ``i`` was drawn at (the
  distribution the sampler drew from; entropy and the reference's log-probs use the same temperature);
* ``ratio_t = exp(logp_t - old_logp_t)`` where ``old_logp`` is ``logp`` under the weights that sampled the response,
  computed by the trainer (the same forward, precision and temperature as ``logp``);
* ``pg_t = -min(ratio_t * A_i, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_i)``;
* ``kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1`` (the k3 estimator: non-negative, unbiased for KL(pi||ref);
  as a loss its expected gradient is that of KL(ref||pi), the usual choice in GRPO);
* ``loss_t = pg_t + kl_coef * kl_t``.

Aggregation is the **token mean over the minibatch**: ``loss = sum_t loss_t / N`` where ``N`` is the number of
response tokens in the whole minibatch. Each micro-batch divides its token sum by the same ``N``, so gradients
accumulated over micro-batches equal those of the minibatch processed at once, and every token weighs the same
whatever the length of its response.

All inputs are ``[batch, positions]`` tensors aligned with the response mask; log-probs are float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = [
    "LossParts",
    "entropy_from_logits",
    "k3_kl",
    "logprobs_and_entropy",
    "masked_mean",
    "policy_loss",
    "token_logprobs",
]


def _tempered(logits: torch.Tensor, temperature: Optional[torch.Tensor]) -> torch.Tensor:
    """``logits / temperature`` in float32; ``temperature`` is one value per leading row, broadcast over the rest."""
    logits = logits.float()
    if temperature is None:
        return logits
    shape = temperature.shape + (1,) * (logits.dim() - temperature.dim())
    return logits / temperature.to(device=logits.device, dtype=torch.float32).view(shape)


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[target]`` in float32, without materialising the full log-softmax.

    Args:
        logits: ``[..., vocab]``.
        targets: ``[...]`` token ids.
        temperature: None (untempered), or one temperature per row of ``logits`` (shape ``[B]`` for ``[B, R,
            vocab]`` logits).
    """
    logits = _tempered(logits, temperature)
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` (differentiable) and the entropy (detached) of the same tempered distribution, from
    one pass of ``exp`` over the vocabulary.

    The training forward needs both; sharing the exponentials makes the entropy metric almost free.
    """
    logits = _tempered(logits, temperature)
    shift = logits.detach().amax(dim=-1, keepdim=True)
    exp = torch.exp(logits - shift)
    total = exp.sum(dim=-1)
    log_z = shift.squeeze(-1) + torch.log(total)
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = log_z - (exp * logits).sum(dim=-1) / total
    return picked - log_z, entropy.detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` along the last axis, in float32."""
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return log_z - (probs * logits).sum(dim=-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): ``exp(ref - logp) - (ref - logp) - 1``."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is true (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass
class LossParts:
    """Loss of one micro-batch plus token *sums* of its diagnostics (divide by token counts to report means)."""

    loss: torch.Tensor
    """Differentiable loss: this micro-batch's token sum divided by the minibatch token count."""
    pg_sum: float
    kl_sum: float
    ratio_sum: float
    clipped_tokens: float
    tokens: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    normalizer: float,
    ref_logp: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    token_weights: Optional[torch.Tensor] = None,
) -> LossParts:
    """Clipped policy-gradient loss (plus optional k3 KL) of one micro-batch.

    Args:
        logp: Current log-probs of the response tokens ``[B, T]`` (with grad).
        old_logp: Behaviour log-probs ``[B, T]``.
        advantages: One advantage per sample ``[B]``.
        mask: Response-token mask ``[B, T]``.
        clip_low: Lower clip range (ratio floor ``1 - clip_low``).
        clip_high: Upper clip range (ratio ceiling ``1 + clip_high``).
        normalizer: The whole minibatch's weight: its response tokens (token-mean aggregation), or the sum of its
            samples' weights (see :func:`agentbolt.algorithm.grpo.trainer.sample_weights`).
        ref_logp: Reference log-probs ``[B, T]``; required when ``kl_coef > 0``.
        kl_coef: Weight of the k3 KL term.
        token_weights: Weight of each sample's tokens ``[B]`` (None: 1, token-mean aggregation).
    """
    if normalizer <= 0:
        raise ValueError("normalizer must be the (positive) total weight of the minibatch's response tokens")
    maskf = mask.to(logp.dtype)
    keep = mask.bool()
    # Masked columns (prompt, padding) hold arbitrary log-probs: the current model's for a prompt token, 0 as padding
    # of the recorded ones. exp() of their differences can overflow, and inf * 0 is NaN in the loss and the gradient,
    # so they are made equal to the current log-probs before anything is computed from them.
    current = logp.detach()
    old_logp = torch.where(keep, old_logp, current)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    per_token = pg
    kl_sum = 0.0
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when kl_coef > 0")
        kl = k3_kl(logp, torch.where(keep, ref_logp, current))
        per_token = per_token + kl_coef * kl
        kl_sum = float((kl.detach() * maskf).sum())
    weighted = maskf if token_weights is None else maskf * token_weights.to(logp.dtype).unsqueeze(-1)
    loss = (per_token * weighted).sum() / normalizer
    with torch.no_grad():
        was_clipped = (clipped < unclipped) & keep
        return LossParts(
            loss=loss,
            pg_sum=float((pg * maskf).sum()),
            kl_sum=kl_sum,
            ratio_sum=float((ratio * maskf).sum()),
            clipped_tokens=float(was_clipped.sum()),
            tokens=float(maskf.sum()),
        )
