"""The fused C++ decoding kernels: each kernel against the PyTorch operators it replaces (bit for bit where the
rounding is the same, to accumulation order in attention), whole decoding steps against the Python path and
transformers (Llama and Qwen2 with projection biases), input checks, and the fallbacks when they cannot be built."""

from __future__ import annotations

import logging
import platform
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agentbolt.serving import decode_kernels
from agentbolt.serving.decode_kernels import load_decode_kernels
from agentbolt.serving.fast_forward import FastForward, _rms_norm, _rotate
from agentbolt.serving.kv_cache import KVCache
from agentbolt.serving.params import SamplingParams
from agentbolt.serving.transformers_engine import TransformersEngine

DTYPES = [torch.float32, torch.bfloat16]


PORTABLE_BUILDS = [
    pytest.param(march, marks=[pytest.mark.slow, pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64")])
    for march in ("x86-64-v3", "x86-64")  # AVX2, and the baseline with ATen's scalar vector fallback
]


@pytest.fixture(scope="module")
def native_kernels() -> Any:
    """The kernels built for this CPU (what the engine uses)."""
    missing = decode_kernels._missing_build_tools()
    if missing is not None:
        pytest.skip(f"{missing}: the kernels cannot be built on this machine")
    module = load_decode_kernels()
    assert module is not None, "the build tools are present, so the decoding kernels must build"
    return module


@pytest.fixture(scope="module", params=["native", *PORTABLE_BUILDS])
def kernels(request: pytest.FixtureRequest, native_kernels: Any) -> Any:
    """The native kernels and, in the slow suite, the AVX2 and baseline x86-64 builds."""
    if request.param == "native":
        return native_kernels
    module = decode_kernels._build_and_load(request.param)
    assert module is not None and module.vector_width() == 8
    return module


def _fast_forward(model: Any, kernels: Any) -> FastForward:
    """A fast forward decoding through ``kernels`` (the test's build, not necessarily the native one)."""
    forward = FastForward(model)
    assert forward.uses_kernels
    forward._kernels = kernels
    return forward


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_rounds_like_the_python_path(kernels: Any, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    hidden, residual = torch.randn(5, 96).to(dtype) * 3, torch.randn(5, 96).to(dtype)
    weight = torch.randn(96).to(dtype)
    # bfloat16 results round at the same points as the Python path; float32 ones differ in summation order only.
    same = torch.equal if dtype == torch.bfloat16 else lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    normed, summed = kernels.add_rms_norm(hidden, residual, weight, 1e-5)
    assert torch.equal(summed, hidden + residual)
    assert same(normed, _rms_norm(hidden + residual, weight, 1e-5))
    normed, unchanged = kernels.add_rms_norm(hidden, None, weight, 1e-6)
    assert torch.equal(unchanged, hidden)
    assert same(normed, _rms_norm(hidden, weight, 1e-6))


def _rotary(batch: int, head_dim: int, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    positions = torch.randint(0, 300, (batch, 1)).float()
    frequencies = positions / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.cat([frequencies, frequencies], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_kv_rotates_like_the_python_path_and_writes_the_cache(kernels: Any, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    batch, heads, kv_heads, head_dim = 3, 6, 2, 16
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * head_dim).to(dtype)
    cos, sin = _rotary(batch, head_dim, dtype)
    # A cache whose leading columns were dropped: a view with the strides of a larger buffer.
    keys = torch.zeros(batch, kv_heads, 12, head_dim, dtype=dtype)[:, :, 2:]
    values = torch.zeros(batch, kv_heads, 12, head_dim, dtype=dtype)[:, :, 2:]
    query = kernels.rotary_kv(qkv, cos, sin, keys, values, 4, heads, kv_heads)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    assert torch.equal(query, _rotate(q.view(batch, heads, head_dim), cos[:, None], sin[:, None]))
    assert torch.equal(keys[:, :, 4], _rotate(k.view(batch, kv_heads, head_dim), cos[:, None], sin[:, None]))
    assert torch.equal(values[:, :, 4], v.view(batch, kv_heads, head_dim))
    assert keys[:, :, :4].eq(0).all() and values[:, :, 5:].eq(0).all()  # only the column asked for is written


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_matches_sdpa_with_padding_and_grouped_heads(kernels: Any, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    batch, heads, kv_heads, head_dim, length = 4, 6, 2, 32, 37
    query = torch.randn(batch, heads, head_dim).to(dtype)
    keys = torch.randn(batch, kv_heads, 50, head_dim).to(dtype)[:, :, 3:]  # strided view, room past `length`
    values = torch.randn(batch, kv_heads, 50, head_dim).to(dtype)[:, :, 3:]
    mask = torch.ones(batch, length + 5, dtype=torch.long)  # wider than `length`: only the first columns count
    mask[1, :10] = 0  # left padding of different widths
    mask[3, :36] = 0  # a row that sees only its newest position
    ours = kernels.decode_attention(query, keys, values, mask, length)
    expected = F.scaled_dot_product_attention(
        query.unsqueeze(2).float(),
        keys[:, :, :length].float(),
        values[:, :, :length].float(),
        attn_mask=mask[:, None, None, :length].bool(),
        enable_gqa=True,
    ).reshape(batch, heads * head_dim)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.float(), expected, atol=tolerance)
    assert torch.allclose(ours[3].float(), values[3, :, length - 1].float().repeat_interleave(3, 0).flatten())


def test_float16_caches_take_the_float32_states_rounded_once(kernels: Any) -> None:
    torch.manual_seed(3)
    batch, heads, kv_heads, head_dim, length = 3, 6, 2, 32, 9
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * head_dim) * 4
    cos, sin = _rotary(batch, head_dim, torch.float32)
    keys = torch.zeros(batch, kv_heads, 12, head_dim, dtype=torch.float16)
    values = torch.zeros(batch, kv_heads, 12, head_dim, dtype=torch.float16)
    keys[:, :, : length - 1] = torch.randn(batch, kv_heads, length - 1, head_dim).half()
    values[:, :, : length - 1] = torch.randn(batch, kv_heads, length - 1, head_dim).half()
    query = kernels.rotary_kv(qkv, cos, sin, keys, values, length - 1, heads, kv_heads)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    assert query.dtype == torch.float32
    assert torch.equal(query, _rotate(q.view(batch, heads, head_dim), cos[:, None], sin[:, None]))
    rotated = _rotate(k.view(batch, kv_heads, head_dim), cos[:, None], sin[:, None])
    assert torch.equal(keys[:, :, length - 1], rotated.half())
    assert torch.equal(values[:, :, length - 1], v.view(batch, kv_heads, head_dim).half())
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :4] = 0
    ours = kernels.decode_attention(query, keys, values, mask, length)
    expected = F.scaled_dot_product_attention(
        query.unsqueeze(2),
        keys[:, :, :length].float(),
        values[:, :, :length].float(),
        attn_mask=mask[:, None, None, :].bool(),
        enable_gqa=True,
    ).reshape(batch, heads * head_dim)
    assert ours.dtype == torch.float32 and torch.allclose(ours, expected, atol=1e-5)


def test_kernels_reject_bad_inputs_with_clear_errors(kernels: Any) -> None:
    hidden = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernels.add_rms_norm(hidden.half(), None, torch.ones(8).half(), 1e-5)
    with pytest.raises(RuntimeError, match="weight must match"):
        kernels.add_rms_norm(hidden, None, torch.ones(7), 1e-5)
    keys = torch.zeros(2, 1, 4, 16)
    qkv, cos = torch.randn(2, 3 * 16), torch.randn(2, 16)
    with pytest.raises(RuntimeError, match="column outside the cache"):
        kernels.rotary_kv(qkv, cos, cos, keys, keys.clone(), 4, 1, 1)
    with pytest.raises(RuntimeError, match="qkv must be"):
        kernels.rotary_kv(torch.randn(2, 40), cos, cos, keys, keys.clone(), 0, 1, 1)
    query = torch.randn(2, 1, 16)
    with pytest.raises(RuntimeError, match="mask must be int64"):
        kernels.decode_attention(query, keys, keys, torch.ones(2, 4, dtype=torch.int32), 4)
    with pytest.raises(RuntimeError, match="length outside the cache"):
        kernels.decode_attention(query, keys, keys, torch.ones(2, 9, dtype=torch.long), 9)
    with pytest.raises(RuntimeError, match="caches must be"):
        kernels.decode_attention(query, keys, keys[:, :, :3], torch.ones(2, 4, dtype=torch.long), 3)
    ones = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(RuntimeError, match="float16 caches go with float32 activations"):
        kernels.decode_attention(query.bfloat16(), keys.half(), keys.half(), ones, 4)
    with pytest.raises(RuntimeError, match="the activations' dtype, or float16"):
        kernels.rotary_kv(qkv, cos, cos, keys.bfloat16(), keys.bfloat16(), 0, 1, 1)
    with pytest.raises(RuntimeError, match="key and value caches must share a dtype"):
        kernels.decode_attention(query, keys.half(), keys, ones, 4)


def _sequences(params: SamplingParams, count: int, seed: int) -> List[Any]:
    from agentbolt.serving.transformers_engine import _Request, _Sequence

    request = _Request([1], params, None, emit=lambda deltas: None, fail=lambda exc: None)
    return [_Sequence(request, i, 8, torch.Generator().manual_seed(seed + i)) for i in range(count)]


def test_sampling_kernel_picks_the_tokens_of_the_python_sampler(kernels: Any) -> None:
    torch.manual_seed(5)
    logits = torch.randn(64, 1000) * 4  # 4 blocks of 256 and a partial one
    logits[:, 700:] = -1e9  # tokens the tempered distribution never picks (zero weight after exp)
    for temperature in (0.0, 0.3, 0.7, 1.5):
        params = SamplingParams(temperature=temperature)
        fused = TransformersEngine._sample(_sequences(params, 64, seed=11), logits, kernels)
        python = TransformersEngine._sample(_sequences(params, 64, seed=11), logits)
        assert fused == python
        assert max(fused) < 700
    # Greedy rows take the first of equal maxima, like argmax.
    tied = torch.zeros(2, 600)
    tied[:, [5, 300]] = 1.0
    assert TransformersEngine._sample(_sequences(SamplingParams(temperature=0.0), 2, seed=0), tied, kernels) == [5, 5]


def test_sampling_kernel_follows_the_tempered_distribution(kernels: Any) -> None:
    probabilities = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = (torch.log(probabilities) * 2).expand(4000, 5).contiguous()  # temperature 2 undoes the doubling
    picks = TransformersEngine._sample(_sequences(SamplingParams(temperature=2.0), 4000, seed=3), logits, kernels)
    frequencies = torch.bincount(torch.tensor(picks), minlength=5).float() / 4000
    assert torch.allclose(frequencies, probabilities, atol=0.03)


def test_sampling_kernel_rejects_bad_inputs(kernels: Any) -> None:
    with pytest.raises(RuntimeError, match="logits must be float32"):
        kernels.sample_tokens(torch.zeros(2, 4, dtype=torch.bfloat16), torch.ones(2), torch.zeros(2))
    with pytest.raises(RuntimeError, match="temperatures and uniforms"):
        kernels.sample_tokens(torch.zeros(2, 4), torch.ones(3), torch.zeros(2))


def _decode_steps(forward: Any, steps: int = 12) -> List[torch.Tensor]:
    """Prefill two left-padded rows, then greedy-decode ``steps`` tokens; return every step's logits."""
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = KVCache()
    outputs = [forward(ids, positions, mask, cache)]
    next_positions = positions[:, -1:] + 1
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        outputs.append(forward(outputs[-1].argmax(-1, keepdim=True), next_positions, mask, cache))
        next_positions = next_positions + 1
    return outputs


def _transformers_steps(model: Any, steps: int = 12) -> List[torch.Tensor]:
    """The same decoding as :func:`_decode_steps` through the transformers forward."""
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    outputs: List[torch.Tensor] = []
    for _ in range(steps + 1):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        outputs.append(model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1])
        ids = torch.cat([ids, outputs[-1].argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    return outputs


def test_decoding_steps_match_the_python_path_and_transformers(kernels: Any, kernel_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=torch.float32).eval()
    fused, python = _fast_forward(model, kernels), FastForward(model, kernels=False)
    assert not python.uses_kernels
    with torch.inference_mode():
        ours, theirs, reference = _decode_steps(fused), _decode_steps(python), _transformers_steps(model)
    # Logits of magnitude ~13: the three forwards differ in float32 summation order only (up to ~1e-5 relative).
    for mine, other, expected in zip(ours, theirs, reference, strict=True):
        assert torch.allclose(mine, other, atol=2e-4)
        assert torch.allclose(mine, expected, atol=2e-4)
        assert torch.equal(mine.argmax(-1), expected.argmax(-1))


def test_decoding_steps_in_bfloat16_stay_with_the_python_path(kernels: Any, kernel_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        ours, theirs = _decode_steps(_fast_forward(model, kernels)), _decode_steps(FastForward(model, kernels=False))
    for mine, other in zip(ours, theirs, strict=True):
        assert (mine.float() - other.float()).abs().max() <= 2e-2 * other.float().abs().max()
        assert torch.equal(mine.argmax(-1), other.argmax(-1))


def test_projection_biases_of_qwen2_models(kernels: Any) -> None:
    torch.manual_seed(4)
    config = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # non-zero biases, so that leaving them out would show
            for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                projection.bias.normal_()
    fused = _fast_forward(model, kernels)
    assert fused._layers[0]["qkv_bias"] is not None
    with torch.inference_mode():
        for mine, expected in zip(_decode_steps(fused), _transformers_steps(model), strict=True):
            assert torch.allclose(mine, expected, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lora_adapters_decode_like_peft(kernels: Any, kernel_model_dir: Path, dtype: torch.dtype) -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    base = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=dtype).eval()
    targets = ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]  # a partly adapted q/k/v and gate/up
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    model.eval()
    fused = _fast_forward(model, kernels)
    fused.adapter = "default"
    fused.refresh()
    assert fused._kernel_adapters and fused._layers[0]["qkv_lora"] is not None
    with torch.inference_mode():
        ours, theirs = _decode_steps(fused), _decode_steps(FastForward(model, "default", kernels=False))
        reference = _transformers_steps(model)
    for mine, other, expected in zip(ours, theirs, reference, strict=True):
        if dtype == torch.float32:  # summation order only
            assert torch.allclose(mine, other, atol=2e-4) and torch.allclose(mine, expected, atol=2e-4)
        else:  # bfloat16 roundings flipped here and there (merging the adapter instead moves the mean ~50x more)
            scale = expected.float().abs().max()
            assert (mine.float() - other.float()).abs().mean() <= 1e-2 * scale
            assert (mine.float() - expected.float()).abs().mean() <= 1e-2 * scale
        assert torch.equal(mine.argmax(-1), expected.argmax(-1))


def test_engine_decodes_through_the_kernels_with_continuous_batching(
    native_kernels: Any, kernel_model_dir: Path
) -> None:
    fused = TransformersEngine(kernel_model_dir, dtype="float32", max_batch_size=4, served_name="fused")
    generic = TransformersEngine(kernel_model_dir, dtype="float32", max_batch_size=4, fast_forward=False)
    fused.start()
    generic.start()
    try:
        fast = fused._fast_forward_for_step()
        assert fast is not None and fast.uses_kernels
        prompts = [
            fused.encode_chat([{"role": "user", "content": text}]) for text in ("a", "longer prompt here", "b c")
        ]
        params = [SamplingParams(max_tokens=5 + 4 * i, temperature=0, logprobs=True, ignore_eos=True) for i in range(3)]

        def run(engine: TransformersEngine) -> List[Any]:
            import asyncio

            async def together() -> List[Any]:
                return list(
                    await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
                )

            return asyncio.run(together())

        for mine, reference in zip(run(fused), run(generic), strict=True):
            assert mine.choices[0].token_ids == reference.choices[0].token_ids
            assert torch.allclose(
                torch.tensor(mine.choices[0].logprobs), torch.tensor(reference.choices[0].logprobs), atol=1e-4
            )
    finally:
        fused.stop()
        generic.stop()


def _disabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOLT_DECODE_KERNELS", "0")


def _no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-agentbolt")


def _no_python_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    paths = {**sysconfig.get_paths(), "include": str(tmp_path / "no-headers")}
    monkeypatch.setattr(sysconfig, "get_paths", lambda: paths)


def _needs_build_tools() -> None:
    missing = decode_kernels._missing_build_tools()
    if missing is not None:
        pytest.skip(f"{missing}: no build is attempted on this machine")


def _broken_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_build_tools()
    broken = tmp_path / "decode_kernels.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(decode_kernels, "_SOURCE", broken)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _cache_directory_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_build_tools()
    not_a_directory = tmp_path / "cache"
    not_a_directory.write_text("a file where the cache directory should be\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_directory))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (_disabled, "Decoding kernels disabled by AGENTBOLT_DECODE_KERNELS"),
        (_no_compiler, "No C++ compiler (no-such-compiler-agentbolt) found"),
        (_no_python_headers, "No Python headers"),
        (_broken_source, "Building the decoding kernels failed"),
        (_cache_directory_is_a_file, "Building the decoding kernels failed"),
    ],
)
def test_without_a_usable_build_decoding_stays_in_python(
    setup: Any, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    setup(tmp_path, monkeypatch)
    with caplog.at_level(logging.INFO, logger="agentbolt.serving.decode_kernels"):
        assert decode_kernels._build_and_load() is None
    assert message in caplog.text


def _native_build_directory() -> Path:
    """Where this machine's native build lives (loading it again from there compiles nothing: torch rebuilds an
    extension it has loaded when its build directory changes, so these tests use the real one)."""
    key = decode_kernels._build_key([*decode_kernels._CFLAGS, "-march=native"])
    return decode_kernels.kernel_cache_dir() / key


def test_a_lock_file_left_by_a_killed_build_does_not_block_loading(native_kernels: Any) -> None:
    directory = _native_build_directory()
    (directory / "lock").touch()  # torch's build lock, as a build killed mid-way leaves it
    module = decode_kernels._build_and_load()
    assert module is not None and module.vector_width() > 0
    assert not (directory / "lock").exists()


def test_a_build_another_process_holds_for_too_long_leaves_decoding_in_python(
    native_kernels: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import fcntl

    monkeypatch.setattr(decode_kernels, "_BUILD_LOCK_TIMEOUT", 0.5)
    with open(_native_build_directory() / "build.flock", "a+b") as other_builder:
        fcntl.flock(other_builder.fileno(), fcntl.LOCK_EX)  # a second open file: flock conflicts as across processes
        with caplog.at_level(logging.WARNING, logger="agentbolt.serving.decode_kernels"):
            assert decode_kernels._build_and_load() is None
    assert "Another process has been building the decoding kernels" in caplog.text
    assert decode_kernels._build_and_load() is not None  # released: the next load proceeds


def test_two_torch_installs_build_into_separate_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    flags = [*decode_kernels._CFLAGS, "-march=native"]
    here = decode_kernels._build_key(flags)
    monkeypatch.setattr(torch, "__file__", "/elsewhere/venv/lib/python3.11/site-packages/torch/__init__.py")
    # Another virtual environment's build names other header and library paths: it must not share (and rebuild)
    # this one's directory, or each would wait on the other's build lock.
    assert decode_kernels._build_key(flags) != here
