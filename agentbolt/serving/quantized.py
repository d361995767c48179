"""Block-quantized weights for the lean CPU forward: llama.cpp's Q4_1 and Q8_0 blocks, served natively.

Decoding one token reads every weight once, so on a CPU its time is mostly the bytes of the weights: 270 MB in
bfloat16 for the embedded SmolLM2-135M, 540 MB in float32, 96 MB as the Q4_1 / Q8_0 blocks it ships in. This module
gives the fused C++ kernels (:mod:`agentbolt.serving.decode_kernels`) those blocks:

* **From the model's GGUF file** (:func:`load_gguf_blocks`), for models converted from one (the registry's embedded
  model; the directory's marker names the file): the blocks are used byte for byte. The kernels multiply float32
  inputs with ``d * q (+ m)``, exactly the float32 values the conversion wrote, so serving the blocks computes what
  the converted float32 model computes, up to float32 summation order, with a fraction of the memory traffic, and
  without ever holding the float32 weights in memory.
* **Quantized at load** (:func:`quantize_model`), for any other Llama-architecture model: ``q8_0`` (int8 with one
  scale per 32 weights) or ``q4_1`` (4 bits with a scale and a minimum per 32 weights), as llama.cpp's reference
  quantizers compute them. This is lossy; docs/serving.md has the measured effect on logits.

Quantized weights do not follow weight updates: an engine serving them refuses in-place updates, state dicts and
LoRA adapters, so training (which needs the engine to compute with the trainer's own weights) never runs on them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import torch

__all__ = [
    "QUANTIZATIONS",
    "BlockWeights",
    "block_linear",
    "dequantize_blocks",
    "embedding_rows",
    "gguf_source",
    "load_gguf_blocks",
    "quantize_blocks",
    "quantize_model",
]

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "auto", "q8_0", "q4_1")
"""``none``: float weights; ``auto``: a model's own GGUF blocks when it has them, else none; ``q8_0`` / ``q4_1``:
every projection in that block format (the GGUF's own blocks where they already are)."""

BLOCK = 32
_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}
_GGUF_KINDS = {"Q4_1": "q4_1", "Q8_0": "q8_0"}
_PROJECTIONS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up")}
_PROJECTIONS["down"] = ("ffn_down",)


@dataclass
class BlockWeights:
    """Every weight the lean forward needs, with the projections, embedding and output head as blocks.

    Attributes:
        layers: Per layer: ``norm_attention``, ``norm_mlp`` (float32), ``qkv``, ``o``, ``gate_up``, ``down`` (uint8
            blocks ``[out_features, bytes]``, fused like the float forward's) and their biases (float32 or None).
        embedding: Token embeddings as blocks ``[vocab, bytes]`` (rows are dequantized on lookup).
        head: Output projection as blocks (the embedding itself for tied models).
        final_norm: The last RMSNorm's weight (float32).
        description: What was loaded, for logs and ``/v1/models`` (e.g. ``"q4_1 projections, q8_0 head (GGUF)"``).
        exact: The blocks are the model's own (its float weights are their dequantized values).
    """

    layers: List[Dict[str, Any]]
    embedding: torch.Tensor
    head: torch.Tensor
    final_norm: torch.Tensor
    description: str
    exact: bool
    kinds: Dict[str, int] = field(default_factory=dict)

    @property
    def int8_activations(self) -> bool:
        """The layers' products take int8 inputs (:meth:`use_int8_activations`); the head keeps float32 ones."""
        return any(layer[name].dim() == 3 for layer in self.layers for name in _PROJECTIONS)

    def use_int8_activations(self) -> None:
        """Quantize the inputs of the layers' block products to int8 per block of 32 (as llama.cpp does) and multiply
        in integers: several times faster, no longer equal to the float32 model (docs/serving.md has the measured
        effect). The projections are rearranged in place into the interleaved layout those products read
        (:func:`interleave_blocks`); the output head keeps float32 inputs.

        Raises:
            ValueError: A projection's output count is not a multiple of 8.
        """
        for layer in self.layers:
            if layer["down"].dim() == 3:
                continue
            hidden, intermediate = layer["norm_attention"].numel(), layer["gate_up"].shape[0] // 2
            for name in _PROJECTIONS:
                layer[name] = interleave_blocks(layer[name], intermediate if name == "down" else hidden)

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors (the tied head counted once)."""
        tensors = [self.embedding, self.final_norm]
        if self.head is not self.embedding:
            tensors.append(self.head)
        for layer in self.layers:
            tensors += [value for value in layer.values() if value is not None]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def _kernels() -> Any:
    from agentbolt.serving.decode_kernels import load_decode_kernels

    kernels = load_decode_kernels()
    if kernels is None or not hasattr(kernels, "block_linear"):
        raise RuntimeError(
            "quantized weights need the compiled decoding kernels (a C++ compiler and the Python headers); see the "
            "log for why they are unavailable"
        )
    return kernels


def block_kind(weight: torch.Tensor, in_features: int) -> str:
    """``q4_1`` or ``q8_0``: the format of a block tensor with ``in_features`` inputs per row."""
    per_block = weight.shape[1] // (in_features // BLOCK)
    for kind, size in _BLOCK_BYTES.items():
        if size == per_block and weight.shape[1] == size * (in_features // BLOCK):
            return kind
    raise ValueError(f"rows of {weight.shape[1]} bytes are not Q4_1 or Q8_0 blocks of {in_features} inputs")


def dequantize_blocks(weight: torch.Tensor, in_features: int) -> torch.Tensor:
    """The float32 weights ``[out_features, in_features]`` that blocks stand for (``d * q``, ``+ m`` for Q4_1)."""
    return _kernels().dequantize_blocks(weight.contiguous(), in_features)


def interleave_blocks(weight: torch.Tensor, in_features: int) -> torch.Tensor:
    """Block rows ``[out_features, bytes]`` rearranged for int8 inputs: ``[out_features / 8, blocks, 8 * block
    bytes]``, the same bytes in groups of 8 rows (the layout is described in ``csrc/decode_kernels.cpp``).

    Raises:
        ValueError: ``out_features`` is not a multiple of 8, or the rows are not Q4_1 / Q8_0 blocks.
    """
    if weight.dim() != 2 or weight.shape[0] % 8:
        raise ValueError(
            f"interleaving needs block rows [out_features, bytes] with out_features a multiple of 8, got "
            f"{tuple(weight.shape)}"
        )
    block_kind(weight, in_features)
    return _kernels().interleave_blocks(weight.contiguous(), in_features)


def block_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``inputs @ W.T + bias`` for block weights ``W``: float32 inputs ``[..., in_features]``, float32 result.

    Rows in GGUF order ``[out_features, bytes]`` multiply the float32 inputs. Interleaved rows
    (:func:`interleave_blocks`) multiply the inputs quantized to int8 per block of 32 (scale ``max|x| / 127``), in
    integers, as llama.cpp does; Q4_1's offsets still multiply the exact sums of the inputs.
    """
    return _kernels().block_linear(inputs.float(), weight, bias)


def embedding_rows(embedding: torch.Tensor, token_ids: torch.Tensor, hidden: int) -> torch.Tensor:
    """Float32 embeddings ``[*token_ids.shape, hidden]`` from a block embedding (only the rows needed)."""
    rows = embedding.index_select(0, token_ids.reshape(-1))
    return dequantize_blocks(rows, hidden).view(*token_ids.shape, hidden)


def quantize_blocks(weight: torch.Tensor, kind: str) -> torch.Tensor:
    """Quantize float weights ``[out_features, in_features]`` into ``kind`` blocks, as llama.cpp's reference does.

    ``q8_0``: ``d = max|w| / 127`` (stored as float16), ``q = round(w / d)`` (halves away from zero). ``q4_1``:
    ``d = (max - min) / 15`` and ``m = min`` (float16), ``q = round((w - m) / d)`` clipped to 0..15. The bytes equal
    those of the ``gguf`` package's reference quantizers.

    Raises:
        ValueError: Unknown kind, or ``in_features`` not a multiple of 32.
    """
    import torch

    if kind not in _BLOCK_BYTES:
        raise ValueError(f"unknown block format {kind!r}; use one of {sorted(_BLOCK_BYTES)}")
    rows, columns = weight.shape
    if columns % BLOCK:
        raise ValueError(f"block quantization needs in_features a multiple of {BLOCK}, got {columns}")
    blocks = weight.detach().float().reshape(rows, columns // BLOCK, BLOCK)
    if kind == "q8_0":
        scale = blocks.abs().amax(dim=-1) / 127.0
        inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        scaled = blocks * inverse.unsqueeze(-1)
        magnitude = scaled.abs()
        whole = torch.floor(magnitude)
        rounded = whole + torch.floor(2 * (magnitude - whole))  # half away from zero, like C's roundf
        values = (torch.sign(scaled) * rounded).clamp(-127, 127).to(torch.int8)
        parts = [scale.to(torch.float16).unsqueeze(-1).view(torch.uint8), values.view(torch.uint8)]
    else:
        low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
        scale = (high - low) / 15.0
        inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        levels = torch.floor((blocks - low.unsqueeze(-1)) * inverse.unsqueeze(-1) + 0.5).clamp(0, 15).to(torch.uint8)
        packed = levels[..., :16] | (levels[..., 16:] << 4)
        parts = [
            scale.to(torch.float16).unsqueeze(-1).view(torch.uint8),
            low.to(torch.float16).unsqueeze(-1).view(torch.uint8),
            packed,
        ]
    return torch.cat(parts, dim=-1).reshape(rows, -1).contiguous()


def gguf_source(model_dir: Path) -> Optional[Path]:
    """The GGUF file a model directory was converted from (its marker says), if it still exists."""
    from agentbolt.models.marker import MARKER_FILE

    marker = Path(model_dir) / MARKER_FILE
    try:
        source = json.loads(marker.read_text()).get("converted_from")
    except (OSError, ValueError):
        return None
    path = Path(source) if isinstance(source, str) else None
    return path if path is not None and path.is_file() else None


def _config_sizes(config: Any) -> Dict[str, int]:
    heads = int(config.num_attention_heads)
    return {
        "heads": heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        "hidden": int(config.hidden_size),
        "layers": int(config.num_hidden_layers),
        "vocab": int(config.vocab_size),
    }


def _unpermute_rows(heads: int, head_dim: int) -> Any:
    """Row order that undoes llama.cpp's interleaving of rotary halves in Q and K (its ``permute`` when converting
    Llama checkpoints): row ``h * D + j * D / 2 + r`` of the Hugging Face weight is row ``h * D + 2 * r + j`` of
    the GGUF one."""
    import torch

    half = head_dim // 2
    head = torch.arange(heads).view(heads, 1, 1) * head_dim
    pair = torch.arange(2).view(1, 2, 1)
    position = torch.arange(half).view(1, 1, half)
    return (head + 2 * position + pair).reshape(-1)


@dataclass
class _GgufTensor:
    """Where one tensor of a GGUF file lies, and its type."""

    name: str
    tensor_type: Any
    path: Path
    offset: int
    shape: Tuple[int, ...]  # ``[rows, row bytes]`` for block formats, the tensor's shape for F32 / F16
    element: Any  # NumPy dtype of the elements: uint8 for block formats

    @property
    def data(self) -> Any:
        """The tensor's bytes, read from the file into memory of their own (a file mapping would count the pages it
        touched in the process's resident memory until unmapped), shaped as ``gguf.quants.dequantize`` takes them."""
        import numpy as np

        count = int(np.prod(self.shape))
        return np.fromfile(self.path, dtype=self.element, count=count, offset=self.offset).reshape(self.shape)


def _read_gguf(path: Path) -> Tuple[Dict[str, _GgufTensor], str]:
    """The tensors of a GGUF file (read on access) and its ``general.architecture``.

    ``gguf.GGUFReader`` builds a NumPy object for every part of every metadata value (about 245,000 for the embedded
    model's tokenizer: ~160 MB while loading); this walks the metadata with ``struct`` and keeps only what loading
    the weights needs.
    """
    import struct

    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    scalar_formats = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    view = memoryview(mapped)  # type: ignore[arg-type]
    position = 0

    def read(fmt: str) -> Any:
        nonlocal position
        (value,) = struct.unpack_from("<" + fmt, view, position)
        position += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal position
        length = read("Q")
        position += length
        return bytes(view[position - length : position]).decode("utf-8", errors="replace")

    def value(kind: int) -> Any:
        nonlocal position
        if kind == 8:
            return string()
        if kind == 9:
            item_kind, count = read("I"), read("Q")
            if item_kind in scalar_formats:  # skipped whole: loading the weights needs no array value
                position += count * struct.calcsize(scalar_formats[item_kind])
            else:
                for _ in range(count):
                    value(item_kind)
            return None
        if kind not in scalar_formats:
            raise ValueError(f"{path.name}: unknown GGUF metadata value type {kind}")
        return read(scalar_formats[kind])

    if bytes(view[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    position = 4
    try:
        version, tensor_count, metadata_count = read("I"), read("Q"), read("Q")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        metadata: Dict[str, Any] = {}
        for _ in range(metadata_count):
            key = string()
            metadata[key] = value(read("I"))
        infos = []
        for _ in range(tensor_count):
            name = string()
            dims = [read("Q") for _ in range(read("I"))]
            infos.append((name, dims, GGMLQuantizationType(read("I")), read("Q")))
        alignment = int(metadata.get("general.alignment") or 32)
        start = -(-position // alignment) * alignment
        tensors: Dict[str, _GgufTensor] = {}
        for name, dims, tensor_type, offset in infos:
            columns, rows = dims[0], int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
            block_size, block_bytes = GGML_QUANT_SIZES[tensor_type]
            row_bytes = columns // block_size * block_bytes
            if start + offset + rows * row_bytes > len(mapped):
                raise ValueError(f"tensor {name!r} ends past the end of the file")
            element = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}.get(tensor_type)
            if element is None:
                shape, element = (rows, row_bytes), np.uint8
            else:  # shaped like the tensor (outermost dimension first)
                shape = tuple(int(size) for size in reversed(dims))
            tensors[name] = _GgufTensor(name, tensor_type, path, start + offset, shape, element)
    except (struct.error, ValueError, KeyError) as exc:  # truncated, or values no GGUF writer produces
        raise ValueError(f"{path.name} is not a readable GGUF file: {exc}") from exc
    return tensors, str(metadata.get("general.architecture") or "")


def load_gguf_blocks(path: Path, config: Any, kind: Optional[str] = None) -> BlockWeights:
    """Read a Llama-architecture GGUF file into :class:`BlockWeights`.

    Args:
        path: The GGUF file the model was converted from.
        config: The converted model's transformers config (sizes, and the same architecture).
        kind: Block format of the projections: ``None`` keeps the file's Q4_1 / Q8_0 tensors as they are; ``q4_1`` /
            ``q8_0`` requantize tensors of another format. Tensors in other formats (F16, K-quants...) are
            dequantized and requantized to ``kind`` (default ``q8_0``). The head keeps the file's Q8_0 / Q4_1 blocks
            and is requantized to ``q8_0`` otherwise.

    Raises:
        ValueError: The file does not match the config or holds a tensor this loader cannot read.
    """
    import numpy as np
    import torch
    from gguf.quants import dequantize

    sizes = _config_sizes(config)
    tensors, architecture = _read_gguf(path)
    counts: Dict[str, int] = {}
    requantized: List[str] = []

    def blocks_of(name: str, wanted: Optional[str], in_features: int, rows: Optional[Any] = None) -> torch.Tensor:
        tensor = tensors.get(name)
        if tensor is None:
            raise ValueError(f"{path.name} has no tensor {name!r}")
        native = _GGUF_KINDS.get(tensor.tensor_type.name)
        if native is not None and (wanted is None or wanted == native):
            data = torch.from_numpy(tensor.data.reshape(-1, in_features // BLOCK * _BLOCK_BYTES[native]))
            counts[native] = counts.get(native, 0) + 1
        else:
            values = dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(-1, in_features)
            target = wanted or "q8_0"
            data = quantize_blocks(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), target)
            counts[target] = counts.get(target, 0) + 1
            requantized.append(f"{name} ({tensor.tensor_type.name})")
        return data.index_select(0, rows) if rows is not None else data

    def floats(name: str) -> Optional[torch.Tensor]:
        tensor = tensors.get(name)
        if tensor is None:
            return None
        values = dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(-1)
        return torch.from_numpy(np.array(values, dtype=np.float32))

    hidden, head_dim = sizes["hidden"], sizes["head_dim"]
    permute = architecture == "llama"
    q_rows = _unpermute_rows(sizes["heads"], head_dim) if permute else None
    k_rows = _unpermute_rows(sizes["kv_heads"], head_dim) if permute else None
    layers = []
    for index in range(sizes["layers"]):
        prefix = f"blk.{index}"
        rows = {"attn_q": q_rows, "attn_k": k_rows}
        layer: Dict[str, Any] = {}
        for role, names in _PROJECTIONS.items():
            in_features = config.intermediate_size if role == "down" else hidden
            parts = [blocks_of(f"{prefix}.{name}.weight", kind, in_features, rows.get(name)) for name in names]
            layer[role] = torch.cat(parts).contiguous() if len(parts) > 1 else parts[0]
            biases = [floats(f"{prefix}.{name}.bias") for name in names]
            if all(bias is None for bias in biases):
                layer[f"{role}_bias"] = None
            else:
                widths = [part.shape[0] for part in parts]
                filled = [b if b is not None else torch.zeros(w) for b, w in zip(biases, widths, strict=True)]
                if permute:
                    filled = [
                        b.index_select(0, rows[n]) if rows.get(n) is not None else b
                        for b, n in zip(filled, names, strict=True)
                    ]
                layer[f"{role}_bias"] = torch.cat(filled)
        layer["norm_attention"] = floats(f"{prefix}.attn_norm.weight")
        layer["norm_mlp"] = floats(f"{prefix}.ffn_norm.weight")
        layers.append(layer)
    embedding = blocks_of("token_embd.weight", None, hidden)
    head = blocks_of("output.weight", None, hidden) if "output.weight" in tensors else embedding
    final_norm = floats("output_norm.weight")
    if embedding.shape[0] != sizes["vocab"] or final_norm is None or final_norm.numel() != hidden:
        raise ValueError(f"{path.name} does not match the model's config (vocabulary, hidden size or final norm)")
    if requantized:
        logger.info("Requantized %d GGUF tensors of other formats: %s", len(requantized), ", ".join(requantized[:4]))
    description = ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) + f" tensors from {path.name}"
    return BlockWeights(layers, embedding, head, final_norm, description, exact=not requantized, kinds=counts)


def quantize_model(model: Any, kind: str) -> BlockWeights:
    """Quantize a float Llama-architecture transformers model's projections to ``kind`` blocks (lossy); the head
    and embedding become ``q8_0`` blocks."""
    import torch

    inner = model.model
    counts: Dict[str, int] = {}

    def quantized(linears: Sequence[Any], target: str) -> torch.Tensor:
        counts[target] = counts.get(target, 0) + len(linears)
        return quantize_blocks(torch.cat([linear.weight.detach().float() for linear in linears]), target)

    def bias(linears: Sequence[Any]) -> Optional[torch.Tensor]:
        if all(linear.bias is None for linear in linears):
            return None
        return torch.cat(
            [
                linear.bias.detach().float() if linear.bias is not None else torch.zeros(linear.out_features)
                for linear in linears
            ]
        )

    layers = []
    for block in inner.layers:
        attention, mlp = block.self_attn, block.mlp
        groups = {
            "qkv": (attention.q_proj, attention.k_proj, attention.v_proj),
            "o": (attention.o_proj,),
            "gate_up": (mlp.gate_proj, mlp.up_proj),
            "down": (mlp.down_proj,),
        }
        layer: Dict[str, Any] = {}
        for role, linears in groups.items():
            layer[role] = quantized(linears, kind)
            layer[f"{role}_bias"] = bias(linears)
        layer["norm_attention"] = block.input_layernorm.weight.detach().float().clone()
        layer["norm_mlp"] = block.post_attention_layernorm.weight.detach().float().clone()
        layers.append(layer)
    embedding = quantized([inner.embed_tokens], "q8_0")
    head_module = model.get_output_embeddings()
    tied = head_module is None or head_module.weight is inner.embed_tokens.weight
    head = embedding if tied else quantized([head_module], "q8_0")
    final_norm = inner.norm.weight.detach().float().clone()
    description = ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) + " tensors quantized at load"
    return BlockWeights(layers, embedding, head, final_norm, description, exact=False, kinds=counts)
