"""The SFT trainer on the tiny random Llama: loss on known tokens, masks, padding vs packing, accumulation,
checkpoints (resume equality, corrupt or incompatible files, a full disk)."""

from __future__ import annotations

import math
import resource
import signal
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from support.models import write_conversations

from agentbolt.algorithm.finetuning.trainer import CheckpointError, latest_checkpoint
from agentbolt.algorithm.sft.config import SFTConfig
from agentbolt.algorithm.sft.data import TokenSample
from agentbolt.algorithm.sft.trainer import SFTTrainer, layout_rows, pack_rows


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)


def _model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _trainer(path: Path, **options) -> SFTTrainer:
    base = {"learning_rate": 1e-2, "max_grad_norm": None, "micro_batch_size": 8, "train_batch_size": 8}
    base.update(options)
    return SFTTrainer(_model(path), SFTConfig(**base), pad_token_id=0, max_length=64)


def _samples(n: int = 5, seed: int = 0) -> List[TokenSample]:
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        length = 4 + 3 * i
        ids = torch.randint(3, 250, (length,), generator=generator).tolist()
        mask = [False] * (length // 2) + [True] * (length - length // 2)
        samples.append(TokenSample(input_ids=ids, loss_mask=mask, reward=1.0, task=f"t{i}", rollout_id=f"r{i}"))
    return samples


def _trainable(trainer: SFTTrainer) -> Dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@torch.no_grad()
def _reference_loss(model, samples: List[TokenSample]) -> float:
    """Mean NLL of the target tokens, from the plain forward of each sample alone."""
    total, count = 0.0, 0
    for sample in samples:
        logits = model(input_ids=torch.tensor([sample.input_ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        for t in range(1, len(sample.input_ids)):
            if sample.loss_mask[t]:
                total -= float(logp[t - 1, sample.input_ids[t]])
                count += 1
    return total / count


def test_loss_is_the_mean_nll_of_exactly_the_target_tokens(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir, finetune="full")
    sample = TokenSample(input_ids=[5, 6, 7, 8, 9, 10], loss_mask=[False, False, True, False, True, False])
    expected = _reference_loss(trainer.model, [sample])
    assert trainer.evaluate([sample]) == pytest.approx(expected, abs=1e-5)
    # The last token is neither a target nor context for one: changing it changes nothing.
    other = TokenSample(input_ids=[5, 6, 7, 8, 9, 99], loss_mask=sample.loss_mask)
    assert trainer.evaluate([other]) == pytest.approx(expected, abs=1e-6)
    metrics = trainer.optimizer_step([sample])
    assert metrics["loss"] == pytest.approx(expected, abs=1e-5) and metrics["target_tokens"] == 2


def test_a_flag_on_the_first_token_is_no_target_and_does_not_dilute_the_mean(tiny_model_dir: Path) -> None:
    # Nothing predicts the first token, so a loss mask that flags it has the same targets as one that does not.
    flagged = TokenSample(input_ids=[5, 6, 7, 8], loss_mask=[True, False, True, True])
    plain = TokenSample(input_ids=[5, 6, 7, 8], loss_mask=[False, False, True, True])
    assert flagged.num_targets == plain.num_targets == 2
    results = []
    for sample in (flagged, plain):
        trainer = _trainer(tiny_model_dir, finetune="full")
        expected = _reference_loss(trainer.model, [plain])
        metrics = trainer.optimizer_step([sample])
        assert metrics["loss"] == pytest.approx(expected, abs=1e-5) and metrics["target_tokens"] == 2
        results.append(_trainable(trainer))
    for name, value in results[0].items():
        assert torch.allclose(value, results[1][name], atol=1e-6), name


def test_layout_marks_the_positions_that_predict_targets(tiny_model_dir: Path) -> None:
    a = TokenSample(input_ids=[5, 6, 7], loss_mask=[False, False, True])
    b = TokenSample(input_ids=[8, 9, 10, 11], loss_mask=[False, True, True, False])
    padded = layout_rows([[a], [b]], pad_token_id=0, packed=False)
    assert padded.input_ids.tolist() == [[5, 6, 7, 0], [8, 9, 10, 11]]
    assert padded.attention_mask is not None and padded.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    # targets[b, t] says the logits at t predict a target: 7 (from position 1), 9 and 10 (from 0 and 1).
    assert padded.targets.tolist() == [[False, True, False, False], [True, True, False, False]]
    packed = layout_rows([[a, b]], pad_token_id=0, packed=True)
    assert packed.attention_mask is None
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]  # each sample restarts its positions
    assert packed.input_ids[0][packed.targets[0].roll(1)].tolist() == [7, 9, 10]
    # A flagged first token is no target (nothing of its sample precedes it), packed after another sample too.
    flagged = TokenSample(input_ids=[8, 9, 10, 11], loss_mask=[True, True, True, False])
    packed = layout_rows([[a, flagged]], pad_token_id=0, packed=True)
    assert packed.input_ids[0][packed.targets[0].roll(1)].tolist() == [7, 9, 10]
    assert int(packed.targets.sum()) == a.num_targets + flagged.num_targets


def test_packing_first_fit_never_exceeds_the_row_length() -> None:
    samples = _samples(6)
    rows = pack_rows(samples, 20)
    assert sorted(len(s.input_ids) for row in rows for s in row) == sorted(len(s.input_ids) for s in samples)
    assert all(sum(len(s.input_ids) for s in row) <= 20 for row in rows)
    with pytest.raises(ValueError, match="does not fit a packed row of 5"):
        pack_rows(samples, 5)


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_padding_packing_and_micro_batches_give_the_same_update(tiny_model_dir: Path, finetune: str) -> None:
    samples = _samples(5)
    results = []
    for options in ({"micro_batch_size": 8}, {"micro_batch_size": 1}, {"packing": True, "micro_batch_size": 2}):
        trainer = _trainer(tiny_model_dir, finetune=finetune, **options)
        loss = trainer.optimizer_step(samples)["loss"]
        results.append((loss, _trainable(trainer)))
    expected = _reference_loss(_trainer(tiny_model_dir, finetune=finetune).model, samples)
    for loss, weights in results:
        assert loss == pytest.approx(expected, abs=1e-5)
        for name, value in weights.items():
            assert torch.allclose(value, results[0][1][name], atol=1e-6), name


def test_train_epochs_takes_the_configured_optimizer_steps_and_lowers_the_loss(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir, train_batch_size=2, epochs=3, learning_rate=3e-2)
    samples = _samples(5)
    before = trainer.evaluate(samples)
    metrics = trainer.train_epochs(samples)
    assert metrics["optimizer_steps_taken"] == 9 == trainer.optimizer_steps  # 3 epochs x ceil(5 / 2)
    assert trainer.global_step == 1 and metrics["samples"] == 5
    assert trainer.evaluate(samples) < before


def test_bad_batches_are_refused(tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    with pytest.raises(ValueError, match="at least one sample"):
        trainer.optimizer_step([])
    with pytest.raises(ValueError, match="at least one target"):
        trainer.optimizer_step([TokenSample(input_ids=[1, 2], loss_mask=[False, False])])
    with pytest.raises(ValueError, match="exceeds max_length=64"):
        trainer.optimizer_step([TokenSample(input_ids=[3] * 65, loss_mask=[False] + [True] * 64)])


def test_a_resumed_offline_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path: Path, tiny_model_dir) -> None:
    from agentbolt.algorithm.sft.offline import train_from_messages

    data = tmp_path / "chat.jsonl"
    write_conversations(data, 6)
    options = {"epochs": 2, "train_batch_size": 2, "learning_rate": 1e-2, "checkpoint_interval": 2, "seed": 3}
    whole = train_from_messages(data, model=str(tiny_model_dir), output_dir=tmp_path / "whole", **options)
    assert whole.finished and whole.optimizer_steps == 6 and len(whole.history) == 6
    first = train_from_messages(data, model=str(tiny_model_dir), output_dir=tmp_path / "parts", stop_after=3, **options)
    assert not first.finished and first.optimizer_steps == 3 and first.adapter_dir is None
    assert [p.name for p in sorted((tmp_path / "parts" / "checkpoints").iterdir())] == ["step_000002", "step_000003"]
    rest = train_from_messages(data, model=str(tiny_model_dir), output_dir=tmp_path / "parts", **options)
    assert rest.finished and [h["optimizer_step"] for h in rest.history] == [4.0, 5.0, 6.0]
    assert [h["loss"] for h in rest.history] == [h["loss"] for h in whole.history[3:]]
    from safetensors.torch import load_file

    a = load_file(str(whole.adapter_dir / "adapter_model.safetensors"))
    b = load_file(str(rest.adapter_dir / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _saved(tmp_path: Path, tiny_model_dir: Path, **options) -> Path:
    trainer = _trainer(tiny_model_dir, **options)
    trainer.optimizer_step(_samples(3))
    trainer.global_step = 1
    return trainer.save_checkpoint(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda p: (p / "trainer_state.json").write_text("{not json"), "trainer_state.json is corrupt"),
        (lambda p: (p / "optimizer.pt").write_bytes(b"\x00" * 10), "optimizer.pt is corrupt"),
        (lambda p: (p / "rng.pt").unlink(), "rng.pt is missing"),
        (
            lambda p: (p / "adapter" / "adapter_model.safetensors").write_bytes(b"garbage"),
            "adapter_model.safetensors is corrupt",
        ),
    ],
)
def test_a_corrupt_checkpoint_is_refused_naming_the_file_and_leaves_the_weights(
    tmp_path: Path, tiny_model_dir: Path, damage, named: str
) -> None:
    path = _saved(tmp_path, tiny_model_dir)
    damage(path)
    trainer = _trainer(tiny_model_dir)
    before = _trainable(trainer)
    with pytest.raises(CheckpointError, match=named):
        trainer.load_checkpoint(path)
    assert all(torch.equal(before[k], v) for k, v in _trainable(trainer).items())
    assert trainer.global_step == 0 and trainer.optimizer_steps == 0


def test_an_incompatible_checkpoint_is_refused_naming_what_does_not_fit(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = _saved(tmp_path, tiny_model_dir, lora_r=4)
    with pytest.raises(CheckpointError, match=r"lora_r 4 \(this run: 8\)"):
        _trainer(tiny_model_dir, lora_r=8).load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"lora_target_modules .* \(this run: \['q_proj'\]\)"):
        _trainer(tiny_model_dir, lora_r=4, lora_target_modules=["q_proj"]).load_checkpoint(path)
    with pytest.raises(CheckpointError, match="finetune='lora'"):
        _trainer(tiny_model_dir, finetune="full").load_checkpoint(path)
    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer

    grpo = PolicyTrainer(_model(tiny_model_dir), GRPOConfig(lora_r=4)).save_checkpoint(tmp_path / "grpo")
    with pytest.raises(CheckpointError, match="is a 'grpo' checkpoint; this 'sft' trainer cannot resume from it"):
        _trainer(tiny_model_dir, lora_r=4).load_checkpoint(grpo)


def test_a_full_disk_while_saving_leaves_the_previous_checkpoint_valid(tmp_path: Path, tiny_model_dir: Path) -> None:
    trainer = _trainer(tiny_model_dir)
    trainer.optimizer_step(_samples(3))
    trainer.global_step = 1
    first = trainer.save_checkpoint(tmp_path)
    trainer.optimizer_step(_samples(3, seed=1))
    trainer.global_step = 2
    # A file-size limit stands in for a full disk: the first large write fails (EFBIG instead of ENOSPC).
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        with pytest.raises(CheckpointError, match=f"could not write checkpoint .*step_000002.*still {first}"):
            trainer.save_checkpoint(tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]  # no staging directory left behind
    assert latest_checkpoint(tmp_path) == first
    fresh = _trainer(tiny_model_dir)
    fresh.load_checkpoint(first)
    assert fresh.global_step == 1 and fresh.optimizer_steps == 1
    assert math.isfinite(fresh.evaluate(_samples(2)))


def test_training_can_start_from_a_saved_adapter_and_refuses_a_mismatched_one(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    saved = _saved(tmp_path, tiny_model_dir) / "adapter"
    first = _trainer(tiny_model_dir)
    first.optimizer_step(_samples(3))
    trained = {n.replace(".default", ""): p for n, p in _trainable(first).items()}

    resumed = _trainer(tiny_model_dir, init_adapter=str(saved))
    loaded = {n.replace(".default", ""): p for n, p in _trainable(resumed).items()}
    assert loaded.keys() == trained.keys() and loaded  # the adapter's weights, trainable
    assert any(bool(p.abs().sum() > 0) for n, p in loaded.items() if "lora_B" in n)  # not a fresh (zero) B
    before = _trainable(resumed)
    resumed.optimizer_step(_samples(3))
    assert any(not torch.equal(before[n], p) for n, p in _trainable(resumed).items())

    with pytest.raises(ValueError, match="has rank 8 and alpha 16, but lora_r is 4"):
        _trainer(tiny_model_dir, init_adapter=str(saved), lora_r=4)
    with pytest.raises(FileNotFoundError, match=r"no adapter_config\.json"):
        _trainer(tiny_model_dir, init_adapter=str(tmp_path))
    with pytest.raises(ValueError, match="init_adapter starts from LoRA adapters"):
        SFTConfig(init_adapter=str(saved), finetune="full")


def test_grad_norm_averages_the_steps_taken_and_counts_those_skipped_for_a_non_finite_gradient(
    tiny_model_dir: Path,
) -> None:
    trainer = _trainer(tiny_model_dir, finetune="full", train_batch_size=1, max_grad_norm=1.0)
    backward_passes = []

    def overflow_first_step(grad: torch.Tensor) -> torch.Tensor:  # as a float16 overflow would
        backward_passes.append(1)
        return grad * math.inf if len(backward_passes) == 1 else grad

    next(p for p in trainer.model.parameters() if p.requires_grad).register_hook(overflow_first_step)
    metrics = trainer.train_epochs(_samples(2))
    assert metrics["optimizer_steps_taken"] == 2 and metrics["nonfinite_grad_steps"] == 1
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.parametrize("choices", [2, 0, True, "2"])
def test_several_choices_per_collecting_call_are_refused(choices: object) -> None:
    # A call's span records its first choice: the other choices would be sampled and never become samples.
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"sampling_parameters\['n'\]=.*first choice.*rollouts_per_task"):
        SFTConfig(sampling_parameters={"temperature": 0.5, "n": choices})
    assert SFTConfig(sampling_parameters={"n": 1}).sampling_parameters == {"n": 1}
    assert SFTConfig(val_sampling_parameters={"n": 3}).val_sampling_parameters == {"n": 3}
