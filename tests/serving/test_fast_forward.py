"""The lean CPU forward and the engine's key/value cache: same numbers as the transformers forward, through
continuous batching (rows joining, leaving and repeated for n choices), weight changes and dtype."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, List, Tuple

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

from agentbolt.serving.fast_forward import FastForward
from agentbolt.serving.kv_cache import KVCache
from agentbolt.serving.params import SamplingParams
from agentbolt.serving.transformers_engine import TransformersEngine


def _states(batch: int, length: int, fill: float) -> torch.Tensor:
    return torch.full((batch, 2, length, 4), fill)


def test_kv_cache_append_grows_and_keeps_contents() -> None:
    cache = KVCache()
    keys, values = cache.append(0, _states(2, 3, 1.0), _states(2, 3, -1.0))
    assert keys.shape == (2, 2, 3, 4) and cache.length == 3
    for step in range(200):  # far past the first capacity: buffers are reallocated several times
        keys, values = cache.append(0, _states(2, 1, float(step)), _states(2, 1, -float(step)))
    assert keys.shape == (2, 2, 203, 4) and cache.length == 203
    assert torch.equal(keys[:, :, :3], _states(2, 3, 1.0))
    assert torch.equal(keys[0, 0, 3:, 0], torch.arange(200, dtype=torch.float32))
    assert torch.equal(values, -keys)


def test_kv_cache_select_drop_and_merge() -> None:
    cache = KVCache()
    rows = torch.arange(3, dtype=torch.float32).view(3, 1, 1, 1).expand(3, 2, 5, 4).clone()
    cache.append(0, rows, rows)
    cache.select_rows(torch.tensor([2, 0, 0]))
    assert cache.keys[0] is not None
    assert cache.keys[0][:, 0, 0, 0].tolist() == [2.0, 0.0, 0.0]
    cache.drop_leading(2)
    assert cache.length == 3
    keys, _ = cache.append(0, _states(3, 1, 9.0), _states(3, 1, 9.0))
    assert keys.shape == (3, 2, 4, 4) and keys[:, :, -1].eq(9.0).all()

    newcomer = KVCache()
    newcomer.append(0, _states(1, 2, 7.0), _states(1, 2, 7.0))
    cache.merge(newcomer)  # 3 rows of length 4 + 1 row of length 2: the new row is left padded with zeros
    assert cache.length == 4 and cache.keys[0] is not None
    merged = cache.keys[0][:, :, :4]
    assert merged.shape == (4, 2, 4, 4)
    assert merged[3, :, :2].eq(0).all() and merged[3, :, 2:].eq(7.0).all()
    assert torch.equal(merged[:3], keys)


def test_kv_cache_growth_stops_at_the_planned_length() -> None:
    cache = KVCache()
    cache.append(0, _states(1, 100, 1.0), _states(1, 100, 1.0))  # a prefill: room for 64 more columns
    cache.planned_length = 180
    for _ in range(80):
        cache.append(0, _states(1, 1, 2.0), _states(1, 1, 2.0))
    assert cache.keys[0] is not None and cache.keys[0].shape[-2] == 180  # not the doubled 328
    cache.planned_length = 150  # a plan below what is filled never shrinks or refuses: the cache grows as needed
    keys, _ = cache.append(0, _states(1, 5, 3.0), _states(1, 5, 3.0))
    assert keys.shape[-2] == 185 and cache.keys[0].shape[-2] == 185
    assert keys[:, :, :100].eq(1.0).all() and keys[:, :, 100:180].eq(2.0).all() and keys[:, :, 180:].eq(3.0).all()


def test_engine_reserves_no_more_cache_than_its_sequences_can_fill(
    engine: TransformersEngine, monkeypatch: Any
) -> None:
    capacities: List[int] = []
    reserve = KVCache.reserve

    def recording(self: KVCache, layer: int, like: torch.Tensor, new: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        buffer_k, buffer_v, start = reserve(self, layer, like, new)
        capacities.append(buffer_k.shape[-2])
        return buffer_k, buffer_v, start

    monkeypatch.setattr(KVCache, "reserve", recording)
    prompt = engine.encode_chat([{"role": "user", "content": "count"}])
    out = engine.generate_sync(prompt, SamplingParams(max_tokens=150, temperature=0, ignore_eos=True))
    assert len(out.choices[0].token_ids) == 150
    # The last token is sampled, never fed: prompt + 149 columns are written, and the doubling stops there.
    assert capacities and max(capacities) == len(prompt) + 149


def _engines(model_dir: Path, dtype: str) -> Tuple[TransformersEngine, TransformersEngine]:
    fast = TransformersEngine(model_dir, dtype=dtype, max_batch_size=4, served_name="fast")
    slow = TransformersEngine(model_dir, dtype=dtype, max_batch_size=4, served_name="slow", fast_forward=False)
    fast.start()
    slow.start()
    return fast, slow


def _batched_run(engine: TransformersEngine, prompts: List[List[int]]) -> List[Any]:
    """A long request first, then requests of other lengths joining it while it decodes (merge and row drops)."""

    async def run() -> List[Any]:
        first = asyncio.ensure_future(
            engine.generate(prompts[0], SamplingParams(max_tokens=24, temperature=0, logprobs=True, ignore_eos=True))
        )
        await asyncio.sleep(0.05)
        others = [
            engine.generate(p, SamplingParams(max_tokens=6 + 3 * i, n=1 + i % 2, seed=i, logprobs=True))
            for i, p in enumerate(prompts[1:])
        ]
        return [await first, *await asyncio.gather(*others)]

    return asyncio.run(run())


def test_fast_forward_matches_transformers_through_continuous_batching(tiny_model_dir: Path) -> None:
    fast, slow = _engines(tiny_model_dir, "float32")
    try:
        assert fast._fast_forward_for_step() is not None and slow._fast_forward_for_step() is None
        texts = ["a", "a much longer prompt than the others here", "mid size", "x y z"]
        prompts = [fast.encode_chat([{"role": "user", "content": t}]) for t in texts]
        ours, theirs = _batched_run(fast, prompts), _batched_run(slow, prompts)
        for mine, reference in zip(ours, theirs, strict=True):
            for choice, expected in zip(mine.choices, reference.choices, strict=True):
                assert choice.token_ids == expected.token_ids
                assert torch.allclose(torch.tensor(choice.logprobs), torch.tensor(expected.logprobs), atol=1e-4)
    finally:
        fast.stop()
        slow.stop()


def test_fast_forward_bfloat16_stays_close_to_transformers(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    fast = FastForward.create(model)
    assert fast is not None
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        reference = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
        ours = fast(ids, positions, mask, KVCache()).float()
    # Same rounding as transformers (RMSNorm in float32): equal up to bf16 matmul blocking, not just close.
    assert (ours - reference).abs().max() <= 1e-2 * reference.abs().max()
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def test_logits_are_float32_products_of_the_bfloat16_model(tiny_model_dir: Path) -> None:
    from agentbolt.serving.logits import float32_logits

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    fast = FastForward.create(model)
    assert fast is not None
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        reference = float32_logits(model, 1, **inputs)[:, -1]
        rounded = model(**inputs).logits[:, -1]
        ours = fast(ids, positions, mask, KVCache())
    assert ours.dtype == reference.dtype == torch.float32
    assert torch.allclose(ours, reference, atol=1e-4)  # the same hidden states, projected in float32
    assert not torch.equal(reference.bfloat16().float(), reference)  # bfloat16 logits would have been rounded
    assert torch.allclose(rounded.float(), reference, atol=0.07)


def test_fast_forward_follows_weight_updates(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = TransformersEngine.from_model(model, tokenizer, served_name="shared")
    try:
        prompt = engine.encode_chat([{"role": "user", "content": "w"}])
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        before = engine.generate_sync(prompt, params).choices[0].token_ids
        assert engine._fast_forward_for_step() is not None
        with engine.weights_update() as live, torch.no_grad():
            live.lm_head.weight.zero_()  # fused copies must be rebuilt: every logit is 0, greedy picks token 0
        assert engine.generate_sync(prompt, params).choices[0].token_ids == [0] * 6
        engine.load_state_dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict())
        assert engine.generate_sync(prompt, params).choices[0].token_ids == before
    finally:
        engine.stop()


def test_models_the_fast_forward_does_not_cover(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16))
    assert "architecture 'gpt2'" in str(FastForward.unsupported_reason(gpt2))
    assert FastForward.create(gpt2) is None
    llama = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float16)
    assert "dtype" in str(FastForward.unsupported_reason(llama))

    def peft_llama(**lora: Any) -> Any:
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        return get_peft_model(base, LoraConfig(r=2, **lora))

    assert FastForward.unsupported_reason(peft_llama(target_modules=["q_proj", "down_proj"])) is None
    assert "not a LoRA projection" in str(FastForward.unsupported_reason(peft_llama(target_modules=["lm_head"])))
    assert "DoRA" in str(FastForward.unsupported_reason(peft_llama(target_modules=["q_proj"], use_dora=True)))
    merged = peft_llama(target_modules=["q_proj"])
    merged.merge_adapter()
    assert "merged" in str(FastForward.unsupported_reason(merged))


def test_lora_adapters_are_applied_like_peft(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    fast, slow = _engines(tiny_model_dir, "float32")
    try:
        for engine in (fast, slow):
            engine.load_adapter("tuned", tmp_path / "adapter")
        prompt = fast.encode_chat([{"role": "user", "content": "lora"}])
        params = SamplingParams(max_tokens=8, temperature=0, logprobs=True, ignore_eos=True)
        results = {}
        for name, engine in (("fast", fast), ("slow", slow)):
            results[name] = [engine.generate_sync(prompt, params, adapter=a).choices[0] for a in (None, "tuned")]
        assert set(fast._fast) == {None, "tuned"} and all(f is not None for f in fast._fast.values())
        for mine, reference in zip(results["fast"], results["slow"], strict=True):
            assert mine.token_ids == reference.token_ids
            assert torch.allclose(torch.tensor(mine.logprobs), torch.tensor(reference.logprobs), atol=1e-4)
        assert results["fast"][0].token_ids != results["fast"][1].token_ids  # the adapter changes the output
    finally:
        fast.stop()
        slow.stop()


def test_refresh_rebuilds_only_the_fused_weights_whose_sources_changed(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    plain, tuned = FastForward(model, None), FastForward(model, "default")
    before_plain = [dict(layer) for layer in plain._layers]
    before_tuned = [dict(layer) for layer in tuned._layers]
    ids = torch.tensor([[5, 6, 7]])
    positions = torch.arange(3).unsqueeze(0)
    mask = torch.ones(1, 3, dtype=torch.long)
    with torch.no_grad():
        model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].weight.add_(0.5)
        plain.refresh()
        tuned.refresh()
        with model.disable_adapter():
            expected_plain = model(input_ids=ids).logits[:, -1]
        expected_tuned = model(input_ids=ids).logits[:, -1]
        assert torch.allclose(plain(ids, positions, mask, KVCache()), expected_plain, atol=1e-4)
        assert torch.allclose(tuned(ids, positions, mask, KVCache()), expected_tuned, atol=1e-4)
    for forward, before in ((plain, before_plain), (tuned, before_tuned)):  # no base weight is copied again
        assert all(forward._layers[i][name] is before[i][name] for i in range(len(before)) for name in ("qkv", "o"))
    assert all(layer["qkv_lora"] is None for layer in plain._layers)
    assert tuned._layers[0]["qkv_lora"] is not before_tuned[0]["qkv_lora"]  # the updated adapter layer only
    assert all(tuned._layers[i]["qkv_lora"] is before_tuned[i]["qkv_lora"] for i in range(1, len(before_tuned)))
