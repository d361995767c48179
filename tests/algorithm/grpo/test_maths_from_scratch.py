"""GRPO's maths recomputed from scratch on tiny hand-made inputs and compared with what agentbolt computes.

Every expected value here is written directly with numpy or plain torch (one unpadded forward per sample, the
response's log-probs read from the positions before each response token), never with agentbolt's own maths.
"""

from __future__ import annotations

import copy
import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest
import torch
from conftest import tiny_llama

from agentbolt.adapter.triplet import triplet_token_ids
from agentbolt.algorithm.finetuning.algorithm import mean_std
from agentbolt.algorithm.grpo.advantages import RolloutScore, assign_advantages, group_advantages
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.samples import TokenSample, triplets_to_samples
from agentbolt.algorithm.grpo.trainer import PolicyTrainer, rollout_minibatches
from agentbolt.types import Triplet


# ---------------------------------------------------------------------------------------------------- advantages
def _numpy_advantages(rewards: Sequence[float], mode: str = "std", eps: float = 1e-6) -> Optional[np.ndarray]:
    """Textbook group-relative advantages of one group (population std); None for a group without signal."""
    r = np.asarray(rewards, dtype=np.float64)
    std = r.std(ddof=0)
    if std <= 1e-9 * np.abs(r).max():  # all-equal relative to the rewards' size (all zero included)
        return None
    return (r - r.mean()) / (std + eps) if mode == "std" else r - r.mean()


@pytest.mark.parametrize("mode", ["std", "mean"])
def test_group_advantages_match_numpy_on_groups_of_any_scale(mode: str) -> None:
    groups = {
        "a": [1.0, 0.0, 0.0, 0.0],  # the blog's example
        "b": [1000.0, -250.0, 3.5],  # large scale
        "c": [1e-3, 3e-3],  # small scale
        "d": [0.7, 0.7, 0.7],  # all equal: no signal
        "e": [0.4],  # a group of one: no signal
    }
    values = [r for rewards in groups.values() for r in rewards]
    ids = [g for g, rewards in groups.items() for _ in rewards]
    advantages, n_groups, n_zero = group_advantages(values, ids, mode=mode, eps=1e-6)  # type: ignore[arg-type]
    assert (n_groups, n_zero) == (5, 2)
    start = 0
    for rewards in groups.values():
        got = advantages[start : start + len(rewards)]
        expected = _numpy_advantages(rewards, mode)
        if expected is None:
            assert got == [None] * len(rewards)
        else:
            assert all(a is not None and not math.isnan(a) for a in got)
            np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, rtol=1e-12, atol=1e-12)
        start += len(rewards)
    if mode == "std":
        # Population std 0.433 (the documented choice; the unbiased 0.5 would give +1.5 / -0.5).
        np.testing.assert_allclose(
            advantages[:4], [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], rtol=1e-5
        )
    else:
        np.testing.assert_allclose(advantages[:4], [0.75, -0.25, -0.25, -0.25], rtol=1e-12)


def test_advantages_of_rewards_near_the_float_limits_are_finite() -> None:
    # Deviations of these rewards from their mean (2e308) exceed the largest float, though the advantages do not.
    advantages, _, flat = group_advantages([1.5e308, -1.5e308, 1.5e308], ["g"] * 3)
    assert flat == 0
    np.testing.assert_allclose(advantages, np.array([1.0, -2.0, 1.0]) / math.sqrt(2), rtol=1e-12)
    # Equality is relative to the rewards' size: rewards near the smallest floats still differ, and neither their
    # deviations nor their squares underflow.
    tiny, _, flat = group_advantages([1e-300, 3e-300, 0.0, 2e-300], ["g"] * 4, mode="mean")
    assert flat == 0
    np.testing.assert_allclose(tiny, np.array([-0.5e-300, 1.5e-300, -1.5e-300, 0.5e-300]), rtol=1e-12)
    centred, _, _ = group_advantages([1.5e308, -1.5e308], ["g"] * 2, mode="mean")
    assert centred == [1.5e308, -1.5e308]


def _sample(rollout: str, group: str, reward: float, prompt: Sequence[int] = (1, 2), response: Sequence[int] = (3,)):
    return TokenSample(list(prompt), list(response), None, reward, group, rollout)


def test_every_call_of_a_multi_turn_rollout_gets_its_rollout_advantage() -> None:
    # Final credit: every call carries its rollout's reward. Group g1: r1 (3 calls, reward 1), r2 (1 call, 0),
    # r3 (2 calls, 0), r4 (failed before any call, scored 1). Group g2: r5 (1 call, 2.0), r6 (2 calls, -1.0).
    calls = {"r1": 3, "r2": 1, "r3": 2, "r5": 1, "r6": 2}
    rollout_reward = {"r1": 1.0, "r2": 0.0, "r3": 0.0, "r4": 1.0, "r5": 2.0, "r6": -1.0}
    rollout_group = {"r1": "g1", "r2": "g1", "r3": "g1", "r4": "g1", "r5": "g2", "r6": "g2"}
    samples = [_sample(r, rollout_group[r], rollout_reward[r]) for r, n in calls.items() for _ in range(n)]
    scores = [RolloutScore(r, rollout_group[r], rollout_reward[r]) for r in rollout_reward]
    kept, stats = assign_advantages(samples, rollouts=scores)
    assert len(kept) == len(samples) and stats.groups == 2 and stats.zero_variance_groups == 0
    # From scratch: one reward per rollout, whatever its number of calls.
    expected = {}
    for group in ("g1", "g2"):
        members = [r for r in rollout_reward if rollout_group[r] == group]
        advantages = _numpy_advantages([rollout_reward[r] for r in members])
        assert advantages is not None
        expected.update(zip(members, advantages, strict=True))
    for sample in kept:
        assert sample.advantage == pytest.approx(expected[sample.rollout_id], rel=1e-12)


def test_per_call_credit_weighs_each_rollout_once() -> None:
    # Rollout a: calls rewarded 1 and 0 (weight 1/2 each); rollout b: one call rewarded 0.25.
    samples = [_sample("a", "g", 1.0), _sample("a", "g", 0.0), _sample("b", "g", 0.25)]
    kept, _ = assign_advantages(samples)
    r = np.array([1.0, 0.0, 0.25])
    w = np.array([0.5, 0.5, 1.0]) / 2.0
    mean = (w * r).sum()  # = (mean of a's calls + b's) / 2
    assert mean == pytest.approx((0.5 + 0.25) / 2)
    std = math.sqrt((w * (r - mean) ** 2).sum())
    np.testing.assert_allclose([s.advantage for s in kept], (r - mean) / (std + 1e-6), rtol=1e-12)


def test_non_finite_rewards_are_refused_by_the_maths_and_replaced_upstream() -> None:
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, math.nan], ["g", "g"])
    # per_call credit: a call whose own reward is NaN gets the rollout's final reward.
    triplets = [
        Triplet(prompt={"token_ids": [1, 2]}, response={"token_ids": [3]}, reward=math.nan),
        Triplet(prompt={"token_ids": [1, 2, 3]}, response={"token_ids": [4]}, reward=0.5),
        Triplet(prompt={"token_ids": [1, 2, 3, 4]}, response={"token_ids": [5]}, reward=None),
    ]
    samples, _ = triplets_to_samples(triplets, rollout_id="r", group_id="g", final_reward=2.0, credit="per_call")
    assert [s.reward for s in samples] == [2.0, 0.5, 2.0]


def test_reward_mean_and_std_are_the_population_statistics() -> None:
    rewards = [1.0, 0.0, 0.0, 0.5, 2.0]
    mean, std = mean_std(rewards)
    assert mean == pytest.approx(np.mean(rewards)) and std == pytest.approx(np.std(rewards, ddof=0))


@pytest.mark.parametrize(
    ("request_", "sampled", "scored"),
    [
        ({"temperature": 0.7}, 0.7, 0.7),
        ({"temperature": "0.5"}, 0.5, 0.5),
        ({}, 1.0, 1.0),
        ({"temperature": 0}, 0.0, 1.0),
    ],
)
def test_each_call_is_scored_at_the_temperature_its_request_sampled_at(request_, sampled, scored) -> None:
    triplet = Triplet(prompt={"token_ids": [1, 2]}, response={"token_ids": [3]}, metadata={"request": request_})
    (sample,), _ = triplets_to_samples([triplet], rollout_id="r", group_id="g", final_reward=1.0)
    assert (sample.temperature, sample.scoring_temperature) == (sampled, scored)


# ----------------------------------------------------------------------------------------------------- truncation
def test_calls_longer_than_the_limit_are_dropped_whole_and_a_one_token_response_is_kept() -> None:
    def call(prompt_len: int, response_len: int) -> Triplet:
        return Triplet(
            prompt={"token_ids": list(range(1, prompt_len + 1))},
            response={"token_ids": list(range(1, response_len + 1))},
        )

    triplets = [call(6, 1), call(4, 3), call(7, 1), call(1, 7)]
    samples, stats = triplets_to_samples(
        triplets, rollout_id="r", group_id="g", final_reward=1.0, max_sequence_length=7
    )
    assert stats.too_long == 2
    # The kept calls are exactly the recorded ones, never a truncated prompt with its response.
    assert [(s.prompt_ids, s.response_ids) for s in samples] == [
        (triplet_token_ids(t.prompt), triplet_token_ids(t.response)) for t in triplets[:2]
    ]


# ------------------------------------------------------------------------------------------------ policy update
def _logp(model: torch.nn.Module, sample: TokenSample, *, temperature: Optional[float] = None) -> torch.Tensor:
    """Log-probs of the response tokens from one unpadded forward: token ``k`` of the response is predicted by the
    logits at position ``len(prompt) - 1 + k`` (the first one by the last prompt position)."""
    tokens = torch.tensor([sample.prompt_ids + sample.response_ids])
    logits = model(input_ids=tokens).logits[0].float()
    start = len(sample.prompt_ids) - 1
    rows = logits[start : start + len(sample.response_ids)]
    t = sample.temperature if temperature is None else temperature
    rows = rows / (t if t > 0 else 1.0)
    return torch.log_softmax(rows, dim=-1)[torch.arange(len(sample.response_ids)), torch.tensor(sample.response_ids)]


def _audit_samples() -> List[TokenSample]:
    """Two groups, multi-call rollouts, one-token prompt and response, mixed temperatures (one greedy), signed
    advantages, prompts that are prefixes of other calls' sequences."""
    spec = [
        # prompt, response, rollout, group, temperature, advantage
        ([3, 4, 5], [6, 7], "r1", "g1", 1.0, 1.2),
        ([3, 4, 5, 6, 7, 8], [9], "r1", "g1", 1.0, 1.2),  # second turn of r1, one response token
        ([3, 4, 5], [10, 11, 12], "r2", "g1", 0.7, -0.8),
        ([3, 4, 5], [6, 2, 13, 14], "r3", "g1", 0.7, -0.4),
        ([15, 16], [17], "r4", "g2", 0.0, 0.9),  # greedy: scored untempered
        ([15, 16], [18, 19, 20], "r5", "g2", 1.3, -0.9),
        ([15, 16, 18, 19, 20, 21], [22, 23], "r5", "g2", 1.3, -0.9),
        ([15], [16, 18], "r6", "g2", 1.0, 0.5),  # a one-token prompt: its last position predicts the response
    ]
    return [TokenSample(list(p), list(r), None, 0.0, g, ro, advantage=a, temperature=t) for p, r, ro, g, t, a in spec]


def _reference_loss(
    model: torch.nn.Module,
    samples: Sequence[TokenSample],
    old: Sequence[torch.Tensor],
    ref: Optional[Sequence[torch.Tensor]],
    *,
    aggregation: str,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
) -> Dict[str, torch.Tensor]:
    """The documented objective of one minibatch, written out token by token."""
    calls: Dict[str, int] = {}
    for s in samples:
        calls[s.rollout_id] = calls.get(s.rollout_id, 0) + 1
    total = torch.zeros(())
    pg_sum = kl_sum = ratio_sum = clipped = tokens = 0.0
    for i, s in enumerate(samples):
        logp = _logp(model, s)
        ratio = torch.exp(logp - old[i])
        a = s.advantage
        pg = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a)
        per_token = pg
        if kl_coef > 0:
            assert ref is not None
            d = ref[i] - logp
            kl = torch.exp(d) - d - 1
            per_token = per_token + kl_coef * kl
            kl_sum += float(kl.detach().sum())
        weight = 1.0 if aggregation == "token_mean" else 1.0 / calls[s.rollout_id] / len(s.response_ids)
        total = total + weight * per_token.sum()
        pg_sum += float(pg.detach().sum())
        ratio_sum += float(ratio.detach().sum())
        r = ratio.detach()
        clipped += float(((a > 0) & (r > 1 + clip_high)).sum() + ((a < 0) & (r < 1 - clip_low)).sum())
        tokens += len(s.response_ids)
    normalizer = tokens if aggregation == "token_mean" else float(len(calls))
    return {
        "loss": total / normalizer,
        "pg_sum": torch.tensor(pg_sum),
        "kl_sum": torch.tensor(kl_sum),
        "ratio_sum": torch.tensor(ratio_sum),
        "clipped": torch.tensor(clipped),
        "tokens": torch.tensor(tokens),
    }


def _record_optimizer_steps(trainer: PolicyTrainer) -> List[Dict[str, object]]:
    """Wrap the trainer's optimizer so that each step records the weights it starts from, their gradients and lr."""
    records: List[Dict[str, object]] = []
    original = trainer.optimizer.step

    def step(*args, **kwargs):
        named = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
        records.append(
            {
                "params": {n: p.detach().clone() for n, p in named},
                "grads": {n: p.grad.detach().clone() for n, p in named if p.grad is not None},
                "lr": trainer.optimizer.param_groups[0]["lr"],
            }
        )
        return original(*args, **kwargs)

    trainer.optimizer.step = step  # type: ignore[method-assign]
    return records


@pytest.mark.parametrize("aggregation", ["token_mean", "rollout_mean"])
@pytest.mark.parametrize(("pack", "micro_batch_size"), [(True, 1), (True, 8), (False, 3)])
def test_update_gradients_and_metrics_match_a_from_scratch_objective(
    aggregation: str, pack: bool, micro_batch_size: int
) -> None:
    """Two PPO epochs over one minibatch (full fine-tuning, k3 KL to the initial weights): the second epoch's ratio
    is far from 1, so clipping and the KL are active; both optimizer steps' gradients, and the metrics, must be those
    of the documented objective, whatever the micro-batching and packing."""
    clip_low, clip_high, kl_coef = 0.1, 0.15, 0.3
    model = tiny_llama(seed=3)
    initial = copy.deepcopy(model)
    samples = _audit_samples()
    config = GRPOConfig(
        finetune="full",
        learning_rate=0.05,
        max_grad_norm=None,
        ppo_epochs=2,
        batch_size=2,
        group_size=3,
        micro_batch_size=micro_batch_size,
        pack_shared_prefixes=pack,
        clip_low=clip_low,
        clip_high=clip_high,
        kl_coef=kl_coef,
        loss_aggregation=aggregation,
    )
    trainer = PolicyTrainer(model, config)
    steps = _record_optimizer_steps(trainer)
    metrics = trainer.train_step(samples)
    assert len(steps) == 2

    with torch.no_grad():
        old = [_logp(initial, s) for s in samples]  # the policy before the update, at each sample's temperature
    ref = old  # full fine-tuning: the reference is the initial weights
    scratch = copy.deepcopy(initial)
    totals: Dict[str, float] = {}
    norms = []
    for step in steps:
        scratch.load_state_dict(step["params"])  # type: ignore[arg-type]
        scratch.zero_grad(set_to_none=True)
        parts = _reference_loss(
            scratch,
            samples,
            old,
            ref,
            aggregation=aggregation,
            clip_low=clip_low,
            clip_high=clip_high,
            kl_coef=kl_coef,
        )
        parts["loss"].backward()
        expected = {n: p.grad for n, p in scratch.named_parameters() if p.grad is not None}
        grads: Dict[str, torch.Tensor] = step["grads"]  # type: ignore[assignment]
        assert set(grads) == set(expected)
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in expected.values()]))))
        for key, value in parts.items():
            totals[key] = totals.get(key, 0.0) + float(value.detach())
    assert totals["clipped"] > 0, "the second epoch should clip some tokens (raise learning_rate)"
    assert totals["kl_sum"] > 0
    assert metrics["loss"] == pytest.approx(totals["loss"] / 2, rel=1e-4, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(totals["pg_sum"] / totals["tokens"], rel=1e-4, abs=1e-6)
    assert metrics["kl"] == pytest.approx(totals["kl_sum"] / totals["tokens"], rel=1e-4, abs=1e-7)
    assert metrics["ratio_mean"] == pytest.approx(totals["ratio_sum"] / totals["tokens"], rel=1e-5)
    assert metrics["clip_fraction"] == pytest.approx(totals["clipped"] / totals["tokens"])
    assert metrics["grad_norm"] == pytest.approx(sum(norms) / len(norms), rel=1e-4)
    assert metrics["first_minibatch_ratio_max_dev"] < 1e-5


def test_single_step_update_is_the_policy_gradient_of_the_token_mean() -> None:
    """One optimizer step per update: the ratio is 1, the gradient is that of -sum_t A * logp_t / N (clipped to
    max_grad_norm, the reported norm taken before clipping), and entropy is that of the tempered distribution."""
    model = tiny_llama(seed=4)
    initial = copy.deepcopy(model)
    samples = _audit_samples()
    offsets = []
    with torch.no_grad():  # engine log-probs: untempered, off by a known amount from the trainer's
        for k, s in enumerate(samples[:-1]):  # the last call comes without engine log-probs
            offset = torch.full((len(s.response_ids),), 0.01 * (k + 1)) * (-1) ** k
            s.logprobs = (_logp(initial, s, temperature=1.0) + offset).tolist()
            offsets.append(offset.abs())
    trainer = PolicyTrainer(
        model, GRPOConfig(finetune="full", learning_rate=1e-3, max_grad_norm=0.05, micro_batch_size=2)
    )
    steps = _record_optimizer_steps(trainer)
    metrics = trainer.train_step(samples)
    tokens = sum(len(s.response_ids) for s in samples)
    loss = -sum(s.advantage * _logp(initial, s).sum() for s in samples) / tokens
    loss.backward()
    norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in initial.parameters()])))
    assert norm > 0.05
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-4)
    for name, param in initial.named_parameters():
        clipped = param.grad * (0.05 / (norm + 1e-6))
        torch.testing.assert_close(steps[0]["grads"][name], clipped, rtol=1e-4, atol=1e-7, msg=name)  # type: ignore[index]
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_fraction"] == 0.0
    assert metrics["logprob_engine_diff_mean"] == pytest.approx(float(torch.cat(offsets).mean()), abs=1e-5)
    assert metrics["logprob_engine_diff_max"] == pytest.approx(float(torch.cat(offsets).max()), abs=1e-5)
    # The loss value is the clipped surrogate at ratio 1: -sum_t A / N.
    assert metrics["loss"] == pytest.approx(-sum(s.advantage * len(s.response_ids) for s in samples) / tokens)
    entropies = []
    with torch.no_grad():
        for s in samples:
            logits = initial(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float()
            rows = logits[len(s.prompt_ids) - 1 : -1] / (s.temperature if s.temperature > 0 else 1.0)
            probs = torch.softmax(rows, dim=-1)
            entropies.append(-(probs * torch.log(probs)).sum(dim=-1))
    assert metrics["entropy"] == pytest.approx(float(torch.cat(entropies).mean()), rel=1e-5)


def test_minibatches_each_take_the_token_mean_of_their_own_rollouts() -> None:
    """Two minibatches of whole rollouts: each optimizer step's gradient is its minibatch's token mean, with the
    old log-probs of the policy before the update."""
    model = tiny_llama(seed=7)
    initial = copy.deepcopy(model)
    samples = _audit_samples()
    config = GRPOConfig(
        finetune="full", learning_rate=0.05, max_grad_norm=None, batch_size=2, group_size=3, minibatch_size=3
    )
    trainer = PolicyTrainer(model, config)
    shuffle = torch.Generator()
    shuffle.set_state(trainer.generator.get_state())
    minibatches = rollout_minibatches(samples, config.minibatches_per_epoch, shuffle)  # the split the update makes
    rollouts = [{samples[i].rollout_id for i in mb} for mb in minibatches]
    assert len(minibatches) == 2 and rollouts[0].isdisjoint(rollouts[1])
    assert sorted(i for mb in minibatches for i in mb) == list(range(len(samples)))  # whole rollouts, every call
    steps = _record_optimizer_steps(trainer)
    trainer.train_step(samples)
    assert len(steps) == 2
    with torch.no_grad():
        old = [_logp(initial, s) for s in samples]
    scratch = copy.deepcopy(initial)
    for step, mb in zip(steps, minibatches, strict=True):
        scratch.load_state_dict(step["params"])  # type: ignore[arg-type]
        scratch.zero_grad(set_to_none=True)
        _reference_loss(
            scratch,
            [samples[i] for i in mb],
            [old[i] for i in mb],
            None,
            aggregation="token_mean",
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            kl_coef=0.0,
        )["loss"].backward()
        grads: Dict[str, torch.Tensor] = step["grads"]  # type: ignore[assignment]
        for name, param in scratch.named_parameters():
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_lora_kl_is_k3_to_the_base_model_on_response_tokens_only() -> None:
    model = tiny_llama(seed=5)
    samples = _audit_samples()
    trainer = PolicyTrainer(model, GRPOConfig(learning_rate=1e-3, max_grad_norm=None, kl_coef=0.5, micro_batch_size=4))
    torch.manual_seed(11)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)  # move the policy away from the base model
    policy = trainer.model
    with torch.no_grad():
        logp = [_logp(policy, s) for s in samples]
        with policy.disable_adapter():
            base = [_logp(policy, s) for s in samples]
        torch.testing.assert_close(trainer.compute_logprobs(samples, reference=True), base, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(trainer.compute_logprobs(samples), logp, rtol=1e-5, atol=1e-6)
    metrics = trainer.train_step(samples)
    kl = torch.cat([torch.exp(b - p) - (b - p) - 1 for p, b in zip(logp, base, strict=True)])
    assert float(kl.mean()) > 1e-3
    assert metrics["kl"] == pytest.approx(float(kl.mean()), rel=1e-4)


def test_untempered_logprobs_use_the_same_positions() -> None:
    model = tiny_llama(seed=6)
    samples = _audit_samples()
    trainer = PolicyTrainer(copy.deepcopy(model), GRPOConfig(finetune="full", micro_batch_size=3))
    with torch.no_grad():
        expected = [_logp(model, s, temperature=1.0) for s in samples]
    torch.testing.assert_close(trainer.compute_logprobs(samples, tempered=False), expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------------ schedule
@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
def test_learning_rate_follows_the_schedule_in_optimizer_steps(scheduler: str) -> None:
    """3 training steps x 2 PPO epochs = 6 optimizer steps: 2 of linear warm-up, then decay to min_lr_ratio."""
    peak, floor, warmup = 0.01, 0.1, 2
    config = GRPOConfig(
        finetune="full",
        learning_rate=peak,
        lr_scheduler=scheduler,
        warmup_steps=warmup,
        min_lr_ratio=floor,
        max_steps=3,
        ppo_epochs=2,
        batch_size=2,
        group_size=3,
    )
    trainer = PolicyTrainer(tiny_llama(), config)
    steps = _record_optimizer_steps(trainer)
    reported = []
    for _ in range(3):
        reported.append(trainer.train_step(_audit_samples())["lr"])
    total = 6

    def expected(k: int) -> float:  # learning rate of optimizer step k (0-based)
        if k < warmup:
            return peak * (k + 1) / (warmup + 1)
        progress = min(1.0, (k - warmup) / (total - warmup))
        shape = 1 - progress if scheduler == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return peak * (floor + (1 - floor) * shape)

    assert [s["lr"] for s in steps] == pytest.approx([expected(k) for k in range(total)])
    assert reported == pytest.approx([expected(2), expected(4), expected(6)])
    assert reported[-1] == pytest.approx(peak * floor)
