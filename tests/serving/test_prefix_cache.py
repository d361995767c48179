"""Prompt-prefix reuse: the block cache itself, and an engine with it generating exactly what one without it does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentbolt.serving.params import EngineError, SamplingParams
from agentbolt.serving.prefix_cache import PrefixCache
from agentbolt.serving.transformers_engine import TransformersEngine

SYSTEM = "You answer questions about the town of Brookvale. " * 12  # ~100+ tokens shared by every prompt
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)


def _states(value: float, layers: int = 2) -> object:
    def states(layer: int, start: int, end: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.full((1, end - start, 2), value + layer), torch.full((1, end - start, 2), -value - layer)

    return states


def test_blocks_chain_by_prefix_and_a_prompt_keeps_its_tail() -> None:
    cache = PrefixCache(block_size=4)
    cache.insert(list(range(10)), _states(1.0), layers=2)  # two whole blocks, and the tail (8, 9)
    assert len(cache) == 3 and cache.cached_length(list(range(10))) == 8  # whole blocks only
    assert cache.cached_length([0, 1, 2, 3, 9, 9, 9, 9]) == 4  # shares the first block only
    assert cache.cached_length([9, 1, 2, 3]) == 0
    blocks = cache.match(list(range(12)), limit=7)  # 7 tokens may be reused: the second block reaches past them
    assert [block.length for block in blocks] == [4, 4]
    assert blocks[0].keys[1].shape == (1, 4, 2) and float(blocks[0].keys[1][0, 0, 0]) == 2.0
    assert cache.stats()["hits"] == 1 and cache.stats()["reused_tokens"] == 7


def test_a_tail_serves_only_prompts_that_continue_it_token_for_token() -> None:
    cache = PrefixCache(block_size=4)
    cache.insert(list(range(10)), _states(1.0), layers=1)
    same = cache.match(list(range(10)), limit=9)  # the same prompt again: all but its last token
    assert [block.length for block in same] == [4, 4, 2] and same[-1].keys[0].shape == (1, 2, 2)
    assert cache.stats()["reused_tokens"] == 9
    longer = cache.match([*range(10), 42, 43], limit=11)  # continues the tail: reuses it whole
    assert [block.length for block in longer] == [4, 4, 2]
    assert [block.length for block in cache.match([*range(8), 8, 5], limit=9)] == [4, 4]  # (8, 5) is not (8, 9)
    assert [block.length for block in cache.match([*range(8), 8], limit=8)] == [4, 4]  # shorter than the tail
    cache.insert([*range(8), 7], _states(2.0), layers=1)  # a second tail under the same block
    assert [block.length for block in cache.match([*range(8), 7, 1], limit=9)] == [4, 4, 1]


def test_a_new_namespace_empties_the_cache() -> None:
    cache = PrefixCache(block_size=4)
    cache.use_namespace(("base", 0))
    cache.insert(list(range(8)), _states(1.0), layers=1)
    cache.use_namespace(("base", 0))
    assert len(cache) == 2
    cache.use_namespace(("base", 1))
    assert len(cache) == 0 and cache.nbytes == 0


def test_least_recently_used_leaves_are_evicted_first() -> None:
    block_bytes = 2 * 4 * 2 * 4  # keys and values of one layer: [1, 4, 2] float32 each
    cache = PrefixCache(block_size=4, max_bytes=3 * block_bytes)
    cache.insert([1, 1, 1, 1, 2, 2, 2, 2], _states(1.0), layers=1)  # root A, child B
    cache.insert([1, 1, 1, 1, 3, 3, 3, 3], _states(2.0), layers=1)  # child C of A
    cache.match([1, 1, 1, 1, 2, 2, 2, 2], limit=8)  # A and B are now the most recent
    cache.insert([4, 4, 4, 4], _states(3.0), layers=1)  # over budget: C, the least recent leaf, goes
    assert cache.nbytes <= cache.max_bytes
    assert cache.cached_length([1, 1, 1, 1, 2, 2, 2, 2]) == 8
    assert cache.cached_length([1, 1, 1, 1, 3, 3, 3, 3]) == 4
    assert cache.cached_length([4, 4, 4, 4]) == 4


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        PrefixCache(block_size=0)
    with pytest.raises(EngineError, match="prefix_cache_mb"):
        TransformersEngine("unused", prefix_cache_mb=-1)


@pytest.fixture(scope="module")
def engines(kernel_model_dir: Path) -> Iterator[Tuple[TransformersEngine, TransformersEngine]]:
    cached = TransformersEngine(kernel_model_dir, dtype="float32", max_batch_size=8, served_name="tiny")
    plain = TransformersEngine(kernel_model_dir, dtype="float32", max_batch_size=8, prefix_cache_mb=0)
    cached.start()
    plain.start()
    yield cached, plain
    cached.stop()
    plain.stop()


def _prompts(engine: TransformersEngine, questions: List[str]) -> List[List[int]]:
    return [
        engine.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in questions
    ]


def _together(engine: TransformersEngine, prompts: List[List[int]]) -> List[Tuple[List[int], List[float]]]:
    async def run() -> List[Tuple[List[int], List[float]]]:
        outs = await asyncio.gather(*(engine.generate(p, PARAMS) for p in prompts))
        return [(o.choices[0].token_ids, o.choices[0].logprobs or []) for o in outs]

    return asyncio.run(run())


def _assert_same(ours: List[Tuple[List[int], List[float]]], theirs: List[Tuple[List[int], List[float]]]) -> None:
    for (tokens, logprobs), (their_tokens, their_logprobs) in zip(ours, theirs, strict=True):
        assert tokens == their_tokens
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(their_logprobs), atol=1e-5)


def test_requests_arriving_together_share_their_prefix_and_generate_the_same(engines) -> None:
    cached, plain = engines
    cached._prefix_cache.clear()
    prompts = _prompts(cached, ["Who founded it?", "When?", "Which lake lies next to it, and how deep is it?"])
    assert all(len(p) > 2 * cached._prefix_cache.block_size for p in prompts)
    before = cached._prefix_cache.stats()["reused_tokens"]
    _assert_same(_together(cached, prompts), _together(plain, prompts))
    assert cached._prefix_cache.stats()["reused_tokens"] - before >= 2 * cached._prefix_cache.block_size * len(prompts)


def test_later_requests_reuse_cached_prefixes_of_any_length(engines) -> None:
    cached, plain = engines
    prompts = _prompts(cached, ["Short?", "A much longer question about the harbour, the market and the old mill?"])
    for prompt in prompts:  # one at a time: the second reuses the first's blocks
        _assert_same(_together(cached, [prompt]), _together(plain, [prompt]))
    again = prompts[1]  # a prompt cached whole: its last token is still computed to get the logits
    before = cached._prefix_cache.stats()["reused_tokens"]
    _assert_same(_together(cached, [again]), _together(plain, [again]))
    assert cached._prefix_cache.stats()["reused_tokens"] - before == len(again) - 1  # its tail too
    _assert_same(_together(cached, [again, prompts[0]]), _together(plain, [again, prompts[0]]))
    extended = prompts[0] + prompts[1][-20:]  # a prompt longer than a cached one
    _assert_same(_together(cached, [extended]), _together(plain, [extended]))


def test_a_weight_update_invalidates_the_cached_states(kernel_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(kernel_model_dir)
    engine = TransformersEngine.from_model(model, tokenizer, served_name="shared")
    reference = AutoModelForCausalLM.from_pretrained(kernel_model_dir, dtype=torch.float32)
    try:
        prompt = _prompts(engine, ["What changed?"])[0]
        _together(engine, [prompt])
        assert len(engine._prefix_cache) > 0
        with engine.weights_update() as live, torch.no_grad():
            for param, other in zip(live.parameters(), reference.parameters(), strict=True):
                param.mul_(1.01)
                other.mul_(1.01)
        tokens, logprobs = _together(engine, [prompt])[0]
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + tokens])).logits[0].float()
        expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(1, torch.tensor(tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)
    finally:
        engine.stop()


def test_the_transformers_forward_reuses_prefixes_exactly(kernel_model_dir: Path) -> None:
    cached = TransformersEngine(kernel_model_dir, dtype="float32", fast_forward=False)
    plain = TransformersEngine(kernel_model_dir, dtype="float32", fast_forward=False, prefix_cache_mb=0)
    cached.start()
    plain.start()
    try:
        prompts = _prompts(cached, ["First?", "Second, longer question?"])
        _together(cached, prompts[:1])
        _assert_same(_together(cached, prompts), _together(plain, prompts))
        assert cached._prefix_cache.stats()["hits"] > 0
    finally:
        cached.stop()
        plain.stop()


def test_block_quantized_weights_reuse_prefixes_exactly(kernel_model_dir: Path) -> None:
    cached = TransformersEngine(kernel_model_dir, dtype="float32", quantization="q8_0", max_batch_size=8)
    plain = TransformersEngine(
        kernel_model_dir, dtype="float32", quantization="q8_0", max_batch_size=8, prefix_cache_mb=0
    )
    cached.start()
    plain.start()
    try:
        prompts = _prompts(cached, ["First?", "Second, longer question?", "Third?"])
        _together(cached, prompts[:1])
        _assert_same(_together(cached, prompts), _together(plain, prompts))
        assert cached._prefix_cache.stats()["reused_tokens"] > 0
    finally:
        cached.stop()
        plain.stop()
