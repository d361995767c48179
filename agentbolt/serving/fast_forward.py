"""A lean CPU forward pass for Llama-architecture models (Llama, SmolLM, Qwen2 and their fine-tunes).

Decoding a small model on a CPU is bound by two costs: reading every weight once per step, and the fixed cost of
each of the few thousand small operators a transformers forward runs (each one a parallel region whose threads
must wake up and meet). This forward keeps the arithmetic of the transformers implementation and cuts both:

* the query/key/value projections of a layer are one matrix multiplication, and so are the gate/up projections;
* weights are reordered once into oneDNN's blocked layout (``mkldnn._reorder_linear_weight``) when torch has
  oneDNN, which makes the small-batch matrix products about twice as fast as ``F.linear`` on plain weights;
* RMSNorm is torch's ``F.rms_norm`` on a float32 copy (rounded like transformers), attention is one
  ``scaled_dot_product_attention`` call with grouped key/value heads, and the key/value states go into
  :class:`~agentbolt.serving.kv_cache.KVCache` in place;
* only the last position's logits are computed;
* decoding steps (one new token per row) run all layers in one call to the fused C++ kernels of
  :mod:`agentbolt.serving.decode_kernels` when they build on this machine (``kernels=False`` opts out).

The weights are copied into the fused layout, so the copy must follow the model: the engine rebuilds it whenever
its ``weight_version`` changes (in-place training updates, weight swaps, adapter changes). A model with PEFT LoRA
adapters on its projections gets one copy per adapter in use, with the adapter merged into the copy
(``W + scale * B @ A``; the model itself is never merged), and one of the bare base weights. Models this forward
does not cover (other architectures, other adapter types, GPUs) run through transformers.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

__all__ = ["FastForward"]

logger = logging.getLogger(__name__)

_ARCHITECTURES = {"llama", "qwen2"}
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class FastForward:
    """Inference-only forward of a Llama-architecture causal LM on the CPU (see the module docstring).

    Build it with :meth:`create`, which returns ``None`` (and logs why) for models it does not cover.

    Args:
        model: A transformers causal LM, or a PEFT model around one.
        adapter: For a PEFT model: the LoRA adapter merged into the fused weights (``None``: the base weights).
        kernels: Run decoding steps through the fused C++ kernels when they are available (see
            :func:`~agentbolt.serving.decode_kernels.load_decode_kernels`); ``False`` keeps every step in Python.
    """

    def __init__(self, model: Any, adapter: Optional[str] = None, kernels: bool = True) -> None:
        if getattr(model, "peft_config", None):
            model = model.get_base_model()
        config = model.config
        self.model = model
        self.adapter = adapter
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.intermediate = int(config.intermediate_size)
        self.eps = float(config.rms_norm_eps)
        self._linear: Callable[..., torch.Tensor] = _plain_linear
        self._prepare: Callable[[torch.Tensor], torch.Tensor] = _identity
        self._layers: List[Dict[str, Any]] = []
        self._head: Any = None
        self._fused: Dict[int, Tuple[Tuple[Any, ...], torch.Tensor]] = {}  # id(first linear) -> (sources, fused)
        self._kernels: Any = _decode_kernels_for(self.head_dim) if kernels else None
        self._kernel_layers: List[Tuple[Any, ...]] = []
        self.refresh()
        logger.info(
            "Lean CPU forward for %s%s, decoding steps %s",
            type(model).__name__,
            f" with adapter {adapter!r}" if adapter else "",
            "through the fused C++ kernels" if self._kernels is not None else "in Python",
        )

    @property
    def uses_kernels(self) -> bool:
        """Whether decoding steps run through the fused C++ kernels."""
        return self._kernels is not None

    @classmethod
    def create(cls, model: Any, adapter: Optional[str] = None, kernels: bool = True) -> Optional[FastForward]:
        """Return a fast forward for ``model`` (with ``adapter`` merged), or ``None`` when it is not covered."""
        reason = cls.unsupported_reason(model)
        if reason is not None:
            logger.info("Generic transformers forward in use: %s", reason)
            return None
        return cls(model, adapter, kernels)

    @staticmethod
    def unsupported_reason(model: Any) -> Optional[str]:
        """Why ``model`` cannot use this forward (``None`` when it can)."""
        import torch

        if getattr(model, "peft_config", None):
            reason = _unsupported_adapters(model)
            if reason is not None:
                return reason
            model = model.get_base_model()
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in _ARCHITECTURES:
            return f"architecture {model_type!r} is not one of {sorted(_ARCHITECTURES)}"
        activation = getattr(config, "hidden_act", "silu")
        if activation != "silu":
            return f"activation {activation!r} is not silu"
        if getattr(config, "use_sliding_window", False):
            return "sliding-window attention"
        parameter = next(model.parameters())
        if parameter.device.type != "cpu":
            return f"device {parameter.device} (the fast forward is for CPUs)"
        if parameter.dtype not in (torch.bfloat16, torch.float32):
            return f"dtype {parameter.dtype}"
        inner = getattr(model, "model", None)
        if inner is None or not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
            return "unexpected module layout"
        return None

    def refresh(self) -> None:
        """Bring the fused (and reordered) weights up to date with the model's parameters.

        A fused weight is rebuilt only when one of its source tensors changed (another tensor, or an in-place
        update bumped its version): after a LoRA training step only the adapted projections of the adapter's copy
        are rebuilt, and the base copy not at all.
        """
        import torch

        self._linear, self._prepare = _linear_kernels(next(self.model.parameters()).dtype)
        layers: List[Dict[str, Any]] = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                attention, mlp = layer.self_attn, layer.mlp
                qkv = (attention.q_proj, attention.k_proj, attention.v_proj)
                layers.append(
                    {
                        "qkv": self._fuse(qkv),
                        "qkv_bias": _fused_bias(qkv),
                        "o": self._fuse((attention.o_proj,)),
                        "o_bias": _fused_bias((attention.o_proj,)),
                        "gate_up": self._fuse((mlp.gate_proj, mlp.up_proj)),
                        "gate_up_bias": _fused_bias((mlp.gate_proj, mlp.up_proj)),
                        "down": self._fuse((mlp.down_proj,)),
                        "down_bias": _fused_bias((mlp.down_proj,)),
                        "norm_attention": layer.input_layernorm.weight.detach(),
                        "norm_mlp": layer.post_attention_layernorm.weight.detach(),
                    }
                )
            self._head = self._fuse((self.model.lm_head,))
        self._layers = layers
        names = ("norm_attention", "qkv", "qkv_bias", "o", "o_bias", "norm_mlp", "gate_up", "gate_up_bias", "down")
        self._kernel_layers = [(*(layer[name] for name in names), layer["down_bias"]) for layer in layers]

    def _fuse(self, linears: Any) -> torch.Tensor:
        import torch

        sources = tuple(
            (id(tensor), tensor.data_ptr(), tensor._version)
            for linear in linears
            for tensor in self._source_tensors(linear)
        )
        known = self._fused.get(id(linears[0]))
        if known is not None and known[0] == sources:
            return known[1]
        weights = [self._effective_weight(linear) for linear in linears]
        weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        fused = self._prepare(weight.contiguous())
        self._fused[id(linears[0])] = (sources, fused)
        return fused

    def _source_tensors(self, linear: Any) -> List[torch.Tensor]:
        """The parameters :meth:`_effective_weight` reads for ``linear``."""
        base = getattr(linear, "base_layer", None)
        if base is None:
            return [linear.weight]
        if self.adapter is not None and self.adapter in linear.lora_A:
            return [base.weight, linear.lora_A[self.adapter].weight, linear.lora_B[self.adapter].weight]
        return [base.weight]

    def _effective_weight(self, linear: Any) -> torch.Tensor:
        """The weight ``linear`` applies: its own, or for a LoRA layer the base weight plus the adapter's delta."""
        base = getattr(linear, "base_layer", None)
        if base is None:
            return linear.weight.detach()
        if self.adapter is not None and self.adapter in linear.lora_A:
            return (base.weight + linear.get_delta_weight(self.adapter).to(base.weight.dtype)).detach()
        return base.weight.detach()

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Run the model on ``input_ids`` ``[batch, new]``; return the last position's logits ``[batch, vocab]``.

        Args:
            input_ids: New tokens of every row (left padded).
            positions: Their position ids ``[batch, new]``.
            mask: Attention mask ``[batch, cache.length + new]`` (1 = real token) over cached and new tokens.
            cache: The rows' :class:`~agentbolt.serving.kv_cache.KVCache`, appended to in place.
        """
        import torch
        import torch.nn.functional as F

        batch, new = input_ids.shape
        if new == 1 and self._kernels is not None:
            return self._decode_with_kernels(input_ids, positions, mask, cache)
        inner = self.model.model
        hidden = inner.embed_tokens(input_ids)
        cos, sin = inner.rotary_emb(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        past = cache.length
        total = past + new
        # Key j is visible to new token t when it is a real token and not in the future; every query also sees
        # itself so that padding queries never have an empty softmax (their outputs are masked everywhere else).
        visible = torch.ones(new, total, dtype=torch.bool, device=input_ids.device).tril(past)
        visible = mask[:, None, None, :total].bool() & visible
        visible[:, :, torch.arange(new), torch.arange(past, total)] = True
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        linear = self._linear
        for index, layer in enumerate(self._layers):
            normed = _rms_norm(hidden, layer["norm_attention"], self.eps)
            query, key, value = linear(normed, layer["qkv"], layer["qkv_bias"]).split(sizes, dim=-1)
            query = _rotate(query.view(batch, new, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            key = _rotate(key.view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            value = value.view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.append(index, key, value)
            attended = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=visible, enable_gqa=self.kv_heads != self.heads
            )
            attended = attended.transpose(1, 2).reshape(batch, new, self.heads * self.head_dim)
            hidden = hidden + linear(attended, layer["o"], layer["o_bias"])
            normed = _rms_norm(hidden, layer["norm_mlp"], self.eps)
            gate, up = linear(normed, layer["gate_up"], layer["gate_up_bias"]).split(self.intermediate, dim=-1)
            hidden = hidden + linear(F.silu(gate) * up, layer["down"], layer["down_bias"])
        last = _rms_norm(hidden[:, -1], inner.norm.weight, self.eps)
        return linear(last, self._head, None)

    def _decode_with_kernels(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """One decoding step (one new token per row) through the fused C++ kernels."""
        import torch

        inner = self.model.model
        hidden = inner.embed_tokens(input_ids[:, 0])
        cos, sin = inner.rotary_emb(hidden, positions)
        like = hidden.new_empty(hidden.shape[0], self.kv_heads, 1, self.head_dim)
        keys, values = [], []
        column = 0
        for index in range(len(self._layers)):
            buffer_k, buffer_v, column = cache.reserve(index, like, 1)
            keys.append(buffer_k)
            values.append(buffer_v)
        return self._kernels.decode_step(
            hidden,
            cos[:, 0].contiguous(),
            sin[:, 0].contiguous(),
            mask.to(torch.long).contiguous(),
            column,
            self._kernel_layers,
            keys,
            values,
            inner.norm.weight.detach(),
            self._head,
            self.heads,
            self.kv_heads,
            self.intermediate,
            self.eps,
            self._linear is _packed_linear,
        )


def _decode_kernels_for(head_dim: int) -> Any:
    """The decoding kernels when they are available and cover ``head_dim``, else ``None``."""
    from agentbolt.serving.decode_kernels import load_decode_kernels

    kernels = load_decode_kernels()
    if kernels is not None and head_dim % kernels.vector_width():
        logger.info("Decoding kernels need head_dim a multiple of %d (got %d)", kernels.vector_width(), head_dim)
        return None
    return kernels


def _unsupported_adapters(model: Any) -> Optional[str]:
    """Why the PEFT adapters of ``model`` cannot be merged into fused weights (``None`` when they can)."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if not isinstance(module, LoraLinear) or name.rsplit(".", 1)[-1] not in _PROJECTIONS:
            return f"adapter layer {name} ({type(module).__name__}) is not a LoRA projection"
        if module.merged:
            return f"adapter layer {name} is merged into the base weights"
        if any(module.use_dora.values()) or any(getattr(module, "lora_bias", {}).values()):
            return f"adapter layer {name} uses DoRA or a LoRA bias"
    return None


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm rounded like the transformers Llama implementation: normalize in float32, cast, then scale.

    ``F.rms_norm`` on bfloat16 inputs rounds differently (it moved the embedded model's first-token log-prob by 0.2
    and changed greedy answers), so the normalization runs on a float32 copy.
    """
    import torch.nn.functional as F

    return weight * F.rms_norm(hidden.float(), (hidden.shape[-1],), None, eps).to(hidden.dtype)


def _rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary position embeddings (the rotate-half convention of Llama)."""
    import torch

    half = states.shape[-1] // 2
    rotated = torch.cat((-states[..., half:], states[..., :half]), dim=-1)
    return states * cos + rotated * sin


def _fused_bias(linears: Any) -> Optional[torch.Tensor]:
    import torch

    biases = [linear.bias for linear in linears]
    if all(bias is None for bias in biases):
        return None
    return torch.cat(
        [
            bias.detach() if bias is not None else linear.weight.new_zeros(linear.out_features)
            for bias, linear in zip(biases, linears, strict=True)
        ]
    )


def _identity(weight: torch.Tensor) -> torch.Tensor:
    return weight


def _plain_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    import torch.nn.functional as F

    return F.linear(inputs, weight, bias)


def _packed_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    import torch

    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.ops.mkldnn._reorder_linear_weight(weight, 8)


@functools.cache
def _linear_kernels(dtype: torch.dtype) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """oneDNN's reordered-weight matmul when torch has it (checked once on a tiny product), else ``F.linear``."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return _plain_linear, _identity
    try:
        weight = torch.ones(4, 8, dtype=dtype)
        result = _packed_linear(torch.ones(2, 8, dtype=dtype), _pack(weight), None)
        if not torch.allclose(result.float(), torch.full((2, 4), 8.0)):
            raise RuntimeError(f"unexpected result {result}")
    except Exception as exc:  # an op missing from this build, or an unsupported dtype
        logger.info("oneDNN reordered weights unavailable (%s); using F.linear", exc)
        return _plain_linear, _identity
    return _packed_linear, _pack
