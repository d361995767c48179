"""The torch policy trainer: masks, importance ratio, accumulation, reference, schedule, checkpoints."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from conftest import VOCAB, make_samples, tiny_llama

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import TokenSample
from agentbolt.algorithm.grpo.trainer import (
    PolicyTrainer,
    collate,
    latest_checkpoint,
    lr_multiplier,
    rollout_minibatches,
)


def _config(**overrides) -> GRPOConfig:
    base = {"learning_rate": 1e-2, "micro_batch_size": 4, "max_grad_norm": None}
    base.update(overrides)
    return GRPOConfig(**base)


def _trainable_state(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_collate_masks_exactly_the_response_tokens() -> None:
    samples = [
        TokenSample([5, 6, 7], [8, 9], None, 0.0, "g", "r1"),
        TokenSample([4, 5], [10, 11, 12, 13], None, 0.0, "g", "r2"),
    ]
    batch = collate(samples, pad_token_id=0)
    assert batch.input_ids.tolist() == [[0, 5, 6, 7, 8, 9], [4, 5, 10, 11, 12, 13]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    assert batch.position_ids[0].tolist()[1:] == [0, 1, 2, 3, 4]
    # Response-aligned columns: the masked targets are exactly the sampled response tokens.
    assert batch.targets[batch.response_mask].tolist() == [8, 9, 10, 11, 12, 13]
    assert batch.response_mask.tolist() == [[False, False, True, True], [True, True, True, True]]
    # Column j of the targets is the input token right after logits position L - R - 1 + j.
    length, width = batch.input_ids.shape[1], batch.response_width
    assert torch.equal(batch.targets, batch.input_ids[:, length - width :])


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_first_minibatch_ratio_is_one_with_a_scoring_pass(finetune: str, temperature: float) -> None:
    model = tiny_llama()
    samples = make_samples(8, model=model, temperature=temperature)
    trainer = PolicyTrainer(
        model, _config(finetune=finetune, batch_size=2, group_size=4, minibatch_size=4, ppo_epochs=2)
    )
    metrics = trainer.train_step(samples)
    assert metrics["first_minibatch_ratio_max_dev"] < 1e-5
    # Later minibatches see updated weights, so the mean ratio over the whole step moves away from 1.
    assert metrics["ratio_mean"] != pytest.approx(1.0, abs=1e-7)
    assert metrics["optimizer_steps"] == 4


def test_missing_logprobs_are_recomputed_and_give_ratio_one() -> None:
    samples = make_samples(6)  # no behaviour log-probs at all
    trainer = PolicyTrainer(tiny_llama(), _config(finetune="full"))
    recomputed = trainer.compute_logprobs(samples)
    assert [len(r) for r in recomputed] == [len(s.response_ids) for s in samples]
    metrics = trainer.train_step(samples)
    assert metrics["first_minibatch_ratio_max_dev"] < 1e-6


def test_padding_does_not_change_logprobs() -> None:
    model = tiny_llama()
    samples = make_samples(6, model=model)
    trainer = PolicyTrainer(model, _config(micro_batch_size=6))
    batched = trainer.compute_logprobs(samples)
    for sample, logp in zip(samples, batched, strict=True):
        alone = trainer.compute_logprobs([sample])[0]
        assert torch.allclose(alone, logp, atol=1e-5)
        assert torch.allclose(logp, torch.tensor(sample.logprobs), atol=1e-5)


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_stale_engine_logprobs_show_in_the_engine_diff_not_in_the_ratio(ppo_epochs: int) -> None:
    model = tiny_llama()
    samples = make_samples(4, model=model, temperature=0.7)
    for sample in samples:
        sample.logprobs = [lp - 0.5 for lp in sample.logprobs]
    trainer = PolicyTrainer(model, _config(ppo_epochs=ppo_epochs))
    metrics = trainer.train_step(samples)
    assert metrics["first_minibatch_ratio_max_dev"] < 1e-5
    assert metrics["logprob_engine_diff_mean"] == pytest.approx(0.5, abs=1e-4)
    assert metrics["logprob_engine_diff_max"] == pytest.approx(0.5, abs=1e-4)


@pytest.mark.parametrize("aggregation", ["token_mean", "rollout_mean"])
def test_gradient_accumulation_equals_one_large_batch(aggregation: str) -> None:
    samples = make_samples(4, model=tiny_llama())
    results = []
    for micro in (4, 2, 1):
        config = _config(finetune="full", micro_batch_size=micro, kl_coef=0.1, loss_aggregation=aggregation)
        trainer = PolicyTrainer(tiny_llama(), config)
        trainer.train_step(samples)
        results.append(_trainable_state(trainer))
    # Adam's first step divides each gradient by its own magnitude, so float rounding in gradients near zero shows
    # in the weights; the per-sample weights of rollout_mean add a multiplication, hence its wider tolerance.
    atol = 1e-6 if aggregation == "token_mean" else 5e-5
    for other in results[1:]:
        for name, value in results[0].items():
            assert torch.allclose(value, other[name], atol=atol, rtol=1e-5), name


def test_rollout_mean_weighs_each_rollout_once_whatever_its_calls_and_tokens() -> None:
    samples = make_samples(4, model=tiny_llama())
    # Rollout ro-0 now made two calls (the second a copy of the first): under rollout_mean it still weighs one
    # rollout, so the update is the same as with its single call; under token_mean it doubles ro-0's weight.
    doubled = [*samples, TokenSample(**{**samples[0].__dict__})]
    results = {}
    for aggregation in ("token_mean", "rollout_mean"):
        for name, batch in (("once", samples), ("twice", doubled)):
            trainer = PolicyTrainer(tiny_llama(), _config(finetune="full", loss_aggregation=aggregation))
            metrics = trainer.train_step(batch)
            assert math.isfinite(metrics["loss"])
            results[aggregation, name] = _trainable_state(trainer)

    def largest_difference(aggregation: str) -> float:
        once, twice = results[aggregation, "once"], results[aggregation, "twice"]
        return max(float((once[name] - twice[name]).abs().max()) for name in once)

    # Adam's first step moves a weight by about the learning rate (1e-2) in its gradient's sign: a changed weighting
    # flips signs and moves weights by that much; rounding alone stays far below it.
    assert largest_difference("rollout_mean") < 1e-4
    assert largest_difference("token_mean") > 1e-3


def test_lora_trains_only_adapters_and_reference_is_the_base_model() -> None:
    base = tiny_llama()
    samples = make_samples(4, model=base)
    trainer = PolicyTrainer(tiny_llama(), _config(kl_coef=0.5))
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert names and all("lora_" in n for n in names)
    assert {id(p) for group in trainer.optimizer.param_groups for p in group["params"]} == {
        id(p) for p in trainer.trainable_parameters
    }
    frozen_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    first = trainer.train_step(samples)
    assert first["kl"] == pytest.approx(0.0, abs=1e-10)  # LoRA B starts at 0: policy == reference
    trainer.train_step(samples)
    for name, param in trainer.model.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, frozen_before[name]), name
    policy = trainer.compute_logprobs(samples)
    reference = trainer.compute_logprobs(samples, reference=True)
    untouched = PolicyTrainer(tiny_llama(), _config(finetune="full")).compute_logprobs(samples)
    for ref, expected, _pol in zip(reference, untouched, policy, strict=True):
        assert torch.allclose(ref, expected, atol=1e-5)
    assert any(not torch.allclose(p, r, atol=1e-4) for p, r in zip(policy, reference, strict=True))
    assert trainer.train_step(samples)["kl"] > 0


def test_full_finetune_reference_stays_frozen() -> None:
    samples = make_samples(4)
    trainer = PolicyTrainer(tiny_llama(), _config(finetune="full", kl_coef=0.1))
    before = trainer.compute_logprobs(samples, reference=True)
    trainer.train_step(samples)
    after = trainer.compute_logprobs(samples, reference=True)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert trainer.train_step(samples)["kl"] > 0


def test_positive_advantage_raises_the_sampled_tokens_probability() -> None:
    samples = make_samples(4)
    for sample in samples:
        sample.advantage = 1.0
    trainer = PolicyTrainer(tiny_llama(), _config(finetune="full", learning_rate=1e-3))
    before = torch.cat(trainer.compute_logprobs(samples)).sum()
    trainer.train_step(samples)
    assert torch.cat(trainer.compute_logprobs(samples)).sum() > before


def test_lr_schedule_counts_optimizer_steps_with_warmup() -> None:
    config = GRPOConfig(lr_scheduler="cosine", warmup_steps=3, total_optimizer_steps=13, min_lr_ratio=0.1)
    factors = [lr_multiplier(step, config) for step in range(14)]
    assert factors[:3] == pytest.approx([0.25, 0.5, 0.75])
    assert factors[3] == pytest.approx(1.0)
    assert factors[13] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(factors[3:]))
    trainer = PolicyTrainer(
        tiny_llama(),
        _config(lr_scheduler="linear", warmup_steps=2, batch_size=1, group_size=4, minibatch_size=2, learning_rate=1.0),
    )
    metrics = trainer.train_step(make_samples(4))  # two optimizer steps: the warmup is over
    assert metrics["optimizer_steps"] == 2
    assert metrics["lr"] == pytest.approx(lr_multiplier(2, trainer.config))


def _rollouts(calls: list[int], group: str = "g") -> list[TokenSample]:
    """Samples of rollouts r0, r1... making ``calls[i]`` calls each (distinct prompts, so each call is traceable)."""
    return [
        TokenSample([1 + i, 2 + c], [3], None, 0.0, group, f"r{i}", advantage=1.0)
        for i, n in enumerate(calls)
        for c in range(n)
    ]


def test_minibatches_keep_rollouts_together_and_their_number_is_fixed() -> None:
    samples = _rollouts([3, 1, 2, 1, 2])
    minibatches = rollout_minibatches(samples, 3, torch.Generator().manual_seed(0))
    assert len(minibatches) == 3
    assert sorted(i for mb in minibatches for i in mb) == list(range(len(samples)))
    rollouts = [[samples[i].rollout_id for i in mb] for mb in minibatches]
    assert sorted(len(set(r)) for r in rollouts) == [1, 2, 2]  # rollout counts differ by at most one
    for ids, mb in zip(rollouts, minibatches, strict=True):
        owners = {r: [samples[i].prompt_ids for i in mb if samples[i].rollout_id == r] for r in ids}
        for rollout, prompts in owners.items():  # a rollout's calls are together and in order
            assert prompts == [s.prompt_ids for s in samples if s.rollout_id == rollout]
    assert [len(mb) for mb in rollout_minibatches(_rollouts([2]), 3, torch.Generator())] == [2, 0, 0]


def test_every_step_advances_the_schedule_by_the_same_number_of_optimizer_steps() -> None:
    # 4 rollouts per step in minibatches of 2 rollouts, 2 epochs: 4 optimizer steps per training step.
    config = _config(batch_size=1, group_size=4, minibatch_size=2, ppo_epochs=2, max_steps=3, lr_scheduler="cosine")
    assert (config.minibatches_per_epoch, config.optimizer_steps_per_step, config.schedule_steps()) == (2, 4, 12)
    trainer = PolicyTrainer(tiny_llama(), config)
    many_calls = trainer.train_step(_rollouts([3, 2, 3, 1]))  # 9 calls: still 2 minibatches per epoch
    assert (many_calls["optimizer_steps"], many_calls["skipped_optimizer_steps"]) == (4, 0)
    one_rollout = trainer.train_step(_rollouts([2]))  # the second minibatch of each epoch is empty
    assert (one_rollout["optimizer_steps"], one_rollout["skipped_optimizer_steps"]) == (6, 2)
    nothing = trainer.skip_step()  # no signal at all
    assert (nothing["optimizer_steps"], nothing["skipped_optimizer_steps"]) == (6, 6)
    assert trainer.global_step == 3
    assert nothing["lr"] == pytest.approx(0.0, abs=1e-12)  # the cosine decay ends with the last step


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_checkpoint_then_resume_reproduces_the_next_step(tmp_path, finetune: str) -> None:
    config = _config(
        finetune=finetune,
        batch_size=2,
        group_size=3,
        minibatch_size=2,
        ppo_epochs=2,
        checkpoint_dir=str(tmp_path),
        lr_scheduler="cosine",
        warmup_steps=1,
    )
    first, second = make_samples(6, seed=1), make_samples(6, seed=2)

    uninterrupted = PolicyTrainer(tiny_llama(), config)
    uninterrupted.train_step(first)
    path = uninterrupted.save_checkpoint(tmp_path, extra_state={"batches_served": 1})
    torch.rand(3)  # RNG use after saving must not matter after a resume
    expected_metrics = uninterrupted.train_step(second)
    expected = _trainable_state(uninterrupted)

    assert latest_checkpoint(tmp_path) == path
    # A LoRA checkpoint holds only the adapter (same base model); a full one holds every weight.
    base = tiny_llama() if finetune == "lora" else tiny_llama(seed=5)
    resumed = PolicyTrainer(base, config.model_copy(update={"seed": 9}))
    extra = resumed.load_checkpoint(path)
    assert extra == {"batches_served": 1}
    assert (resumed.global_step, resumed.optimizer_steps) == (1, 6)
    metrics = resumed.train_step(second)
    assert metrics["loss"] == pytest.approx(expected_metrics["loss"], abs=1e-6)
    assert metrics["lr"] == pytest.approx(expected_metrics["lr"])
    for name, value in _trainable_state(resumed).items():
        assert torch.allclose(value, expected[name], atol=1e-6), name


def test_lora_checkpoint_is_a_loadable_peft_adapter(tmp_path) -> None:
    from peft import PeftModel

    trainer = PolicyTrainer(tiny_llama(), _config())
    trainer.train_step(make_samples(4))
    path = trainer.save_checkpoint(tmp_path)
    assert json.loads((path / "trainer_state.json").read_text())["global_step"] == 1
    reloaded = PeftModel.from_pretrained(tiny_llama(), str(path / "adapter"))
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(reloaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)


def test_bad_checkpoint_is_rejected_and_leaves_weights_intact(tmp_path) -> None:
    trainer = PolicyTrainer(tiny_llama(), _config())
    before = _trainable_state(trainer)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        trainer.load_checkpoint(tmp_path)
    full = PolicyTrainer(tiny_llama(), _config(finetune="full"))
    path = full.save_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="finetune='full'"):
        trainer.load_checkpoint(path)
    for name, value in _trainable_state(trainer).items():
        assert torch.equal(value, before[name])


def test_bfloat16_weights_still_give_float32_logprobs() -> None:
    trainer = PolicyTrainer(tiny_llama(), _config(dtype="bfloat16"))
    samples = make_samples(3)
    logps = trainer.compute_logprobs(samples)
    assert all(lp.dtype == torch.float32 and torch.isfinite(lp).all() for lp in logps)
    assert torch.isfinite(torch.tensor(trainer.train_step(samples)["loss"]))


def test_empty_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        PolicyTrainer(tiny_llama(), _config()).train_step([])
    assert VOCAB > 3


def test_device_is_resolved_and_unavailable_devices_are_rejected() -> None:
    from agentbolt.algorithm.grpo.trainer import resolve_device

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="invalid device 'warp-drive'"):
        resolve_device("warp-drive")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda:0' is not available"):
            PolicyTrainer(tiny_llama(), _config(device="cuda:0"))
    trainer = PolicyTrainer(tiny_llama(), _config(device="cpu"))
    assert trainer.device == torch.device("cpu") and next(trainer.model.parameters()).device.type == "cpu"
    metrics = trainer.train_step(make_samples(4))
    assert metrics["first_minibatch_ratio_max_dev"] < 1e-5


def test_update_threads_apply_to_the_update_only() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        trainer = PolicyTrainer(tiny_llama(), _config(threads=1, update_threads=2))
        with trainer.update_threads():
            assert torch.get_num_threads() == 2
            trainer.train_step(make_samples(4, model=trainer.model))
        assert torch.get_num_threads() == 1
        same = PolicyTrainer(tiny_llama(), _config(threads=1))
        with same.update_threads():
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_gradient_that_is_not_finite_skips_the_step_and_keeps_the_weights(caplog: pytest.LogCaptureFixture) -> None:
    trainer = PolicyTrainer(tiny_llama(), _config(finetune="full", max_grad_norm=1.0))
    before = [p.detach().clone() for p in trainer.trainable_parameters]
    for parameter in trainer.trainable_parameters:
        parameter.grad = torch.full_like(parameter, float("nan"))
    assert math.isnan(trainer._clip_and_step())
    assert "this optimizer step is skipped" in caplog.text
    assert trainer.optimizer_steps == 0 and trainer.skipped_optimizer_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.trainable_parameters, strict=True))
    assert all(p.grad is None for p in trainer.trainable_parameters)


def test_grad_norm_averages_the_steps_taken_and_counts_those_skipped_for_a_non_finite_gradient(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = tiny_llama()
    samples = make_samples(8, model=model)
    samples[0].advantage = math.inf  # overflows the loss of the one minibatch holding rollout ro-0
    trainer = PolicyTrainer(model, _config(batch_size=2, group_size=4, minibatch_size=4))
    metrics = trainer.train_step(samples)
    assert "this optimizer step is skipped" in caplog.text
    assert metrics["nonfinite_grad_steps"] == 1
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert (metrics["optimizer_steps"], metrics["skipped_optimizer_steps"]) == (1, 1)
    assert all(torch.isfinite(p).all() for p in trainer.trainable_parameters)


def test_no_gradient_step_skipped_counts_zero() -> None:
    model = tiny_llama()
    metrics = PolicyTrainer(model, _config(batch_size=2, group_size=4, minibatch_size=4)).train_step(
        make_samples(8, model=model)
    )
    assert metrics["nonfinite_grad_steps"] == 0 and math.isfinite(metrics["grad_norm"])


def test_wrapping_a_model_with_lora_prints_no_deprecation_notice_of_peft() -> None:
    """peft reads transformers' deprecated ``is_gradient_checkpointing``; that notice is not the user's to read."""
    import warnings

    from peft import LoraConfig, PeftModel, get_peft_model

    from agentbolt.utils.imports import peft_wrapping

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with peft_wrapping():
            model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
        warnings.warn("still shown after the block", FutureWarning, stacklevel=1)
    assert isinstance(model, PeftModel)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == ["still shown after the block"]
