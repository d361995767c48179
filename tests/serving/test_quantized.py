"""Block-quantized serving: the kernels' products, GGUF blocks read exactly, engines that refuse to train on them."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path
from typing import Any, List, Tuple

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from agentbolt.models.marker import MARKER_FILE, write_marker
from agentbolt.serving import decode_kernels
from agentbolt.serving.decode_kernels import load_decode_kernels
from agentbolt.serving.fast_forward import BlockModel, FastForward
from agentbolt.serving.kv_cache import KVCache
from agentbolt.serving.params import EngineError, SamplingParams
from agentbolt.serving.quantized import (
    block_linear,
    dequantize_blocks,
    gguf_source,
    interleave_blocks,
    load_gguf_blocks,
    quantize_blocks,
    quantize_model,
)
from agentbolt.serving.transformers_engine import TransformersEngine

pytestmark = pytest.mark.skipif(load_decode_kernels() is None, reason="the decoding kernels cannot be built here")

Q4_1, Q8_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0


def _llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's conversion of Llama Q and K rows (the two rotary halves of each head interleaved)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _llama_unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    return (
        weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


@pytest.fixture(scope="module")
def gguf_model_dir(kernel_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny kernel model written as a GGUF file (Q4_1 projections, Q8_0 embedding, as the embedded model ships)
    and the float32 directory made from it the way ``agentbolt models pull`` makes the embedded model's: weights
    equal to the file's dequantized values, a marker naming the file."""
    root = tmp_path_factory.mktemp("tiny-gguf")
    model = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=torch.float32)
    config = model.config
    writer = gguf.GGUFWriter(str(root / "tiny.Q4_1.gguf"), "llama")

    def write(name: str, weight: torch.Tensor, kind: Any, heads: int = 0) -> torch.Tensor:
        values = weight.detach().numpy()
        if heads:
            values = _llama_permute(values, heads)
        blocks = gguf.quants.quantize(values, kind)
        writer.add_tensor(name, blocks, raw_dtype=kind)
        restored = gguf.quants.dequantize(blocks, kind).reshape(values.shape)
        return torch.from_numpy(np.ascontiguousarray(_llama_unpermute(restored, heads) if heads else restored))

    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            attention, mlp = layer.self_attn, layer.mlp
            parts = [
                ("attn_q", attention.q_proj, config.num_attention_heads),
                ("attn_k", attention.k_proj, config.num_key_value_heads),
                ("attn_v", attention.v_proj, 0),
                ("attn_output", attention.o_proj, 0),
                ("ffn_gate", mlp.gate_proj, 0),
                ("ffn_up", mlp.up_proj, 0),
                ("ffn_down", mlp.down_proj, 0),
            ]
            for name, linear, heads in parts:
                linear.weight.copy_(write(f"blk.{index}.{name}.weight", linear.weight, Q4_1, heads))
            writer.add_tensor(f"blk.{index}.attn_norm.weight", layer.input_layernorm.weight.numpy())
            writer.add_tensor(f"blk.{index}.ffn_norm.weight", layer.post_attention_layernorm.weight.numpy())
        model.model.embed_tokens.weight.copy_(write("token_embd.weight", model.model.embed_tokens.weight, Q8_0))
        if not config.tie_word_embeddings:
            model.lm_head.weight.copy_(write("output.weight", model.lm_head.weight, Q8_0))
        writer.add_tensor("output_norm.weight", model.model.norm.weight.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    directory = root / "converted"
    shutil.copytree(kernel_model_dir, directory)
    (directory / MARKER_FILE).unlink()
    model.save_pretrained(directory)
    write_marker(directory, {"converted_from": str(root / "tiny.Q4_1.gguf")})
    return directory


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_quantized_blocks_are_the_reference_quantizers_and_dequantize_within_half_a_step(kind: str) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 96, generator=generator) * 0.05
    blocks = quantize_blocks(weight, kind)
    reference = gguf.quants.quantize(weight.numpy(), Q8_0 if kind == "q8_0" else Q4_1)
    assert np.array_equal(blocks.numpy().reshape(reference.shape), reference)  # llama.cpp's bytes
    restored = dequantize_blocks(blocks, 96)
    grouped = weight.view(48, 3, 32)
    span = grouped.abs().amax(-1) / 127 if kind == "q8_0" else (grouped.amax(-1) - grouped.amin(-1)) / 15
    # Half a step, plus what storing d (and m) as float16 moves the levels.
    bound = 0.6 * span + (grouped.amin(-1).abs() * 2**-10 if kind == "q4_1" else 0)
    assert ((restored - weight).view(48, 3, 32).abs() <= bound.unsqueeze(-1)).all()
    assert torch.equal(restored, torch.from_numpy(gguf.quants.dequantize(reference, Q8_0 if kind == "q8_0" else Q4_1)))


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 21])
def test_block_products_equal_the_float32_products_of_the_dequantized_weights(kind: str, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    weight = quantize_blocks(torch.randn(70, 128, generator=generator), kind)
    inputs = torch.randn(2, rows, 128, generator=generator)
    bias = torch.randn(70, generator=generator)
    expected = inputs.double() @ dequantize_blocks(weight, 128).double().T + bias.double()
    result = block_linear(inputs, weight, bias)
    assert result.shape == (2, rows, 70) and result.dtype == torch.float32
    torch.testing.assert_close(result.double(), expected, rtol=1e-5, atol=1e-4)


def _int8_blocks(inputs: torch.Tensor) -> torch.Tensor:
    """What the kernels multiply for int8 inputs: per block of 32, ``s * round(x / s)`` with ``s = max|x| / 127``."""
    grouped = inputs.double().reshape(*inputs.shape[:-1], -1, 32)
    scale = (grouped.abs().amax(-1, keepdim=True) / 127).float().double()  # the kernels keep the scale in float32
    quantized = torch.where(scale > 0, torch.round(grouped / scale.clamp_min(1e-30)), torch.zeros_like(grouped))
    return (quantized * scale).reshape(inputs.shape)


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9, 21])
def test_int8_input_products_are_the_products_of_the_int8_blocks(kind: str, rows: int) -> None:
    generator = torch.Generator().manual_seed(100 + rows)
    weight = quantize_blocks(torch.randn(72, 128, generator=generator), kind)
    inputs = torch.randn(2, rows, 128, generator=generator) * 3
    inputs[0, 0, :32] = 0.0  # an all-zero block: scale 0
    bias = torch.randn(72, generator=generator)
    blocks = weight.view(torch.uint8).reshape(72, 4, -1)
    scales = blocks[..., :2].contiguous().view(torch.float16).double().squeeze(-1)  # d, per row and block
    dequantized = dequantize_blocks(weight, 128).double()
    if kind == "q4_1":
        # Q4_1's offsets m multiply the exact sums of the float inputs; d * q multiplies the int8 blocks.
        offsets = blocks[..., 2:4].contiguous().view(torch.float16).double().squeeze(-1)
        scaled = (dequantized.view(72, 4, 32) - offsets.unsqueeze(-1)).view(72, 128)
        sums = inputs.double().view(2, rows, 4, 32).sum(-1)
        expected = _int8_blocks(inputs) @ scaled.T + sums @ offsets.T
    else:
        expected = _int8_blocks(inputs) @ dequantized.T
    assert scales.shape == (72, 4)
    interleaved = interleave_blocks(weight, 128)
    assert interleaved.shape == (9, 4, weight.shape[1] // 4 * 8) and interleaved.dtype == torch.uint8
    assert interleaved.numel() == weight.numel()  # the same bytes, rearranged
    result = block_linear(inputs, interleaved, bias)
    assert result.shape == (2, rows, 72) and result.dtype == torch.float32
    torch.testing.assert_close(result.double(), expected + bias.double(), rtol=1e-5, atol=1e-4)
    # ... and within int8 rounding of the float32 product.
    floats = block_linear(inputs, weight, bias)
    assert float((result - floats).abs().max() / floats.abs().max()) < 0.02


def test_interleaving_refuses_what_it_cannot_group() -> None:
    weight = quantize_blocks(torch.randn(70, 64), "q4_1")
    with pytest.raises(ValueError, match="multiple of 8, got \\(70, 40\\)"):
        interleave_blocks(weight, 64)
    with pytest.raises(ValueError, match="not Q4_1 or Q8_0 blocks of 96 inputs"):
        interleave_blocks(quantize_blocks(torch.randn(8, 64), "q4_1"), 96)
    interleaved = interleave_blocks(quantize_blocks(torch.randn(8, 64), "q8_0"), 64)
    with pytest.raises(RuntimeError, match="2 blocks per row, the inputs 96"):
        block_linear(torch.randn(1, 96), interleaved, None)


def test_int8_activations_interleave_every_projection_once(gguf_model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(gguf_model_dir)
    source = gguf_source(gguf_model_dir)
    assert source is not None
    blocks = load_gguf_blocks(source, config)
    size, head = blocks.nbytes, blocks.head
    assert not blocks.int8_activations
    blocks.use_int8_activations()
    blocks.use_int8_activations()  # a second call changes nothing
    assert blocks.int8_activations and blocks.nbytes == size and blocks.head is head
    assert all(layer[name].dim() == 3 for layer in blocks.layers for name in ("qkv", "o", "gate_up", "down"))


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 builds")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])  # AVX2, and the baseline's scalar fallback
def test_portable_builds_compute_the_same_block_products(march: str) -> None:
    module = decode_kernels._build_and_load(march)
    assert module is not None
    generator = torch.Generator().manual_seed(7)
    for kind in ("q8_0", "q4_1"):
        weight = quantize_blocks(torch.randn(40, 96, generator=generator), kind)
        inputs = torch.randn(11, 96, generator=generator)
        for layout in (weight, interleave_blocks(weight, 96)):
            expected = block_linear(inputs, layout, None)
            result = module.block_linear(inputs, layout, None)
            torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)


def test_bad_block_tensors_are_refused() -> None:
    weight = quantize_blocks(torch.randn(4, 64), "q8_0")
    with pytest.raises(RuntimeError, match="neither Q4_1 nor Q8_0"):
        block_linear(torch.randn(1, 96), weight, None)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        block_linear(torch.randn(1, 40), weight, None)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_blocks(torch.randn(4, 40), "q8_0")


def test_gguf_blocks_are_exactly_the_converted_float32_weights(gguf_model_dir: Path) -> None:
    source = gguf_source(gguf_model_dir)
    assert source is not None and source.name == "tiny.Q4_1.gguf"
    config = AutoConfig.from_pretrained(gguf_model_dir)
    blocks = load_gguf_blocks(source, config)
    assert blocks.exact and blocks.kinds == {"q4_1": 7 * config.num_hidden_layers, "q8_0": 1}
    model = AutoModelForCausalLM.from_pretrained(gguf_model_dir, dtype=torch.float32)
    hidden = config.hidden_size
    for layer, block in zip(model.model.layers, blocks.layers, strict=True):
        attention, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
        assert torch.equal(dequantize_blocks(block["qkv"], hidden), qkv)  # Q and K rows back in transformers' order
        assert torch.equal(dequantize_blocks(block["o"], hidden), attention.o_proj.weight)
        assert torch.equal(
            dequantize_blocks(block["gate_up"], hidden), torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        )
        assert torch.equal(dequantize_blocks(block["down"], config.intermediate_size), mlp.down_proj.weight)
        assert torch.equal(block["norm_attention"], layer.input_layernorm.weight)
    assert torch.equal(dequantize_blocks(blocks.embedding, hidden), model.model.embed_tokens.weight)
    assert torch.equal(blocks.final_norm, model.model.norm.weight)


def _greedy(engine: TransformersEngine, prompts: List[List[int]]) -> List[Any]:
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=True)
    return [engine.generate_sync(prompt, params, timeout=300).choices[0] for prompt in prompts]


def test_serving_the_gguf_blocks_computes_what_the_float32_model_computes(gguf_model_dir: Path) -> None:
    blocks = TransformersEngine(gguf_model_dir, dtype="float32", quantization="auto", max_batch_size=4)
    floats = TransformersEngine(gguf_model_dir, dtype="float32", quantization="none", max_batch_size=4)
    blocks.start()
    floats.start()
    try:
        assert blocks.blocks is not None and blocks.blocks.exact and floats.blocks is None
        assert isinstance(blocks.model, BlockModel)  # no float weights, no transformers model: the config alone
        prompts = [blocks.encode(text) for text in ("hello", "a longer prompt with more words", "x")]
        for mine, theirs in zip(_greedy(blocks, prompts), _greedy(floats, prompts), strict=True):
            assert mine.token_ids == theirs.token_ids
            np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-4)
    finally:
        blocks.stop()
        floats.stop()


def test_a_block_model_is_read_from_the_directory_as_transformers_reads_it(gguf_model_dir: Path) -> None:
    """The config fields, the rotary embedding and the tokenizer of a BlockModel are transformers' own."""
    import json

    from agentbolt.serving.fast_forward import _ConfigRotary
    from agentbolt.serving.transformers_engine import _block_model_tokenizer

    light = BlockModel.from_directory(gguf_model_dir)
    assert light is not None
    config = AutoConfig.from_pretrained(gguf_model_dir)
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        assert getattr(light.config, key) == getattr(config, key)
    assert light.config.rms_norm_eps == config.rms_norm_eps and light.config.model_type == config.model_type

    model = AutoModelForCausalLM.from_config(config)
    hidden = torch.zeros(2, 5, config.hidden_size)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 500, 4000]])
    head_dim = config.hidden_size // config.num_attention_heads
    for theirs, ours in zip(
        model.model.rotary_emb(hidden, positions), _ConfigRotary(light.config, head_dim)(hidden, positions), strict=True
    ):
        assert torch.equal(theirs, ours)

    tokenizer, reference = _block_model_tokenizer(gguf_model_dir), AutoTokenizer.from_pretrained(gguf_model_dir)
    assert type(tokenizer) is type(reference)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "caf\u00e9 <b> 12 + 30?"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == reference.apply_chat_template(
        messages, add_generation_prompt=True
    )
    assert tokenizer("a b  c\n").input_ids == reference("a b  c\n").input_ids
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (reference.eos_token_id, reference.pad_token_id)

    # A config that leaves a field to transformers' defaults, or uses another rotary type, is not read by hand.
    stated = json.loads((gguf_model_dir / "config.json").read_text())
    for change in ({"rms_norm_eps": None}, {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}):
        edited = gguf_model_dir.parent / f"edited-{len(change)}-{next(iter(change))}"
        shutil.copytree(gguf_model_dir, edited)
        fields = {**stated, **change}
        (edited / "config.json").write_text(json.dumps({k: v for k, v in fields.items() if v is not None}))
        assert BlockModel.from_directory(edited) is None


def test_a_config_transformers_must_read_is_served_on_a_model_skeleton(gguf_model_dir: Path, tmp_path: Path) -> None:
    import json

    directory = tmp_path / "model"
    shutil.copytree(gguf_model_dir, directory)
    stated = json.loads((directory / "config.json").read_text())
    del stated[
        "max_position_embeddings"
    ]  # transformers fills in its default (2048, as stated); BlockModel does not guess
    (directory / "config.json").write_text(json.dumps(stated))
    skeleton = TransformersEngine(directory, dtype="float32", quantization="auto", max_batch_size=2)
    light = TransformersEngine(gguf_model_dir, dtype="float32", quantization="auto", max_batch_size=2)
    skeleton.start()
    light.start()
    try:
        assert not isinstance(skeleton.model, BlockModel) and skeleton.blocks is not None
        assert next(skeleton.model.parameters()).device.type == "meta"  # the float weights were never loaded
        prompts = [light.encode(text) for text in ("hello", "a longer prompt")]
        for mine, theirs in zip(_greedy(skeleton, prompts), _greedy(light, prompts), strict=True):
            assert mine.token_ids == theirs.token_ids and mine.logprobs == theirs.logprobs
    finally:
        skeleton.stop()
        light.stop()


def test_serving_a_block_model_imports_no_transformers_model_code(gguf_model_dir: Path) -> None:
    """Not even a transformers config: in transformers 5 that alone imports most of the library (tens of MB)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from agentbolt.serving.params import SamplingParams\n"
        "from agentbolt.serving.transformers_engine import TransformersEngine\n"
        f"engine = TransformersEngine({str(gguf_model_dir)!r}, dtype='float32', quantization='auto')\n"
        "engine.start()\n"
        "prompt = engine.encode_chat([{'role': 'user', 'content': 'hi'}])\n"
        "engine.generate_sync(prompt, SamplingParams(max_tokens=3, temperature=0), timeout=120)\n"
        "engine.stop()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('transformers.modeling_utils', "
        "'transformers.configuration_utils', 'accelerate'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_quantizing_at_load_stays_close_to_the_float_logits(kernel_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 99, 3, 42, 7, 250, 12]])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    mask = torch.ones_like(ids)
    gaps = {}
    with torch.inference_mode():
        reference = FastForward(model)(ids, positions, mask, KVCache())
        for kind in ("q8_0", "q4_1"):
            quantized = FastForward(model, blocks=quantize_model(model, kind))(ids, positions, mask, KVCache())
            gaps[kind] = float((quantized - reference).abs().mean() / reference.std())
    # The tiny random model amplifies weight errors far more than a trained one (initializer range 0.5).
    assert gaps["q8_0"] < 0.1 and gaps["q8_0"] < gaps["q4_1"] < 0.5, gaps


def _block_model(gguf_model_dir: Path) -> Tuple[Any, Any, Path]:
    """The config, a ``meta``-device skeleton and the GGUF file of the converted tiny model."""
    config = AutoConfig.from_pretrained(gguf_model_dir)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    source = gguf_source(gguf_model_dir)
    assert source is not None
    return config, skeleton, source


def test_int8_activations_stay_close_to_the_exact_blocks(gguf_model_dir: Path) -> None:
    config, skeleton, source = _block_model(gguf_model_dir)
    ids = torch.tensor([[5, 17, 99, 3, 42, 7, 250, 12]])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    mask = torch.ones_like(ids)
    exact = load_gguf_blocks(source, config)
    approximate = load_gguf_blocks(source, config)
    approximate.use_int8_activations()
    with torch.inference_mode():
        reference = FastForward(skeleton, blocks=exact)(ids, positions, mask, KVCache())
        logits = FastForward(skeleton, blocks=approximate)(ids, positions, mask, KVCache())
    gap = float((logits - reference).abs().mean() / reference.std())
    # Below what quantizing the weights to q8_0 moves the same tiny model's logits (the test above: < 0.1).
    assert 0 < gap < 0.05, gap


def test_int8_activations_keep_float16_states_and_decode_like_the_python_path(gguf_model_dir: Path) -> None:
    config, skeleton, source = _block_model(gguf_model_dir)
    blocks = load_gguf_blocks(source, config)
    blocks.use_int8_activations()
    fused, python = FastForward(skeleton, blocks=blocks), FastForward(skeleton, blocks=blocks, kernels=False)
    assert fused.uses_kernels and not python.uses_kernels
    assert fused.cache_dtype == python.cache_dtype == torch.float16
    assert FastForward(skeleton, blocks=load_gguf_blocks(source, config)).cache_dtype == torch.float32
    runs, caches = [], []
    with torch.inference_mode():
        for forward in (fused, python):
            cache = KVCache()
            mask = torch.ones(1, 4, dtype=torch.long)
            logits = [forward(torch.tensor([[5, 17, 99, 3]]), torch.arange(4).unsqueeze(0), mask, cache)]
            for step, token in enumerate([7, 250, 12, 42]):  # the same tokens for both: teacher forcing
                mask = torch.ones(1, 5 + step, dtype=torch.long)
                logits.append(forward(torch.tensor([[token]]), torch.tensor([[4 + step]]), mask, cache))
            runs.append(logits)
            caches.append(cache)
    assert all(keys.dtype == torch.float16 for cache in caches for keys in cache.keys + cache.values)
    # The two paths sum in different orders, and an input a rounding away from an int8 step can land on either
    # side of it: they agree within that noise (the tiny random model amplifies it), far inside the int8 gap.
    for mine, other in zip(*runs, strict=True):
        assert float((mine - other).abs().mean() / other.std()) < 0.01


def test_an_engine_with_int8_activations_serves_and_says_so(gguf_model_dir: Path, kernel_model_dir: Path) -> None:
    engine = TransformersEngine(gguf_model_dir, quantization="auto", int8_activations=True, max_batch_size=4)
    engine.start()
    try:
        assert engine.blocks is not None and engine.blocks.int8_activations
        assert "int8 activations" in engine.blocks.description
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=3)
        choices = engine.generate_sync(engine.encode("hello there"), params, timeout=300).choices
        assert [len(choice.token_ids) for choice in choices] == [6, 6, 6]
        assert choices[0].token_ids == choices[1].token_ids == choices[2].token_ids  # batched rows agree
    finally:
        engine.stop()
    with pytest.raises(EngineError, match="int8 activations need block weights"):
        TransformersEngine(gguf_model_dir, quantization="none", int8_activations=True)
    without_gguf = TransformersEngine(kernel_model_dir, quantization="auto", int8_activations=True)
    with pytest.raises(EngineError, match=r"with int8 activations is not possible here: .* not converted from a GGUF"):
        without_gguf.start()
    without_gguf.stop()


def test_auto_serves_float_weights_without_a_gguf_and_explicit_formats_quantize(kernel_model_dir: Path) -> None:
    auto = TransformersEngine(kernel_model_dir, dtype="float32", quantization="auto")
    auto.start()
    try:
        assert auto.blocks is None
    finally:
        auto.stop()
    quantized = TransformersEngine(kernel_model_dir, quantization="q8_0")
    quantized.start()
    try:
        assert quantized.blocks is not None and not quantized.blocks.exact
        assert quantized.generate_sync(quantized.encode("hi"), SamplingParams(max_tokens=4)).choices[0].token_ids
    finally:
        quantized.stop()


def test_block_weights_are_never_trained_on(gguf_model_dir: Path, tmp_path: Path) -> None:
    engine = TransformersEngine(gguf_model_dir, quantization="auto")
    engine.start()
    try:
        with pytest.raises(EngineError, match="quantization='none'"), engine.weights_update():
            pass
        with pytest.raises(EngineError, match="need the float weights"):
            engine.load_state_dict({})
        with pytest.raises(EngineError, match="LoRA adapters need the float weights"):
            engine.load_adapter("sql", tmp_path)
    finally:
        engine.stop()


def test_a_broken_gguf_file_is_a_clear_error(gguf_model_dir: Path, tmp_path: Path) -> None:
    source = gguf_source(gguf_model_dir)
    assert source is not None
    config = AutoConfig.from_pretrained(gguf_model_dir)
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        load_gguf_blocks(not_gguf, config)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(source.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"truncated\.gguf is not a readable GGUF file"):
        load_gguf_blocks(truncated, config)


def test_unknown_quantization_is_refused(kernel_model_dir: Path) -> None:
    with pytest.raises(EngineError, match="unknown quantization 'int3'"):
        TransformersEngine(kernel_model_dir, quantization="int3")
