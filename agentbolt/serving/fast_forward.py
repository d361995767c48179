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
* only the last position's logits are computed, in float32 (the output projection multiplies the float32 value of
  the weights, as :func:`~agentbolt.serving.logits.float32_logits` does for the trainer: bfloat16 logits are
  rounded by up to 1/16 at typical sizes, which alone made most of the gap between engine and trainer log-probs);
* decoding steps (one new token per row) run all layers in one call to the fused C++ kernels of
  :mod:`agentbolt.serving.decode_kernels` when they build on this machine (``kernels=False`` opts out).

The weights are copied into the fused layout, so the copy must follow the model: the engine rebuilds it whenever
its ``weight_version`` changes (in-place training updates, weight swaps, adapter changes). A model with PEFT LoRA
adapters on its projections gets one forward per adapter in use (and one of the bare base weights). LoRA is applied
unmerged, with PEFT's arithmetic: the base projection in the model's dtype, plus ``scale * B @ (A @ x)`` in the
adapter's dtype (float32 for adapters PEFT creates or loads), and one rounding of the sum. Merging ``W + scale * B @ A``
into bfloat16 weights would round away most of a young adapter's small delta and make the served log-probs drift
from the trainer's (about 0.1 nats per token on the embedded model after a few GRPO steps; see "Log-prob
consistency" in docs/benchmarks.md). The two low-rank products cost a few percent of a decoding step, and after a
LoRA update only the adapter's small factors are copied again. Models this forward does not cover (other
architectures, other adapter types, GPUs) run through transformers.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

    from agentbolt.serving.quantized import BlockWeights

__all__ = ["BlockModel", "FastForward", "bfloat16_is_native"]

logger = logging.getLogger(__name__)

_ARCHITECTURES = {"llama", "qwen2"}
LoraFactors = Tuple["torch.Tensor", "torch.Tensor"]
"""An adapter's ``(a, b)`` for one fused projection: ``a`` ``[rank, in]``, ``b`` ``[out, rank]`` with the scale in."""
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_BLOCK_MODEL_KEYS = (
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "rope_parameters",
)
"""What a model directory's ``config.json`` must state for :meth:`BlockModel.from_directory` to read it alone."""


@dataclass
class BlockModel:
    """What a forward on block weights needs of a model besides the weights: its config and generation config, read
    from the directory's JSON files.

    Serving a GGUF file's blocks needs no transformers model: its modules are never run. Even a transformers config
    imports most of the library (about 60 MB of the server's memory and seconds of start-up with transformers 5), so
    :meth:`from_directory` reads the files itself where they state every field the forward uses, and the engine
    falls back to transformers' own config and a ``meta``-device skeleton otherwise.
    """

    config: SimpleNamespace
    generation_config: SimpleNamespace

    @classmethod
    def from_directory(cls, path: Path) -> Optional[BlockModel]:
        """The model of ``path`` when its ``config.json`` states every field in full, with plain rotary embeddings
        (``rope_type`` ``default``, as transformers 5 writes them); ``None`` when transformers must read it."""
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        rope = config.get("rope_parameters")
        if any(key not in config for key in _BLOCK_MODEL_KEYS) or not isinstance(rope, dict):
            return None
        if rope.get("rope_type") != "default" or not isinstance(rope.get("rope_theta"), (int, float)):
            return None
        try:
            generation = json.loads((path / "generation_config.json").read_text())
        except (OSError, ValueError):
            generation = {}
        return cls(SimpleNamespace(**config), SimpleNamespace(eos_token_id=generation.get("eos_token_id")))


class _ConfigRotary:
    """Rotary cos/sin of a :class:`BlockModel` (plain RoPE), computed as the Llama and Qwen2 rotary modules of
    transformers compute them."""

    def __init__(self, config: SimpleNamespace, head_dim: int) -> None:
        import torch

        exponents = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim
        self.inv_freq = 1.0 / (config.rope_parameters["rope_theta"] ** exponents)

    def __call__(self, hidden: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        import torch

        freqs = positions[..., None].float() * self.inv_freq.to(device=hidden.device, dtype=torch.float)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(hidden.dtype), angles.sin().to(hidden.dtype)


class FastForward:
    """Inference-only forward of a Llama-architecture causal LM on the CPU (see the module docstring).

    Build it with :meth:`create`, which returns ``None`` (and logs why) for models it does not cover.

    Args:
        model: A transformers causal LM, or a PEFT model around one.
        adapter: For a PEFT model: the LoRA adapter applied on top of the base weights (``None``: the base weights).
        kernels: Run decoding steps through the fused C++ kernels when they are available (see
            :func:`~agentbolt.serving.decode_kernels.load_decode_kernels`); ``False`` keeps every step in Python.
        blocks: Serve these block-quantized weights (:mod:`agentbolt.serving.quantized`) instead of the model's
            parameters; the model then only gives the architecture (it may live on the ``meta`` device). Activations
            are float32, or int8 where ``blocks.int8_activations``.
    """

    def __init__(
        self, model: Any, adapter: Optional[str] = None, kernels: bool = True, blocks: Optional[BlockWeights] = None
    ) -> None:
        if getattr(model, "peft_config", None):
            model = model.get_base_model()
        config = model.config
        self.model = model
        self.adapter = adapter
        self.blocks = blocks
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self._rotary = _rotary_embedding(model, self.head_dim)
        self.intermediate = int(config.intermediate_size)
        self.eps = float(config.rms_norm_eps)
        self._linear: Callable[..., torch.Tensor] = _plain_linear
        self._prepare: Callable[[torch.Tensor], torch.Tensor] = _identity
        self._head_linear: Callable[..., torch.Tensor] = _plain_linear  # float32 products of the output projection
        self._layers: List[Dict[str, Any]] = []
        self._head: Any = None
        self._fused: Dict[int, Tuple[Tuple[Any, ...], torch.Tensor]] = {}  # id(first linear) -> (sources, fused)
        self._factors: Dict[int, Tuple[Tuple[Any, ...], Optional[LoraFactors]]] = {}  # same key, adapter factors
        self._kernels: Any = _decode_kernels_for(self.head_dim) if kernels else None
        self._kernel_layers: List[Tuple[Any, ...]] = []
        self._kernel_adapters: List[Tuple[Any, ...]] = []
        self.cache_dtype: Any = None  # a torch.dtype, set by refresh()
        """The dtype of the key/value states in the cache: the activations' (the model's dtype, float32 on block
        weights), except with int8 activations, which keep them in float16 as llama.cpp does (half the memory of
        float32 states; part of what int8 activations change, see docs/serving.md)."""
        self.refresh()
        logger.info(
            "Lean CPU forward for %s%s%s, decoding steps %s",
            type(model).__name__,
            f" with adapter {adapter!r}" if adapter else "",
            f" on {blocks.description}" if blocks is not None else "",
            "through the fused C++ kernels" if self._kernels is not None else "in Python",
        )

    @property
    def uses_kernels(self) -> bool:
        """Whether decoding steps run through the fused C++ kernels."""
        return self._kernels is not None

    @classmethod
    def create(
        cls, model: Any, adapter: Optional[str] = None, kernels: bool = True, blocks: Optional[BlockWeights] = None
    ) -> Optional[FastForward]:
        """Return a fast forward for ``model`` (through ``adapter``), or ``None`` when it is not covered."""
        reason = cls.unsupported_reason(model, weights=blocks is None)
        if reason is not None:
            logger.info("Generic transformers forward in use: %s", reason)
            return None
        return cls(model, adapter, kernels, blocks)

    @staticmethod
    def unsupported_reason(model: Any, weights: bool = True) -> Optional[str]:
        """Why ``model`` cannot use this forward (``None`` when it can).

        Args:
            model: The model.
            weights: Check its parameters' device and dtype too (not when block weights replace them).
        """
        import torch

        if isinstance(model, BlockModel):
            return FastForward.config_reason(model.config)
        if getattr(model, "peft_config", None):
            reason = _unsupported_adapters(model)
            if reason is not None:
                return reason
            model = model.get_base_model()
        reason = FastForward.config_reason(getattr(model, "config", None))
        if reason is not None:
            return reason
        parameter = next(model.parameters())
        if weights and parameter.device.type != "cpu":
            return f"device {parameter.device} (the fast forward is for CPUs)"
        if weights and parameter.dtype not in (torch.bfloat16, torch.float32):
            return f"dtype {parameter.dtype}"
        inner = getattr(model, "model", None)
        if inner is None or not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
            return "unexpected module layout"
        return None

    @staticmethod
    def config_reason(config: Any) -> Optional[str]:
        """Why a model of this transformers config cannot use this forward (``None`` when it can)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in _ARCHITECTURES:
            return f"architecture {model_type!r} is not one of {sorted(_ARCHITECTURES)}"
        activation = getattr(config, "hidden_act", "silu")
        if activation != "silu":
            return f"activation {activation!r} is not silu"
        if getattr(config, "use_sliding_window", False):
            return "sliding-window attention"
        return None

    def refresh(self) -> None:
        """Bring the fused (and reordered) weights and the adapter's factors up to date with the model's parameters.

        A fused weight or a factor pair is rebuilt only when one of its source tensors changed (another tensor, or
        an in-place update bumped its version): after a LoRA training step only the adapter's factors are copied
        again, and no base weight.
        """
        import torch

        if self.blocks is not None:
            self._use_blocks(self.blocks)
            return
        self.cache_dtype = next(self.model.parameters()).dtype
        self._linear, self._prepare = _linear_kernels(self.cache_dtype)
        self._head_linear = _linear_kernels(torch.float32)[0]
        layers: List[Dict[str, Any]] = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                attention, mlp = layer.self_attn, layer.mlp
                qkv = (attention.q_proj, attention.k_proj, attention.v_proj)
                layers.append(
                    {
                        "qkv": self._fuse(qkv),
                        "qkv_bias": _fused_bias(qkv),
                        "qkv_lora": self._lora_factors(qkv),
                        "o": self._fuse((attention.o_proj,)),
                        "o_bias": _fused_bias((attention.o_proj,)),
                        "o_lora": self._lora_factors((attention.o_proj,)),
                        "gate_up": self._fuse((mlp.gate_proj, mlp.up_proj)),
                        "gate_up_bias": _fused_bias((mlp.gate_proj, mlp.up_proj)),
                        "gate_up_lora": self._lora_factors((mlp.gate_proj, mlp.up_proj)),
                        "down": self._fuse((mlp.down_proj,)),
                        "down_bias": _fused_bias((mlp.down_proj,)),
                        "down_lora": self._lora_factors((mlp.down_proj,)),
                        "norm_attention": layer.input_layernorm.weight.detach(),
                        "norm_mlp": layer.post_attention_layernorm.weight.detach(),
                    }
                )
            self._head = self._fuse((self.model.lm_head,), float32=True)
        self._set_layers(layers)

    def _use_blocks(self, blocks: BlockWeights) -> None:
        """Take every projection, the head and the norms from block-quantized weights (float32 activations, or int8
        ones where ``blocks.int8_activations``)."""
        import torch

        from agentbolt.serving.quantized import block_linear

        self._linear = block_linear
        self.cache_dtype = torch.float16 if blocks.int8_activations else torch.float32
        self._head_linear = block_linear
        self._prepare = _identity
        self._head = blocks.head
        layers = [
            {**layer, **{f"{name}_lora": None for name in ("qkv", "o", "gate_up", "down")}} for layer in blocks.layers
        ]
        self._set_layers(layers)

    def _set_layers(self, layers: List[Dict[str, Any]]) -> None:
        self._layers = layers
        names = ("norm_attention", "qkv", "qkv_bias", "o", "o_bias", "norm_mlp", "gate_up", "gate_up_bias", "down")
        self._kernel_layers = [(*(layer[name] for name in names), layer["down_bias"]) for layer in layers]
        adapted = ("qkv_lora", "o_lora", "gate_up_lora", "down_lora")
        if any(layer[name] is not None for layer in layers for name in adapted):
            self._kernel_adapters = [
                tuple(factor for name in adapted for factor in (layer[name] or (None, None))) for layer in layers
            ]
        else:
            self._kernel_adapters = []

    @staticmethod
    def _versions(tensors: Any) -> Tuple[Any, ...]:
        """Identity and in-place version of each tensor: equal tuples mean unchanged tensors."""
        return tuple((id(tensor), tensor.data_ptr(), tensor._version) for tensor in tensors)

    def _fuse(self, linears: Any, float32: bool = False) -> torch.Tensor:
        """The base weights of ``linears`` concatenated and packed for :attr:`_linear` (cached while unchanged).

        ``float32``: a float32 copy packed for :attr:`_head_linear` instead.
        """
        import torch

        weights = [getattr(linear, "base_layer", linear).weight for linear in linears]
        sources = self._versions(weights)
        known = self._fused.get(id(linears[0]))
        if known is not None and known[0] == sources:
            return known[1]
        weight = (torch.cat(weights) if len(weights) > 1 else weights[0]).detach()
        if float32:
            fused = _linear_kernels(torch.float32)[1](weight.float().contiguous())
        else:
            fused = self._prepare(weight.contiguous())
        self._fused[id(linears[0])] = (sources, fused)
        return fused

    def _lora_factors(self, linears: Any) -> Optional[LoraFactors]:
        """The adapter's factors for the fused projection of ``linears`` (None when none of them is adapted).

        ``a`` stacks the adapted projections' ``A`` matrices ``[sum of ranks, in]``; ``b`` is block diagonal
        ``[sum of out_features, sum of ranks]`` with each ``scale * B`` in its projection's rows (zero rows for
        projections without the adapter), so ``b @ (a @ x)`` is every projection's LoRA term at once.
        """
        import torch

        pairs = [
            (linear.lora_A[self.adapter].weight, linear.lora_B[self.adapter].weight, linear.scaling[self.adapter])
            if self.adapter is not None and self.adapter in getattr(linear, "lora_A", {})
            else None
            for linear in linears
        ]
        present = [pair for pair in pairs if pair is not None]
        sources = self._versions(tensor for pair in present for tensor in pair[:2])
        known = self._factors.get(id(linears[0]))
        if known is not None and known[0] == sources:
            return known[1]
        factors: Optional[LoraFactors] = None
        if present:
            dtype = present[0][0].dtype
            blocks = [
                (pair[1].detach() * pair[2]).to(dtype)
                if pair is not None
                else torch.zeros(linear.out_features, 0, dtype=dtype, device=present[0][0].device)
                for pair, linear in zip(pairs, linears, strict=True)
            ]
            down = torch.cat([pair[0].detach().to(dtype) for pair in present])
            factors = (down.contiguous(), torch.block_diag(*blocks).contiguous())
        self._factors[id(linears[0])] = (sources, factors)
        return factors

    def _project(self, inputs: torch.Tensor, layer: Dict[str, Any], name: str) -> torch.Tensor:
        """The fused projection ``name`` of ``layer`` (base weights, bias and the adapter's LoRA term)."""
        projected = self._linear(inputs, layer[name], layer[f"{name}_bias"])
        factors = layer[f"{name}_lora"]
        return projected if factors is None else _with_lora(inputs, projected, factors)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Run the model on ``input_ids`` ``[batch, new]``; return the last position's float32 logits ``[batch, vocab]``.

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
        hidden = self._embed(input_ids)
        cos, sin = self._rotary(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        past = cache.length
        total = past + new
        # Key j is visible to new token t when it is a real token and not in the future; every query also sees
        # itself so that padding queries never have an empty softmax (their outputs are masked everywhere else).
        visible = torch.ones(new, total, dtype=torch.bool, device=input_ids.device).tril(past)
        visible = mask[:, None, None, :total].bool() & visible
        visible[:, :, torch.arange(new), torch.arange(past, total)] = True
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        project = self._project
        for index, layer in enumerate(self._layers):
            normed = _rms_norm(hidden, layer["norm_attention"], self.eps)
            query, key, value = project(normed, layer, "qkv").split(sizes, dim=-1)
            query = _rotate(query.view(batch, new, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            key = _rotate(key.view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            value = value.view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.append(index, key.to(self.cache_dtype), value.to(self.cache_dtype))
            attended = F.scaled_dot_product_attention(
                query,
                keys.to(query.dtype),
                values.to(query.dtype),
                attn_mask=visible,
                enable_gqa=self.kv_heads != self.heads,
            )
            attended = attended.transpose(1, 2).reshape(batch, new, self.heads * self.head_dim)
            hidden = hidden + project(attended, layer, "o")
            normed = _rms_norm(hidden, layer["norm_mlp"], self.eps)
            gate, up = project(normed, layer, "gate_up").split(self.intermediate, dim=-1)
            hidden = hidden + project(F.silu(gate) * up, layer, "down")
        last = _rms_norm(hidden[:, -1], self._final_norm, self.eps)
        return self._head_linear(last.float(), self._head, None)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of ``input_ids`` (rows of the block embedding dequantized on lookup)."""
        if self.blocks is None:
            return self.model.model.embed_tokens(input_ids)
        from agentbolt.serving.quantized import embedding_rows

        return embedding_rows(self.blocks.embedding, input_ids, self.model.config.hidden_size)

    @property
    def _final_norm(self) -> torch.Tensor:
        return self.blocks.final_norm if self.blocks is not None else self.model.model.norm.weight.detach()

    def _decode_with_kernels(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """One decoding step (one new token per row) through the fused C++ kernels."""
        import torch

        hidden = self._embed(input_ids[:, 0])
        cos, sin = self._rotary(hidden, positions)
        like = hidden.new_empty(hidden.shape[0], self.kv_heads, 1, self.head_dim, dtype=self.cache_dtype)
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
            self._kernel_adapters,
            keys,
            values,
            self._final_norm,
            self._head,
            self.heads,
            self.kv_heads,
            self.intermediate,
            self.eps,
            self._linear is _packed_linear,
            self._head_linear is _packed_linear,
        )


def _rotary_embedding(model: Any, head_dim: int) -> Any:
    """The model's rotary embedding module, or a CPU copy of it when the model lives on the ``meta`` device (for a
    :class:`BlockModel`: the same computation from the config)."""
    if isinstance(model, BlockModel):
        return _ConfigRotary(model.config, head_dim)
    rotary = model.model.rotary_emb
    buffer = next(rotary.buffers(), None)
    if buffer is None or buffer.device.type != "meta":
        return rotary
    return type(rotary)(config=model.config)


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


def _with_lora(inputs: torch.Tensor, projected: torch.Tensor, factors: LoraFactors) -> torch.Tensor:
    """``projected`` plus the LoRA term ``b @ (a @ inputs)``, with PEFT's rounding.

    PEFT's LoRA layer adds ``lora_B(lora_A(x.to(adapter dtype))) * scale`` to the base layer's output and casts the
    sum back once; doing the same here keeps the served log-probs equal to the trainer's up to summation order.
    """
    import torch.nn.functional as F

    a, b = factors
    return (projected + F.linear(F.linear(inputs.to(a.dtype), a), b)).to(projected.dtype)


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


def bfloat16_is_native() -> bool:
    """Whether oneDNN multiplies bfloat16 matrices with this CPU's own instructions (AVX-512 or AVX-NE-CONVERT).

    Without them (an AVX2-only CPU, for example) bfloat16 products are emulated and several times slower than
    float32 ones, so a CPU job that may choose its dtype should choose float32.
    """
    import torch

    return _linear_kernels(torch.bfloat16)[0] is _packed_linear


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
