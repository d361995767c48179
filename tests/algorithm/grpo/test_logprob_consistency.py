"""The PPO ratio's log-probs are those of the sampling distribution, and the engine agrees with the trainer.

* the trainer scores each response under ``softmax(logits / T)`` at the temperature it was sampled at (ratio,
  entropy), and under the untempered distribution when asked for the engine's convention;
* samples carry the temperature their request asked for, from the gateway span to the ``TokenSample``;
* after real LoRA updates, the in-process engine's log-probs of what it sampled match the trainer's (bfloat16, LoRA
  on q/k/v/o, T = 0.7: the Flow-GRPO CPU configuration), and ``train_step`` reports the gap.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any, List, Sequence

import pytest
import torch
from conftest import make_samples, tiny_llama

from agentbolt.adapter import LlmProxyTraceToTriplet
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import TokenSample, triplets_to_samples
from agentbolt.algorithm.grpo.trainer import PolicyTrainer
from agentbolt.gateway.recording import CallRecord, build_span
from agentbolt.serving.params import SamplingParams
from agentbolt.serving.transformers_engine import TransformersEngine

BOUND = 0.02  # nats: mean |engine - trainer| over sampled tokens


def _config(**overrides: Any) -> GRPOConfig:
    base: dict[str, Any] = {"learning_rate": 1e-2, "micro_batch_size": 4, "max_grad_norm": None, "console": False}
    base.update(overrides)
    return GRPOConfig(**base)


@torch.no_grad()
def _full_logits(model: torch.nn.Module, sample: TokenSample) -> torch.Tensor:
    """Float32 logits predicting each response token, from one unpadded forward."""
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    logits = model(input_ids=ids).logits[0].float()
    return logits[len(sample.prompt_ids) - 1 : -1]


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_tempered_logprobs_are_the_log_softmax_of_logits_over_the_sampling_temperature(temperature: float) -> None:
    model = tiny_llama()
    samples = make_samples(6, model=model, temperature=temperature)
    trainer = PolicyTrainer(model, _config(finetune="full"))
    tempered = trainer.compute_logprobs(samples)
    untempered = trainer.compute_logprobs(samples, tempered=False)
    for sample, mine, raw in zip(samples, tempered, untempered, strict=True):
        logits = _full_logits(trainer.model, sample)
        targets = torch.tensor(sample.response_ids).unsqueeze(1)
        expected = torch.log_softmax(logits / temperature, dim=-1).gather(1, targets).squeeze(1)
        assert torch.allclose(mine, expected, atol=1e-5)
        assert torch.allclose(raw, torch.log_softmax(logits, dim=-1).gather(1, targets).squeeze(1), atol=1e-5)
        assert torch.allclose(raw, torch.tensor(sample.logprobs), atol=1e-5)  # the engine's convention


def test_greedy_samples_are_scored_untempered() -> None:
    model = tiny_llama()
    samples = make_samples(3, model=model)
    for sample in samples:
        sample.temperature = 0.0
    trainer = PolicyTrainer(model, _config(finetune="full"))
    tempered, untempered = trainer.compute_logprobs(samples), trainer.compute_logprobs(samples, tempered=False)
    assert all(torch.equal(mine, raw) for mine, raw in zip(tempered, untempered, strict=True))


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_training_entropy_is_that_of_the_sampling_distribution(ppo_epochs: int) -> None:
    model = tiny_llama()
    samples = make_samples(8, model=model, temperature=0.5)
    trainer = PolicyTrainer(model, _config(finetune="full", ppo_epochs=ppo_epochs, learning_rate=1e-9))
    entropies = []
    for sample in samples:
        probs = torch.softmax(_full_logits(trainer.model, sample) / 0.5, dim=-1)
        entropies.append(-(probs * probs.log()).sum(dim=-1))
    expected = float(torch.cat(entropies).mean())
    metrics = trainer.train_step(samples)
    assert metrics["entropy"] == pytest.approx(expected, rel=1e-4)
    assert metrics["first_minibatch_ratio_max_dev"] < 1e-5
    assert metrics["logprob_engine_diff_mean"] < 1e-5  # the untempered log-probs make_samples recorded


def test_train_step_reports_the_engine_diff_even_without_engine_logprobs() -> None:
    trainer = PolicyTrainer(tiny_llama(), _config())
    metrics = trainer.train_step(make_samples(4))  # no engine log-probs at all
    assert math.isnan(metrics["logprob_engine_diff_mean"]) and math.isnan(metrics["logprob_engine_diff_max"])


def test_engine_logprobs_of_the_wrong_length_are_rejected() -> None:
    model = tiny_llama()
    samples = make_samples(2, model=model)
    samples[1].logprobs = [*(samples[1].logprobs or []), -1.0]
    with pytest.raises(ValueError, match="sample 1 has"):
        PolicyTrainer(model, _config()).train_step(samples)


def _gateway_span(request_extra: dict[str, Any], sequence_id: int) -> Any:
    call = CallRecord(
        rollout_id="ro-1",
        attempt_id="at-1",
        sequence_id=None,
        endpoint="chat/completions",
        request={"model": "policy", "messages": [{"role": "user", "content": "hi"}], **request_extra},
        start_time=time.time(),
    )
    call.succeed(
        200,
        {
            "id": f"chatcmpl-{sequence_id}",
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "yes"},
                    "finish_reason": "stop",
                    "token_ids": [4, 5],
                    "logprobs": {"content": [{"token": "y", "logprob": -0.25}, {"token": "s", "logprob": -0.5}]},
                }
            ],
        },
    )
    return build_span(call, sequence_id)


def test_samples_carry_the_temperature_their_request_was_sampled_at() -> None:
    spans = [
        _gateway_span({"temperature": 0.7, "top_p": 1.0}, 1),
        _gateway_span({}, 2),  # no temperature: the OpenAI default, 1.0
        _gateway_span({"temperature": 0}, 3),  # greedy
    ]
    triplets = LlmProxyTraceToTriplet().adapt(spans)
    assert [t.metadata["request"].get("temperature") for t in triplets] == [0.7, None, 0]
    samples, stats = triplets_to_samples(triplets, rollout_id="ro-1", group_id="g", final_reward=1.0)
    assert stats.missing_logprobs == 0
    assert [s.temperature for s in samples] == [0.7, 1.0, 0.0]
    assert [s.scoring_temperature for s in samples] == [0.7, 1.0, 1.0]
    assert samples[0].logprobs == [-0.25, -0.5]


# --------------------------------------------------------------------------------------------- engine vs trainer


def _sample_together(engine: TransformersEngine, prompts: Sequence[List[int]], temperature: float) -> List[Any]:
    """Sample every prompt once, admitted as one decoding batch, with log-probs."""

    async def run() -> List[Any]:
        with engine.weights_update():  # hold decoding until every request is queued
            tasks = [
                asyncio.ensure_future(
                    engine.generate(
                        prompt, SamplingParams(max_tokens=12, temperature=temperature, seed=i, logprobs=True)
                    )
                )
                for i, prompt in enumerate(prompts)
            ]
            await asyncio.sleep(0.05)
        return list(await asyncio.gather(*tasks))

    samples = []
    for i, (prompt, output) in enumerate(zip(prompts, asyncio.run(run()), strict=True)):
        choice = output.choices[0]
        samples.append(
            TokenSample(
                prompt_ids=list(prompt),
                response_ids=list(choice.token_ids),
                logprobs=list(choice.logprobs or []),
                reward=float(i % 2),
                group_id="g",
                rollout_id=f"ro-{i}",
                advantage=1.0 if i % 2 else -1.0,
                temperature=temperature,
            )
        )
    return samples


def _engine_trainer_gap(model_dir: Path, dtype: str, fast_forward: bool, learning_rate: float) -> List[float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = _config(dtype=dtype, lora_r=16, lora_alpha=32.0, learning_rate=learning_rate, max_grad_norm=1.0)
    trainer = PolicyTrainer(model, config, pad_token_id=tokenizer.pad_token_id or 0)
    engine = TransformersEngine.from_model(trainer.model, tokenizer, served_name="policy", fast_forward=fast_forward)
    engine.default_adapter = trainer.model.active_adapter
    try:
        texts = ["a", "a much longer prompt than the others", "mid size", "x y z", "ping", "tell me more"]
        prompts = [engine.encode_chat([{"role": "user", "content": text}]) for text in texts]
        gaps = []
        for _ in range(3):  # each update changes the adapter the engine serves (LoRA B leaves zero at once)
            samples = _sample_together(engine, prompts, 0.7)
            with engine.weights_update():
                metrics = trainer.train_step(samples)
            gaps.append(metrics["logprob_engine_diff_mean"])
        samples = _sample_together(engine, prompts, 0.7)
        engine_logprobs = torch.tensor([lp for s in samples for lp in s.logprobs or []])
        trainer_logprobs = torch.cat(trainer.compute_logprobs(samples, tempered=False))
        gaps.append(float((engine_logprobs - trainer_logprobs).abs().mean()))
        lora_b = [p for name, p in trainer.model.named_parameters() if "lora_B" in name]
        assert all(float(p.detach().abs().max()) > 0 for p in lora_b)
        return gaps
    finally:
        engine.stop()


@pytest.mark.parametrize("fast_forward", [True, False], ids=["lean-forward", "transformers-forward"])
def test_engine_matches_trainer_after_lora_updates_in_bfloat16(kernel_model_dir: Path, fast_forward: bool) -> None:
    gaps = _engine_trainer_gap(kernel_model_dir, "bfloat16", fast_forward, learning_rate=1e-2)
    assert max(gaps) < BOUND, gaps


@pytest.mark.slow
def test_embedded_engine_matches_trainer_in_the_cpu_configuration() -> None:
    from agentbolt.models import DEFAULT_MODEL, resolve_model

    gaps = _engine_trainer_gap(Path(resolve_model(DEFAULT_MODEL).path), "bfloat16", True, learning_rate=5e-4)
    assert max(gaps) < BOUND, gaps
