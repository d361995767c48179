"""The transformers engine on a tiny random Llama: correctness of continuous batching, logprobs, stops, seeds,
weight updates and LoRA adapters."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, List

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentbolt.serving.params import ContextOverflowError, EngineError, SamplingParams
from agentbolt.serving.transformers_engine import TransformersEngine

GREEDY = SamplingParams(max_tokens=12, temperature=0)


def _prompt(engine: TransformersEngine, text: str) -> List[int]:
    return engine.encode_chat([{"role": "user", "content": text}])


def test_greedy_matches_transformers_generate(engine: TransformersEngine, tiny_model_dir: Path) -> None:
    prompt = _prompt(engine, "hello there")
    ours = engine.generate_sync(prompt, GREEDY).choices[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt) :]
    assert ours.token_ids == reference.tolist()
    assert ours.finish_reason == ("stop" if ours.token_ids[-1] == 2 else "length")


def test_concurrent_and_late_joining_requests_match_solo_runs(engine: TransformersEngine) -> None:
    prompts = [_prompt(engine, text) for text in ("a", "a much longer prompt than the others", "mid size", "x y")]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    solo = [engine.generate_sync(p, params).choices[0].token_ids for p in prompts]

    async def run() -> List[List[int]]:
        long_params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        first = engine.stream(prompts[0], long_params)
        head = await anext(first)  # the first request is running when the others arrive
        late = asyncio.gather(*(engine.generate(p, params) for p in prompts[1:]))
        tokens = [d.token_ids[0] for d in head]
        async for deltas in first:
            tokens += [d.token_ids[0] for d in deltas]
        return [tokens[:10]] + [out.choices[0].token_ids for out in await late]

    assert asyncio.run(run()) == solo


def test_more_requests_than_batch_slots_all_complete(engine: TransformersEngine) -> None:
    async def run() -> List[int]:
        outs = await asyncio.gather(
            *(engine.generate(_prompt(engine, str(i)), SamplingParams(max_tokens=5, n=2, seed=i)) for i in range(7))
        )
        return [len(c.token_ids) for out in outs for c in out.choices]

    lengths = asyncio.run(run())
    assert len(lengths) == 14 and all(1 <= n <= 5 for n in lengths)


def test_logprobs_are_untempered_log_softmax_of_the_model(engine: TransformersEngine) -> None:
    prompt = _prompt(engine, "logprobs")
    params = SamplingParams(max_tokens=8, temperature=0.7, seed=5, logprobs=True, top_logprobs=3, ignore_eos=True)
    out = engine.generate_sync(prompt, params).choices[0]
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + out.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    picked = expected.gather(1, torch.tensor(out.token_ids).unsqueeze(1)).squeeze(1)
    assert out.logprobs is not None and out.top_logprobs is not None
    assert torch.allclose(torch.tensor(out.logprobs), picked, atol=1e-4)
    for row, top in enumerate(out.top_logprobs):
        values = [lp for _, lp in top]
        assert len(top) == 3 and values == sorted(values, reverse=True)
        assert torch.allclose(torch.tensor(values), expected[row].topk(3).values, atol=1e-4)


def test_seed_reproduces_and_choices_differ(engine: TransformersEngine) -> None:
    prompt = _prompt(engine, "seeded")
    params = SamplingParams(max_tokens=16, n=3, seed=42, ignore_eos=True)
    a = engine.generate_sync(prompt, params)
    b = engine.generate_sync(prompt, params)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert len({tuple(c.token_ids) for c in a.choices}) == 3
    assert a.prompt_token_ids == prompt


def test_stop_string_cuts_text_and_stop_token_ends(engine: TransformersEngine) -> None:
    prompt = _prompt(engine, "stops")
    full = engine.generate_sync(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)).choices[0]
    text = full.text
    start = next(i for i in range(2, len(text) - 1) if "\ufffd" not in text[i : i + 2] and text[i : i + 2].strip())
    stop = text[start : start + 2]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop])
    cut = engine.generate_sync(prompt, params).choices[0]
    assert cut.finish_reason == "stop" and cut.text == text[: text.find(stop)]
    assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
    third = full.token_ids[2]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[third])
    ended = engine.generate_sync(prompt, params).choices[0]
    assert ended.finish_reason == "stop" and ended.token_ids == full.token_ids[: full.token_ids.index(third) + 1]


def test_streamed_text_equals_final_text(engine: TransformersEngine) -> None:
    prompt = _prompt(engine, "stream me")
    params = SamplingParams(max_tokens=15, seed=3, stop=["zz"], logprobs=True)

    async def run() -> tuple[str, List[int], int]:
        text, ids, finishes = "", [], 0
        async for deltas in engine.stream(prompt, params):
            for delta in deltas:
                text += delta.text
                ids += delta.token_ids
                finishes += delta.finish_reason is not None
        return text, ids, finishes

    text, ids, finishes = asyncio.run(run())
    whole = engine.generate_sync(prompt, params).choices[0]
    assert (text, ids, finishes) == (whole.text, whole.token_ids, 1)


def test_text_is_detokenized_incrementally_without_splitting_characters(engine: TransformersEngine) -> None:
    # The tiny tokenizer has one token per byte: accents, symbols and emoji span several tokens.
    text = "héllo wörld ✓ 🚀 done"
    tokens = engine.encode(text)
    sequence = _sequences(SamplingParams(max_tokens=len(tokens)), 1, seed=0)[0]
    sequence.max_tokens = len(tokens)
    pieces = [engine._advance(sequence, token).text for token in tokens]
    assert "".join(pieces) == text and sequence.finished
    assert all("\ufffd" not in piece for piece in pieces)  # a character appears once all its bytes are there
    assert "🚀" in pieces  # released whole, by the token that completed it
    # A sequence that ends inside a character releases what the tokenizer makes of the bytes it has.
    cut = engine.encode("ab🚀")[:-1]
    sequence = _sequences(SamplingParams(max_tokens=len(cut)), 1, seed=0)[0]
    sequence.max_tokens = len(cut)
    assert "".join(engine._advance(sequence, token).text for token in cut) == engine.decode(cut)


def test_invalid_requests_raise(engine: TransformersEngine) -> None:
    prompt = _prompt(engine, "x")
    with pytest.raises(ContextOverflowError, match="maximum context length is 2048"):
        engine.generate_sync(prompt, SamplingParams(max_tokens=2048))
    with pytest.raises(ContextOverflowError):
        engine.generate_sync(list(range(3, 250)) * 9, SamplingParams())
    with pytest.raises(EngineError, match="token ids"):
        engine.generate_sync([1, 99999], SamplingParams())
    with pytest.raises(EngineError, match="prompt is empty"):
        engine.generate_sync([], SamplingParams())
    with pytest.raises(EngineError, match="adapter 'nope'"):
        engine.generate_sync(prompt, SamplingParams(), adapter="nope")
    for bad in (
        SamplingParams(temperature=-1),
        SamplingParams(top_p=0),
        SamplingParams(n=0),
        SamplingParams(max_tokens=0),
        SamplingParams(top_logprobs=21),
        SamplingParams(stop=[""]),
    ):
        with pytest.raises(EngineError):
            engine.generate_sync(prompt, bad)
    assert engine.generate_sync(prompt, SamplingParams(max_tokens=2)).choices[0].token_ids


def test_shared_model_weight_update_is_live(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = TransformersEngine.from_model(model, tokenizer, served_name="shared")
    try:
        assert engine.model is model
        prompt = engine.encode_chat([{"role": "user", "content": "w"}])
        params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
        before = engine.generate_sync(prompt, params)
        assert before.weight_version == 0
        with engine.weights_update() as live, torch.no_grad():
            live.model.norm.weight.zero_()  # all logits become 0: greedy picks token 0 every step
        after = engine.generate_sync(prompt, params)
        assert after.weight_version == 1 and engine.weight_version == 1
        assert after.choices[0].token_ids == [0] * 6 != before.choices[0].token_ids
        state = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
        engine.load_state_dict(state)
        assert engine.generate_sync(prompt, params).choices[0].token_ids == before.choices[0].token_ids
        assert engine.weight_version == 2
    finally:
        engine.stop()


def _make_adapter(tiny_model_dir: Path, target: Path, seed: int) -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(target)
    return target


def test_lora_adapters_load_select_and_unload(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = _make_adapter(tiny_model_dir, tmp_path / "lora", seed=1)
    engine = TransformersEngine(tiny_model_dir, dtype="float32")
    engine.start()
    try:
        prompt = engine.encode_chat([{"role": "user", "content": "lora"}])
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        base = engine.generate_sync(prompt, params).choices[0].token_ids
        engine.load_adapter("mine", adapter)
        assert engine.adapters == {"mine": str(adapter)}
        tuned = engine.generate_sync(prompt, params, adapter="mine").choices[0].token_ids
        assert tuned != base
        assert engine.generate_sync(prompt, params).choices[0].token_ids == base
        with pytest.raises(EngineError, match="already loaded"):
            engine.load_adapter("mine", adapter)
        with pytest.raises(EngineError, match="not a PEFT adapter"):
            engine.load_adapter("other", tmp_path)
        engine.default_adapter = "mine"
        assert engine.generate_sync(prompt, params).choices[0].token_ids == tuned
        engine.unload_adapter("mine")
        assert engine.adapters == {} and engine.default_adapter is None
        with pytest.raises(EngineError, match="not loaded"):
            engine.unload_adapter("mine")
        assert engine.generate_sync(prompt, params).choices[0].token_ids == base
    finally:
        engine.stop()


def test_stopped_engine_rejects_requests(tiny_model_dir: Path) -> None:
    engine = TransformersEngine(tiny_model_dir, dtype="float32")
    engine.start()
    engine.stop()
    with pytest.raises(EngineError, match="not started"):
        engine.generate_sync([5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(EngineError, match="unknown dtype"):
        TransformersEngine(tiny_model_dir, dtype="int3").start()


def _sequences(params: SamplingParams, count: int, seed: int) -> List[Any]:
    from agentbolt.serving.transformers_engine import _Request, _Sequence

    request = _Request([1], params, None, emit=lambda deltas: None, fail=lambda exc: None)
    return [_Sequence(request, i, 8, torch.Generator().manual_seed(seed + i)) for i in range(count)]


def test_sampling_follows_the_tempered_top_p_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])).expand(4000, 5).contiguous()
    picks = TransformersEngine._sample(_sequences(SamplingParams(temperature=1.0), 4000, seed=0), logits)
    frequencies = torch.bincount(torch.tensor(picks), minlength=5).float() / 4000
    assert torch.allclose(frequencies, torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0]), atol=0.03)
    # top_p=0.7 keeps {0.5, 0.3} (renormalized 0.625 / 0.375); temperature 0 rows stay greedy in the same batch.
    mixed = _sequences(SamplingParams(temperature=1.0, top_p=0.7), 3000, seed=1) + _sequences(GREEDY, 10, seed=2)
    picks = TransformersEngine._sample(mixed, logits[:1].expand(3010, 5).contiguous())
    assert picks[3000:] == [0] * 10
    frequencies = torch.bincount(torch.tensor(picks[:3000]), minlength=5).float() / 3000
    assert torch.allclose(frequencies, torch.tensor([0.625, 0.375, 0.0, 0.0, 0.0]), atol=0.03)
    # The same seeds give the same tokens whatever the batch holds.
    again = TransformersEngine._sample(_sequences(SamplingParams(temperature=1.0, top_p=0.7), 5, seed=1), logits[:5])
    assert again == picks[:5]


@pytest.mark.parametrize(
    ("policy", "preset", "expected"),
    [
        ("passive", {}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}),
        ("spin", {}, {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "10000"}),
        ("spin", {"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),
    ],
)
def test_openmp_wait_policy_is_set_before_torch_loads(policy: str, preset: dict, expected: dict) -> None:
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, os, sys\n"
        "from agentbolt.serving.transformers_engine import configure_openmp\n"
        f"configure_openmp({policy!r})\n"
        "assert 'torch' not in sys.modules\n"
        "print(json.dumps({k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | preset
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == expected


@pytest.mark.parametrize("name", ["GRPO", "SFT"])
def test_the_top_level_training_algorithms_set_the_wait_policy_before_torch_loads(name: str) -> None:
    """``agl.GRPO(...)`` / ``agl.SFT(...)`` load their class without the package hooks: the constructor sets it."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, os, sys\n"
        "import agentbolt as agl\n"
        f"agl.{name}(model='smollm2-135m-instruct')\n"
        "assert 'torch' not in sys.modules\n"
        "print(json.dumps(os.environ.get('OMP_WAIT_POLICY')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == "PASSIVE"
    assert "OpenMP wait policy" not in result.stderr


def test_unknown_openmp_wait_policy_is_rejected() -> None:
    from agentbolt.serving.transformers_engine import configure_openmp

    with pytest.raises(ValueError, match="unknown OpenMP wait policy 'busy'"):
        configure_openmp("busy")
