"""SFT with ``packing="prefix"``: samples sharing a start are laid out as one prefix tree (each shared token computed
once), with the padded layout's loss and gradients; bad combinations are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from pydantic import ValidationError

from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import ChatSample, TokenSample, tokenize_samples
from agentbolt.algorithm.sft.trainer import SFTTrainer, layout_prefix_tree


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)


def _model(path: Path, attention: str = "sdpa") -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attention)


SYSTEM = {"role": "system", "content": "You plan the next step. Tools: search, calculator, finish. Reply in JSON."}


def _conversations() -> List[ChatSample]:
    """Planner-like chats: one shared system prompt, later turns repeating earlier ones (several assistant segments
    each learned), and one chat that shares nothing."""
    first = [SYSTEM, {"role": "user", "content": "Question: how old is the bridge? Step 1"}]
    reply = {"role": "assistant", "content": '{"tool_name": "search", "sub_goal": "bridge"}'}
    second = [*first, reply, {"role": "user", "content": "Result: 1932. Step 2"}]
    last = {"role": "assistant", "content": '{"tool_name": "calculator", "sub_goal": "2026 - 1932"}'}
    other = [SYSTEM, {"role": "user", "content": "Question: who wrote it? Step 1"}]
    alone = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]
    return [
        ChatSample(messages=[*first, reply], train_turns="all"),
        ChatSample(messages=[*second, last], train_turns="all"),  # two assistant turns, both targets
        ChatSample(messages=[*other, {"role": "assistant", "content": '{"tool_name": "search"}'}], train_turns="all"),
        ChatSample(messages=alone, train_turns="all"),
    ]


def _samples(model_dir: Path) -> List[TokenSample]:
    from transformers import AutoTokenizer

    samples, stats = tokenize_samples(_conversations(), AutoTokenizer.from_pretrained(model_dir))
    assert len(samples) == 4 and stats.samples == 4
    return samples


def _segments(mask: List[bool]) -> int:
    return sum(1 for i, flag in enumerate(mask) if flag and (i == 0 or not mask[i - 1]))


def _step(model_dir: Path, samples: List[TokenSample], attention: str = "sdpa", **options: Any) -> Tuple[Dict, Dict]:
    """Metrics and LoRA gradients of one optimizer step (the gradients as the optimizer receives them)."""
    base: Dict[str, Any] = {"learning_rate": 1e-2, "max_grad_norm": None, "train_batch_size": 8, "lora_r": 4}
    trainer = SFTTrainer(_model(model_dir, attention), SFTConfig(**{**base, **options}), max_length=1024)
    seen: Dict[str, torch.Tensor] = {}
    step = trainer.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        seen.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step  # type: ignore[method-assign]
    return trainer.optimizer_step(samples), seen


def test_the_tree_holds_each_shared_token_once_and_reads_every_target_from_its_own_sample() -> None:
    a = TokenSample(input_ids=[5, 6, 7, 8], loss_mask=[False, False, True, True])
    b = TokenSample(input_ids=[5, 6, 7, 8, 9, 10, 11], loss_mask=[False, False, True, True, False, True, True])
    c = TokenSample(input_ids=[5, 4, 3], loss_mask=[False, False, True])
    d = TokenSample(input_ids=[2, 3], loss_mask=[True, True])  # the first token is never a target
    batch = layout_prefix_tree([a, b, c, d])
    # Nodes: 5 6 7 8 | 9 10 11 | 4 3 | 2 3 -- a is a prefix of b (an earlier turn of the same conversation).
    assert batch.tree.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 4, 3, 2, 3]]
    assert batch.tree.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 1, 2, 0, 1]]
    assert batch.labels.tolist() == [7, 8, 7, 8, 10, 11, 3, 3]
    assert batch.sources.tolist() == [1, 2, 1, 2, 4, 5, 7, 9]
    assert batch.num_tokens == 11 and batch.num_targets == 8


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize(("attention", "micro"), [("sdpa", 8), ("sdpa", 2), ("eager", 3)])
def test_a_prefix_packed_step_has_the_padded_step_loss_and_gradients(
    tiny_model_dir: Path, attention: str, micro: int, finetune: str
) -> None:
    samples = _samples(tiny_model_dir)
    assert max(_segments(s.loss_mask) for s in samples) == 2  # the multi-turn chat learns both assistant turns
    padded, padded_grads = _step(tiny_model_dir, samples, attention, micro_batch_size=micro, finetune=finetune)
    packed, packed_grads = _step(
        tiny_model_dir, samples, attention, micro_batch_size=micro, finetune=finetune, packing="prefix"
    )
    assert packed["loss"] == pytest.approx(padded["loss"], rel=1e-5)
    assert packed["target_tokens"] == padded["target_tokens"]
    assert packed["tokens"] < sum(len(s.input_ids) for s in samples) <= padded["tokens"]
    assert packed_grads.keys() == padded_grads.keys() and packed_grads
    if finetune == "lora":
        assert all("lora_" in name for name in packed_grads)
    for name, value in padded_grads.items():  # equal up to float32 summation order
        assert torch.linalg.vector_norm(packed_grads[name] - value) <= 1e-4 * torch.linalg.vector_norm(value), name


def test_prefix_packing_puts_samples_sharing_a_start_in_one_micro_batch(tiny_model_dir: Path) -> None:
    shared = [1, 2, 3, 4, 5, 6]
    samples = [
        TokenSample(input_ids=[*shared, 7 + i], loss_mask=[False] * 6 + [True]) if i % 2 == 0 else
        TokenSample(input_ids=[9, 8, 7, 6, 5, 4 + i], loss_mask=[False] * 5 + [True])
        for i in range(4)
    ]  # fmt: skip
    trainer = SFTTrainer(_model(tiny_model_dir), SFTConfig(packing="prefix", micro_batch_size=2), max_length=64)
    batches = trainer.batches(samples)
    assert [batch.num_tokens for batch in batches] == [8, 7]  # 6 shared + 2 ends; 5 shared + 2 ends


def test_an_offline_run_with_prefix_packing_trains_the_padded_run_adapter(tmp_path: Path, tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    from agentbolt.algorithm.sft.offline import train_from_messages

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": s.messages}) + "\n" for s in _conversations()))
    options = {"epochs": 2, "train_batch_size": 2, "learning_rate": 1e-2, "seed": 3}
    runs = {}
    for packing in ("none", "prefix"):
        runs[packing] = train_from_messages(
            data, model=str(tiny_model_dir), output_dir=tmp_path / packing, packing=packing, **options
        )
    padded, packed = runs["none"], runs["prefix"]
    assert packed.finished and packed.optimizer_steps == padded.optimizer_steps == 4
    for mine, theirs in zip(packed.history, padded.history, strict=True):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
    a = load_file(str(packed.adapter_dir / "adapter_model.safetensors"))
    b = load_file(str(padded.adapter_dir / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_packing_accepts_the_earlier_booleans_and_refuses_unknown_layouts() -> None:
    assert SFTConfig(packing=True).packing == "rows" and SFTConfig(packing=False).packing == "none"
    assert SFTConfig().packing == "none" and SFTConfig(packing="prefix").packing == "prefix"
    with pytest.raises(ValidationError, match="'none', 'rows' or 'prefix'"):
        SFTConfig(packing="tree")


def test_prefix_packing_refuses_attentions_that_ignore_a_tree_mask(tiny_model_dir: Path) -> None:
    with pytest.raises(ValidationError, match="packing='prefix' needs an attention that reads a tree mask"):
        SFTConfig(packing="prefix", backend="unsloth")
    model = _model(tiny_model_dir)
    model.config._attn_implementation = "flash_attention_2"  # stands in for a GPU model (no flash-attn here)
    with pytest.raises(ValueError, match=r"this model has attention 'flash_attention_2'.*packing='rows'"):
        SFTTrainer(model, SFTConfig(packing="prefix"))
    model = _model(tiny_model_dir)
    model.config._attn_implementation = "flash_attention_2"
    SFTTrainer(model, SFTConfig(packing="rows"))  # row packing only needs position ids


def test_prefix_packing_evaluates_the_padded_loss(tiny_model_dir: Path) -> None:
    samples = _samples(tiny_model_dir)
    model = _model(tiny_model_dir)
    padded = SFTTrainer(model, SFTConfig(finetune="full"), max_length=1024).evaluate(samples)
    packed = SFTTrainer(model, SFTConfig(finetune="full", packing="prefix"), max_length=1024).evaluate(samples)
    assert packed == pytest.approx(padded, rel=1e-5)
