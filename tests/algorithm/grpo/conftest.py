"""Shared fixtures of the GRPO tests: a tiny randomly initialised Llama built in memory (no download)."""

from __future__ import annotations

import random
from typing import List, Optional, Sequence

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentbolt.algorithm.grpo.samples import TokenSample

VOCAB = 24


def tiny_llama(seed: int = 0, tied: bool = False) -> LlamaForCausalLM:
    """A 2-layer Llama with a 24-token vocabulary; identical weights for the same seed (``tied``: the output
    projection is the input embedding, as in SmolLM2)."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def sample_response(model: torch.nn.Module, prompt: Sequence[int], length: int, temperature: float, seed: int):
    """Sample like an inference engine: tempered sampling, untempered log-softmax recorded per token."""
    generator = torch.Generator().manual_seed(seed)
    tokens = list(prompt)
    response: List[int] = []
    logprobs: List[float] = []
    for _ in range(length):
        logits = model(input_ids=torch.tensor([tokens])).logits[0, -1].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
        logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        response.append(token)
        tokens.append(token)
    return response, logprobs


def make_samples(
    n: int, *, seed: int = 0, model: Optional[torch.nn.Module] = None, temperature: float = 1.0
) -> List[TokenSample]:
    """``n`` samples with varied prompt/response lengths, rewards 0/1 and two tasks (groups)."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 7))]
        if model is not None:
            response, logprobs = sample_response(model, prompt, rng.randint(1, 5), temperature, seed * 100 + i)
        else:
            response, logprobs = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 5))], None
        samples.append(
            TokenSample(
                prompt_ids=prompt,
                response_ids=response,
                logprobs=logprobs,
                reward=float(i % 2),
                group_id=f"task-{i % 2 + 2 * (i // 4)}",
                rollout_id=f"ro-{i}",
                advantage=1.0 if i % 3 else -1.0,
                temperature=temperature,
            )
        )
    return samples


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)
