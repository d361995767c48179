"""Memory options of the policy trainer: activation checkpointing gives the same update from fewer saved tensors."""

from __future__ import annotations

import torch
from conftest import VOCAB, make_samples, tiny_llama

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import TokenSample
from agentbolt.algorithm.grpo.trainer import PolicyTrainer


def _trainer(finetune: str, checkpointing: bool) -> PolicyTrainer:
    config = GRPOConfig(
        finetune=finetune,
        learning_rate=1e-2,
        micro_batch_size=3,
        max_grad_norm=None,
        gradient_checkpointing=checkpointing,
    )
    return PolicyTrainer(tiny_llama(), config)


def test_checkpointing_gives_the_same_update() -> None:
    for finetune in ("lora", "full"):
        samples = make_samples(8)
        plain, checkpointed = _trainer(finetune, False), _trainer(finetune, True)
        plain_metrics, checkpointed_metrics = plain.train_step(samples), checkpointed.train_step(samples)
        assert checkpointed_metrics["loss"] == plain_metrics["loss"]
        assert checkpointed_metrics["grad_norm"] == plain_metrics["grad_norm"]
        after = dict(checkpointed.model.named_parameters())
        for name, param in plain.model.named_parameters():
            assert torch.equal(param, after[name]), name


def _saved_bytes(trainer: PolicyTrainer, samples: list[TokenSample]) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward pass of one training step."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer.train_step(samples)
    return sum(storages.values())


def test_checkpointing_keeps_only_the_block_inputs() -> None:
    prompt = [(7 * i) % (VOCAB - 1) + 1 for i in range(100)]
    samples = [
        TokenSample(prompt, [3, 4, 5, 6], None, float(i % 2), "g", f"r{i}", advantage=1.0 if i % 2 else -1.0)
        for i in range(3)
    ]
    plain = _saved_bytes(_trainer("lora", False), samples)
    checkpointed = _saved_bytes(_trainer("lora", True), samples)
    assert checkpointed < plain / 3, (checkpointed, plain)
