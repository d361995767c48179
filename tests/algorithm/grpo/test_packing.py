"""Prefix-tree packing: shared tokens computed once, log-probs and gradients equal to left-padded batches."""

from __future__ import annotations

import random
from typing import List

import pytest
import torch
from conftest import VOCAB, sample_response, tiny_llama

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.packing import pack_samples, packable, prefix_order
from agentbolt.algorithm.grpo.samples import TokenSample
from agentbolt.algorithm.grpo.trainer import PolicyTrainer


def _sample(prompt: List[int], response: List[int], rollout: str = "r", advantage: float = 1.0) -> TokenSample:
    return TokenSample(prompt, response, None, 0.0, "g", rollout, advantage=advantage)


def _grouped_samples(model: torch.nn.Module, temperature: float = 1.0) -> List[TokenSample]:
    """Two tasks x three rollouts; each rollout a first call and a second call extending it (multi-turn)."""
    rng = random.Random(3)
    samples = []
    for task in range(2):
        prompt = [rng.randrange(1, VOCAB) for _ in range(9)]
        for rollout in range(3):
            first, first_lp = sample_response(model, prompt, 4, temperature, seed=10 * task + rollout)
            second_prompt = prompt + first + [rng.randrange(1, VOCAB) for _ in range(3)]
            second, second_lp = sample_response(model, second_prompt, 3, temperature, seed=100 + 10 * task + rollout)
            for call_prompt, response, logprobs in ((prompt, first, first_lp), (second_prompt, second, second_lp)):
                samples.append(
                    TokenSample(
                        call_prompt,
                        response,
                        logprobs,
                        float(rollout % 2),
                        f"task-{task}",
                        f"ro-{task}-{rollout}",
                        advantage=1.0 if rollout % 2 else -0.5,
                        temperature=temperature,
                    )
                )
    return samples


def test_shared_prefixes_are_packed_once_at_their_depth() -> None:
    samples = [_sample([5, 6, 7], [8, 9]), _sample([5, 6, 7], [8, 10, 11]), _sample([5, 4], [3])]
    packed = pack_samples(samples)
    # Nodes: 5 6 7 8 9 | 10 11 | 4 3 -- the prompt [5, 6, 7] and the first response token 8 are shared.
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 4, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 4, 5, 1, 2]]
    assert packed.parents.tolist() == [-1, 0, 1, 2, 3, 3, 5, 0, 7]
    assert packed.targets[packed.response_mask].tolist() == [8, 9, 8, 10, 11, 3]
    # Each target is predicted by the node of the token before it, in that sample's own path.
    assert packed.source_positions[packed.response_mask].tolist() == [2, 3, 2, 3, 5, 7]


def test_each_node_attends_to_itself_and_its_ancestors_only() -> None:
    packed = pack_samples([_sample([5, 6], [7]), _sample([5, 8], [9])])  # nodes 5 6 7 8 9
    allowed = packed.attention_mask(torch.float32, torch.device("cpu"))[0, 0] == 0
    assert allowed.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 1, 1],
    ]


def test_samples_without_prompt_or_response_cannot_be_packed() -> None:
    with pytest.raises(ValueError, match="empty prompt or response"):
        pack_samples([_sample([], [1])])
    with pytest.raises(ValueError, match="empty list"):
        pack_samples([])


def test_prefix_order_puts_samples_sharing_a_prompt_side_by_side() -> None:
    samples = [_sample([2, 1], [1]), _sample([1, 5], [1]), _sample([2, 1], [0]), _sample([1, 5], [2])]
    assert prefix_order([s.token_ids for s in samples], range(4)) == [1, 3, 2, 0]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_equal_padded_logprobs(attention: str, temperature: float) -> None:
    models = [tiny_llama(), tiny_llama()]
    for model in models:
        model.config._attn_implementation = attention
    samples = _grouped_samples(models[0], temperature)
    packed = PolicyTrainer(models[0], GRPOConfig(micro_batch_size=12))
    padded = PolicyTrainer(models[1], GRPOConfig(micro_batch_size=12, pack_shared_prefixes=False))
    assert packed.packs_prefixes and not padded.packs_prefixes
    for mine, theirs, sample in zip(
        packed.compute_logprobs(samples), padded.compute_logprobs(samples), samples, strict=True
    ):
        assert torch.allclose(mine, theirs, atol=1e-5)
        if temperature == 1.0:  # the engine-side values of the sampler, one token at a time
            assert torch.allclose(mine, torch.tensor(sample.logprobs), atol=1e-5)


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_packed_update_has_the_padded_update_gradients(kl_coef: float) -> None:
    samples = _grouped_samples(tiny_llama(), temperature=0.7)
    gradients = []
    for pack in (True, False):
        trainer = PolicyTrainer(
            tiny_llama(),
            GRPOConfig(
                finetune="full", learning_rate=1e-2, micro_batch_size=4, kl_coef=kl_coef, pack_shared_prefixes=pack
            ),
        )
        seen = {}
        step = trainer.optimizer.step

        def recording_step(*args, _seen=seen, _trainer=trainer, _step=step, **kwargs):
            _seen.update({n: p.grad.clone() for n, p in _trainer.model.named_parameters() if p.grad is not None})
            return _step(*args, **kwargs)

        trainer.optimizer.step = recording_step
        metrics = trainer.train_step(samples)
        assert metrics["first_minibatch_ratio_max_dev"] < 1e-5
        gradients.append(seen)
    assert gradients[0].keys() == gradients[1].keys() and gradients[0]
    for name, value in gradients[0].items():  # equal up to float32 summation order
        assert torch.linalg.vector_norm(value - gradients[1][name]) <= 1e-4 * torch.linalg.vector_norm(value), name


def test_packed_update_counts_packed_tokens() -> None:
    samples = _grouped_samples(tiny_llama())
    metrics = PolicyTrainer(tiny_llama(), GRPOConfig(micro_batch_size=12)).train_step(samples)
    assert metrics["forward_tokens"] < metrics["update_tokens"]
    assert metrics["forward_tokens"] == float(pack_samples(samples).length)


def _small(config_class: type, **options: object) -> object:
    sizes = dict(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    return config_class(
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa", **sizes, **options
    )


def test_models_with_sliding_window_attention_are_not_packed() -> None:
    # The packed forward's tree mask replaces the model's mask, window included: its log-probs would be wrong once a
    # sequence is longer than the window, so such models take the padded forward.
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    assert packable(tiny_llama())
    assert not packable(MistralForCausalLM(_small(MistralConfig, sliding_window=3)))
    assert packable(MistralForCausalLM(_small(MistralConfig, sliding_window=None)))
    assert packable(Qwen2ForCausalLM(_small(Qwen2Config)))  # a window in the config, switched off
    windowed = _small(Qwen2Config, use_sliding_window=True, sliding_window=3, max_window_layers=0)
    assert not packable(Qwen2ForCausalLM(windowed))
