"""Credit assignment, group advantages, the clipped loss, k3 KL and config validation."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from agentbolt.algorithm.grpo.advantages import RolloutScore, assign_advantages, group_advantages
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.loss import (
    entropy_from_logits,
    k3_kl,
    logprobs_and_entropy,
    masked_mean,
    policy_loss,
    token_logprobs,
)
from agentbolt.algorithm.grpo.samples import TokenSample, parse_logprobs, sampling_temperature, triplets_to_samples
from agentbolt.algorithm.grpo.trainer import sample_weights
from agentbolt.types import Triplet


def _triplet(prompt, response, *, reward=None, agent=None, logprobs=None) -> Triplet:
    resp = {"token_ids": response}
    if logprobs is not None:
        resp["logprobs"] = logprobs
    return Triplet(prompt={"token_ids": prompt}, response=resp, reward=reward, metadata={"agent_name": agent})


# ---------------------------------------------------------------------------------------------------- advantages
def test_group_advantages_ordinary_and_all_equal_groups() -> None:
    values = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 3.0, 1.0]
    groups = ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"]
    advantages, n_groups, n_zero = group_advantages(values, groups, mode="std", eps=1e-6)
    assert (n_groups, n_zero) == (3, 1)
    # group a: mean 0.5, population std 0.5
    assert advantages[:4] == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert advantages[4:8] == [None] * 4
    assert advantages[8:] == pytest.approx([1.0, -1.0], abs=1e-5)
    mean_only, _, _ = group_advantages(values, groups, mode="mean")
    assert mean_only[:4] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert mean_only[8:] == pytest.approx([1.0, -1.0])
    assert sum(a for a in advantages if a is not None) == pytest.approx(0.0, abs=1e-9)


def test_group_advantages_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="3 values, 2 group ids"):
        group_advantages([1.0, 2.0, 3.0], ["a", "b"])
    with pytest.raises(ValueError, match="weights must be positive"):
        group_advantages([1.0, 2.0], ["a", "a"], weights=[1.0, 0.0])


def _sample(rollout: str, group: str, reward: float) -> TokenSample:
    return TokenSample([1], [2], None, reward, group, rollout)


def test_final_credit_counts_each_rollout_once_and_skips_all_equal_groups() -> None:
    # Rollout r1 made three calls, r2 one: the group statistics must not be weighted by call count.
    samples = [_sample("r1", "t1", 1.0)] * 3 + [_sample("r2", "t1", 0.0)]
    samples = [TokenSample(s.prompt_ids, s.response_ids, None, s.reward, s.group_id, s.rollout_id) for s in samples]
    samples += [_sample("r3", "t2", 1.0), _sample("r4", "t2", 1.0)]
    kept, stats = assign_advantages(samples, mode="std", eps=0.0)
    assert [s.advantage for s in kept] == pytest.approx([1.0, 1.0, 1.0, -1.0])
    assert (stats.groups, stats.zero_variance_groups, stats.kept_samples, stats.skipped_samples) == (2, 1, 4, 2)


def test_per_call_credit_normalises_calls() -> None:
    samples = [_sample("r1", "t", 1.0), _sample("r1", "t", 0.0), _sample("r2", "t", 0.0), _sample("r2", "t", 0.0)]
    kept, stats = assign_advantages(samples, mode="mean")
    assert [s.advantage for s in kept] == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert stats.zero_variance_groups == 0


def test_per_call_rewards_weigh_each_rollout_once_in_the_group_statistics() -> None:
    # r1 made three calls, r2 one: r1's calls share one rollout's weight, so the group mean is 0.5, not 0.75.
    samples = [_sample("r1", "t", 1.0), _sample("r1", "t", 1.0), _sample("r1", "t", 1.0), _sample("r2", "t", 0.0)]
    kept, _ = assign_advantages(samples, mode="mean")
    assert [s.advantage for s in kept] == pytest.approx([0.5, 0.5, 0.5, -0.5])


def test_rollouts_without_samples_count_in_their_group() -> None:
    # Four rollouts crashed before any LLM call (scored 0), four succeeded with reward 1 (one call each): the
    # successes are better than their group, not equal to it.
    samples = [_sample(f"ok{i}", "t", 1.0) for i in range(4)]
    rollouts = [RolloutScore(f"ok{i}", "t", 1.0) for i in range(4)]
    rollouts += [RolloutScore(f"crash{i}", "t", 0.0) for i in range(4)]
    kept, stats = assign_advantages(samples, rollouts=rollouts, mode="std", eps=0.0)
    assert [s.advantage for s in kept] == pytest.approx([1.0] * 4)
    assert (stats.groups, stats.zero_variance_groups, stats.kept_samples) == (1, 0, 4)
    # Without them the survivors' group has no variance and teaches nothing.
    assert assign_advantages(samples, mode="std")[0] == []


def test_a_rollout_score_must_match_its_samples() -> None:
    with pytest.raises(ValueError, match="r1"):
        assign_advantages([_sample("r1", "t", 1.0)], rollouts=[RolloutScore("r1", "other", 1.0)])
    with pytest.raises(ValueError, match="r2"):
        assign_advantages([_sample("r2", "t", 1.0)], rollouts=[RolloutScore("r1", "t", 1.0)])


# ------------------------------------------------------------------------------------------------------- samples
def test_every_call_of_the_trained_agent_becomes_a_sample() -> None:
    triplets = [
        _triplet([1, 2], [3], agent="planner", logprobs=[{"token": "a", "logprob": -0.5}]),
        _triplet([1, 2, 3, 4], [5, 6], agent="executor", logprobs=[-0.1, -0.2]),
        _triplet([1, 2, 3, 4, 5, 6], [7, 8], agent="planner", reward=0.25, logprobs={"content": [-0.3, -0.4]}),
        _triplet([], [9], agent="planner"),
    ]
    samples, stats = triplets_to_samples(
        triplets, rollout_id="ro", group_id="task", final_reward=1.0, agent_match="^plan"
    )
    assert [s.prompt_ids for s in samples] == [[1, 2], [1, 2, 3, 4, 5, 6]]
    assert [s.logprobs for s in samples] == [[-0.5], [-0.3, -0.4]]
    assert [s.reward for s in samples] == [1.0, 1.0]
    assert (stats.calls, stats.other_agents, stats.missing_tokens) == (4, 1, 1)

    per_call, _ = triplets_to_samples(triplets, rollout_id="ro", group_id="task", final_reward=1.0, credit="per_call")
    assert [s.reward for s in per_call] == [1.0, 1.0, 0.25]
    assert all(s.group_id == "task" and s.rollout_id == "ro" for s in per_call)


def test_long_calls_are_dropped_not_truncated() -> None:
    samples, stats = triplets_to_samples(
        [_triplet([1] * 5, [2] * 3), _triplet([1] * 2, [2] * 2)],
        rollout_id="r",
        group_id="g",
        final_reward=0.0,
        max_sequence_length=6,
    )
    assert [s.num_tokens for s in samples] == [4]
    assert stats.too_long == 1


@pytest.mark.parametrize(
    "raw",
    [None, [-0.1], [-0.1, "x"], [-0.1, float("nan")], [{"token": "a"}, {"logprob": -1.0}], [True, -1.0], "bad"],
)
def test_malformed_logprobs_are_treated_as_missing(raw) -> None:
    assert parse_logprobs(raw, 2) is None


def test_missing_logprobs_are_counted() -> None:
    _, stats = triplets_to_samples(
        [_triplet([1], [2, 3], logprobs=[-1.0])], rollout_id="r", group_id="g", final_reward=0.0
    )
    assert stats.missing_logprobs == 1


# ---------------------------------------------------------------------------------------------------------- loss
def test_clipped_objective_per_token() -> None:
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 2.0]]))
    mask = torch.tensor([[True, True, True, False]])
    positive = policy_loss(logp, old, torch.tensor([2.0]), mask, clip_low=0.2, clip_high=0.3, normalizer=3)
    # A>0: min(r*A, clip(r)*A) -> [1.3*2, 0.5*2, 1.1*2]; token-mean over the 3 masked tokens.
    assert float(positive.loss) == pytest.approx(-(2.6 + 1.0 + 2.2) / 3, rel=1e-6)
    assert positive.clipped_tokens == 1 and positive.tokens == 3
    negative = policy_loss(logp, old, torch.tensor([-1.0]), mask, clip_low=0.2, clip_high=0.3, normalizer=3)
    # A<0: min(-r, -clip(r)) -> [-1.5, -0.8, -1.1]
    assert float(negative.loss) == pytest.approx((1.5 + 0.8 + 1.1) / 3, rel=1e-6)
    assert negative.clipped_tokens == 1


def _shared_token_gradient(aggregation: str) -> float:
    """The gradient on the logit of a token that every call of a group sends: one rollout solved it in 1 call
    (advantage +1), the other failed in 3 calls (advantage -1), and each call replies with that one token."""
    logit = torch.zeros(2, requires_grad=True)
    samples = [TokenSample([1], [0], None, 1.0, "q", "solved", advantage=1.0)] + [
        TokenSample([1], [0], None, 0.0, "q", "failed", advantage=-1.0) for _ in range(3)
    ]
    weights = sample_weights(samples, aggregation)
    logp = torch.log_softmax(logit, dim=0)[0].expand(len(samples), 1)
    parts = policy_loss(
        logp,
        logp.detach(),
        torch.tensor([s.advantage for s in samples]),
        torch.ones(len(samples), 1, dtype=torch.bool),
        clip_low=0.2,
        clip_high=0.2,
        normalizer=sum(weights),
        token_weights=torch.tensor([w / len(s.response_ids) for w, s in zip(weights, samples, strict=True)]),
    )
    parts.loss.backward()
    assert logit.grad is not None
    return float(logit.grad[0])


def test_rollout_mean_leaves_what_every_rollout_shares_alone() -> None:
    # token_mean: the failed rollout's three calls outweigh the solved one's call, so gradient descent pushes the
    # shared token down (a positive gradient on its logit) although neither rollout did better by choosing it.
    assert _shared_token_gradient("token_mean") == pytest.approx(0.25)  # -(1 - 3) / 4 * d logp/d logit (0.5)
    assert _shared_token_gradient("rollout_mean") == pytest.approx(0.0, abs=1e-7)


def test_sample_weights() -> None:
    samples = [
        TokenSample([1], [5, 6, 7], None, 1.0, "q", "a"),
        TokenSample([1], [5], None, 0.0, "q", "b"),
        TokenSample([1], [5, 6], None, 0.0, "q", "b"),
    ]
    assert sample_weights(samples, "token_mean") == [3.0, 1.0, 2.0]
    assert sample_weights(samples, "rollout_mean") == [1.0, 0.5, 0.5]
    with pytest.raises(ValueError, match="rollout_mean"):
        sample_weights(samples, "sequence_mean")
    with pytest.raises(ValidationError):
        GRPOConfig(model="m", loss_aggregation="sequence_mean")


def test_clipped_tokens_get_no_gradient() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    parts = policy_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        clip_low=0.2,
        clip_high=0.2,
        normalizer=2,
    )
    parts.loss.backward()
    assert logp.grad[0, 0] == 0  # ratio 1.5 > 1.2 with A > 0: clipped
    assert logp.grad[0, 1] == pytest.approx(-1.1 / 2)


def test_k3_kl_and_its_use_in_the_loss() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    assert torch.allclose(k3_kl(logp, logp), torch.zeros(1, 3))
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    kl = k3_kl(logp, ref)
    assert (kl >= 0).all()
    assert float(kl[0, 0]) == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    mask = torch.ones(1, 3, dtype=torch.bool)
    base = policy_loss(logp, logp, torch.tensor([0.0]), mask, clip_low=0.2, clip_high=0.2, normalizer=3)
    with_kl = policy_loss(
        logp, logp, torch.tensor([0.0]), mask, clip_low=0.2, clip_high=0.2, normalizer=3, ref_logp=ref, kl_coef=0.1
    )
    assert float(with_kl.loss - base.loss) == pytest.approx(0.1 * float(kl.sum()) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, logp, torch.tensor([0.0]), mask, clip_low=0.2, clip_high=0.2, normalizer=3, kl_coef=0.1)


def test_masked_columns_never_reach_the_loss_or_its_gradient() -> None:
    # A masked column (a prompt token, padding) may hold a log-prob far below the reference's 0 padding: exp() of the
    # difference overflows in float32, and inf * 0 would make the loss and every gradient NaN.
    logp = torch.tensor([[-95.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[False, True]])
    parts = policy_loss(
        logp,
        torch.tensor([[0.0, -1.0]]),
        torch.tensor([1.0]),
        mask,
        clip_low=0.2,
        clip_high=0.28,
        normalizer=1.0,
        ref_logp=torch.tensor([[0.0, -1.1]]),
        kl_coef=1e-3,
    )
    parts.loss.backward()
    kl = float(k3_kl(torch.tensor([-1.0]), torch.tensor([-1.1])))
    assert float(parts.loss) == pytest.approx(-1.0 + 1e-3 * kl, rel=1e-6)
    assert logp.grad is not None and torch.isfinite(logp.grad).all() and float(logp.grad[0, 0]) == 0.0
    assert parts.kl_sum == pytest.approx(kl, rel=1e-5) and parts.ratio_sum == pytest.approx(1.0)


def test_logprobs_entropy_and_masked_mean() -> None:
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    targets = torch.tensor([[2, 1]])
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected)
    assert float(entropy_from_logits(logits)[0, 1]) == pytest.approx(math.log(3))
    assert float(masked_mean(torch.tensor([1.0, 5.0, 3.0]), torch.tensor([True, False, True]))) == 2.0
    # The fused version gives the same values and the same gradient, with large logits too.
    generator = torch.Generator().manual_seed(0)
    big = (torch.randn(2, 3, 50, generator=generator) * 30).requires_grad_(True)
    ids = torch.randint(0, 50, (2, 3), generator=generator)
    fused_logp, fused_entropy = logprobs_and_entropy(big, ids)
    assert torch.allclose(fused_logp, token_logprobs(big, ids), atol=1e-5)
    # Entropies near 0 (one dominant logit) are sums of tiny terms: float32 rounding shows at about 1e-5.
    assert torch.allclose(fused_entropy, entropy_from_logits(big.detach()), rtol=1e-4, atol=1e-4)
    (grad_fused,) = torch.autograd.grad(fused_logp.sum(), big)
    (grad_plain,) = torch.autograd.grad(token_logprobs(big, ids).sum(), big)
    assert torch.allclose(grad_fused, grad_plain, atol=1e-6)
    assert float(masked_mean(torch.tensor([1.0]), torch.tensor([False]))) == 0.0


# -------------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "bad",
    [
        {"group_size": 1},
        {"clip_low": 1.0},
        {"lora_dropout": -0.1},
        {"advantage_mode": "median"},
        {"lora_target_modules": []},
        {"adam_betas": (0.9, 1.0)},
        {"tensorboard": True},
        {"unknown_option": 1},
        {"dtype": "int8"},
    ],
)
def test_config_rejects_bad_values(bad) -> None:
    with pytest.raises(ValidationError):
        GRPOConfig(**bad)


def test_config_sizes_the_decay_to_the_run() -> None:
    config = GRPOConfig(batch_size=4, group_size=4, minibatch_size=6, ppo_epochs=2, max_steps=10)
    assert (config.rollouts_per_step, config.minibatches_per_epoch, config.optimizer_steps_per_step) == (16, 3, 6)
    assert config.schedule_steps() == 10 * 2 * 3
    assert GRPOConfig(batch_size=4, group_size=4).optimizer_steps_per_step == 1  # no minibatch_size: one
    assert GRPOConfig(total_optimizer_steps=7).schedule_steps() == 7


def test_group_advantages_take_rewards_of_any_size_and_refuse_non_numbers() -> None:
    advantages, groups, flat = group_advantages([1e200, -1e200, 0.0, 0.0], ["g"] * 4)
    assert advantages == pytest.approx([math.sqrt(2), -math.sqrt(2), 0.0, 0.0]) and (groups, flat) == (1, 0)
    for bad in (float("nan"), float("inf"), None, "1"):
        with pytest.raises(ValueError, match="values must be finite numbers"):
            group_advantages([1.0, bad], ["g", "g"])  # type: ignore[list-item]


def test_calls_with_ids_outside_the_vocabulary_are_skipped_and_counted() -> None:
    # Token ids made by another model's tokenizer: the trained model has no row to embed them.
    triplets = [_triplet([1, 2], [3]), _triplet([1, 2], [31_999]), _triplet([40_000, 2], [3])]
    samples, stats = triplets_to_samples(triplets, rollout_id="r", group_id="g", final_reward=1.0, vocab_size=32_000)
    assert [s.response_ids for s in samples] == [[3], [31_999]]
    assert stats.out_of_vocabulary == 1
    unchecked, _ = triplets_to_samples(triplets, rollout_id="r", group_id="g", final_reward=1.0)
    assert len(unchecked) == 3


def test_calls_sampled_off_the_policys_distribution_are_counted_from_their_recorded_request() -> None:
    """A guided or truncated request (set by the agent, out of GRPOConfig's sight) is recorded, read back by the
    adapter and counted: its tokens were not drawn from the policy the trainer scores them under."""
    from agentbolt.adapter import TracerTraceToTriplet
    from agentbolt.llm_call_attributes import request_attributes
    from agentbolt.types import Span

    def call(span_id: str, sequence_id: int, **sampling: Any) -> Span:
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, **sampling}
        attributes = {**request_attributes(request), "prompt_token_ids": [1, 2], "response_token_ids": [3, 4]}
        return Span.from_attributes(
            attributes=attributes,
            name="openai.chat.completion",
            span_id=span_id,
            rollout_id="ro",
            attempt_id="at",
            sequence_id=sequence_id,
            start_time=float(sequence_id),
            end_time=sequence_id + 0.5,
        )

    spans = [call("a", 1), call("b", 2, guided_regex="[0-9]+"), call("c", 3, top_p=0.9), call("d", 4, top_p=1.0)]
    triplets = TracerTraceToTriplet().adapt(spans)
    samples, stats = triplets_to_samples(triplets, rollout_id="ro", group_id="task", final_reward=1.0)
    assert len(samples) == 4 and stats.off_distribution == 2  # top_p=1.0 leaves the distribution as it is
    assert [sampling_temperature(t) for t in triplets] == [0.7] * 4
