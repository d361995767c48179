"""GRPO orchestration parts against a real in-memory store: rollout outcomes, task sampling, options, metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import List, Sequence

import pytest
from pydantic import ValidationError

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO, RolloutOutcome, TaskSampler
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.metrics import TrainingLogger, plot_reward_curve, read_metrics
from agentbolt.types import Span, Triplet


class TokensFromAttributes(agl.TraceAdapter):
    """A user-supplied adapter: spans named ``call`` carry their token ids as attributes."""

    def adapt(self, source: Sequence[Span], /) -> List[Triplet]:
        return [
            Triplet(
                prompt={"token_ids": list(s.attributes["prompt_ids"])},
                response={"token_ids": list(s.attributes["response_ids"]), "logprobs": [-0.5]},
                metadata={"agent_name": s.attributes.get("agent")},
            )
            for s in source
            if s.name == "call"
        ]


def _call_span(rid: str, aid: str) -> Span:
    attributes = {"prompt_ids": [1, 2], "response_ids": [3], "agent": "planner"}
    return Span.from_attributes(rollout_id=rid, attempt_id=aid, sequence_id=1, name="call", attributes=attributes)


async def _play_runner(store: agl.LightningStore, n: int) -> None:
    """Act as a worker for the first ``n`` queued rollouts: the store calls a runner makes.

    ``slow_gateway`` rollouts finish before the span of their LLM call is stored, as when the gateway writes it
    in the background; ``fail`` rollouts make their call and then crash; ``hang`` ones make it and never finish.
    """
    handled = 0
    background = []
    while handled < n:
        attempted = await store.dequeue_rollout(worker_id="w")
        if attempted is None:
            await asyncio.sleep(0.01)
            continue
        rid, aid, kind = attempted.rollout_id, attempted.attempt.attempt_id, attempted.input["kind"]
        if kind in ("ok", "no_reward", "fail", "hang", "nan_reward"):
            await store.add_span(_call_span(rid, aid))
        if kind == "hang":
            handled += 1
            continue
        if kind in ("ok", "slow_gateway", "nan_reward"):
            value = float("nan") if kind == "nan_reward" else 0.75
            await store.add_span(
                Span.from_attributes(
                    rollout_id=rid,
                    attempt_id=aid,
                    sequence_id=2,
                    name="agentlightning.annotation",
                    attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value},
                )
            )
        await store.update_attempt(rid, aid, status="failed" if kind == "fail" else "succeeded")
        if kind == "slow_gateway":

            async def late_write(rid: str = rid, aid: str = aid) -> None:
                await asyncio.sleep(1.5)  # after the 1 s wait for the late rollout is over
                await store.add_span(_call_span(rid, aid))

            background.append(asyncio.create_task(late_write()))
        handled += 1
    await asyncio.gather(*background)


async def _outcomes(algorithm: GRPO, kinds: List[str]) -> List[RolloutOutcome]:
    store = agl.InMemoryLightningStore()
    algorithm.set_store(store)
    tasks = [{"kind": kind} for kind in kinds]
    runner = asyncio.create_task(_play_runner(store, sum(1 for kind in kinds if kind != "never")))
    outcomes = await algorithm._run_rollouts(store, tasks, mode="train", step=0, resources_id=None)  # type: ignore[arg-type]
    await runner
    for outcome in outcomes:
        if outcome.status == "late":
            late = await store.get_rollout_by_id(outcome.rollout_id)
            assert late is not None and late.status == "cancelled"
    return outcomes


KINDS = ["ok", "fail", "no_reward", "slow_gateway", "hang", "never"]  # nobody runs "never": late without a call


async def test_failed_late_and_rewardless_rollouts_are_scored_with_their_calls() -> None:
    algorithm = GRPO(adapter=TokensFromAttributes(), rollout_timeout=1.0, agent_match="plan")
    outcomes = await _outcomes(algorithm, KINDS)
    assert [o.status for o in outcomes] == ["succeeded", "failed", "succeeded", "succeeded", "late", "late"]
    assert [o.reward for o in outcomes] == [0.75, None, None, 0.75, None, None]
    assert [o.usable for o in outcomes] == [True, False, False, True, False, False]
    samples, stats, scores = algorithm._samples(outcomes)
    # The calls of the failed, reward-less and late rollouts are trained on with failed_rollout_reward (0.0), so
    # what led to the failure is pushed down; the call span that arrived after its rollout finished was waited for.
    assert [(s.prompt_ids, s.response_ids, s.reward, s.group_id) for s in samples] == [
        ([1, 2], [3], 0.75, "train-0-0"),
        ([1, 2], [3], 0.0, "train-0-1"),
        ([1, 2], [3], 0.0, "train-0-2"),
        ([1, 2], [3], 0.75, "train-0-3"),
        ([1, 2], [3], 0.0, "train-0-4"),
    ]
    assert stats.calls == 5
    # Every rollout counts once in its group, the one that never made a call too.
    assert [(s.group_id, s.reward) for s in scores] == [
        ("train-0-0", 0.75),
        ("train-0-1", 0.0),
        ("train-0-2", 0.0),
        ("train-0-3", 0.75),
        ("train-0-4", 0.0),
        ("train-0-5", 0.0),
    ]


async def test_failed_rollouts_are_dropped_when_failed_rollout_reward_is_none() -> None:
    algorithm = GRPO(adapter=TokensFromAttributes(), rollout_timeout=1.0, failed_rollout_reward=None)
    outcomes = await _outcomes(algorithm, KINDS)
    samples, stats, scores = algorithm._samples(outcomes)
    assert [(s.reward, s.group_id) for s in samples] == [(0.75, "train-0-0"), (0.75, "train-0-3")]
    assert [(s.group_id, s.reward) for s in scores] == [("train-0-0", 0.75), ("train-0-3", 0.75)]
    assert stats.calls == 2


async def test_a_reward_that_is_not_a_finite_number_counts_as_no_reward(caplog: pytest.LogCaptureFixture) -> None:
    """A NaN reward in a group would make every advantage of the group, and then the update, NaN."""
    algorithm = GRPO(adapter=TokensFromAttributes(), rollout_timeout=5.0)
    outcomes = await _outcomes(algorithm, ["ok", "nan_reward"])
    assert [(o.status, o.reward, o.usable) for o in outcomes] == [("succeeded", 0.75, True), ("succeeded", None, False)]
    assert "reported the reward nan" in caplog.text
    samples, _, scores = algorithm._samples(outcomes)
    assert [s.reward for s in samples] == [0.75, 0.0] and [s.reward for s in scores] == [0.75, 0.0]


def test_per_call_credit_falls_back_to_the_final_reward_for_a_call_reward_that_is_not_finite() -> None:
    from agentbolt.algorithm.grpo.samples import assign_credit

    calls = [Triplet(prompt={}, response={}, reward=r) for r in (0.5, float("nan"), None, float("-inf"))]
    assert assign_credit(calls, 1.0, "per_call") == [0.5, 1.0, 1.0, 1.0]


def test_task_sampler_covers_each_epoch_and_resumes_identically() -> None:
    sampler = TaskSampler(5, 2, seed=3)
    batches = [sampler.next_batch() for _ in range(5)]
    flat = [i for batch in batches for i in batch]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    resumed = TaskSampler(5, 2, seed=3)
    replay = TaskSampler(5, 2, seed=3)
    for _ in range(3):
        replay.next_batch()
    resumed.load_state(json.loads(json.dumps(replay.state())))
    assert [resumed.next_batch() for _ in range(2)] == batches[3:]
    with pytest.raises(ValueError, match="empty"):
        TaskSampler(0, 2, seed=0)


def test_grpo_options_are_validated_and_merged() -> None:
    algorithm = GRPO(GRPOConfig(batch_size=2), group_size=3, model="some/dir")
    assert (algorithm.config.batch_size, algorithm.config.group_size, algorithm.config.model) == (2, 3, "some/dir")
    assert GRPO({"kl_coef": 0.1}).config.kl_coef == 0.1
    with pytest.raises(ValidationError):
        GRPO(group_size=1)
    with pytest.raises(ValidationError):
        GRPO(not_an_option=True)
    with pytest.raises(ValueError, match="tokenizer"):
        GRPO(model=object())
    assert isinstance(agl.GRPO(batch_size=1), GRPO)


async def test_run_without_training_data_is_a_clear_error() -> None:
    algorithm = GRPO(max_steps=3)
    algorithm.set_store(agl.InMemoryLightningStore())
    with pytest.raises(ValueError, match="train_dataset"):
        await algorithm.run(train_dataset=[], val_dataset=None)


def test_metrics_go_to_jsonl_console_and_a_reward_curve(tmp_path: Path) -> None:
    logger = TrainingLogger(log_dir=str(tmp_path), total_steps=3, console=True)
    logger.log(0, {"val/accuracy": 0.0})
    for step, reward in [(1, 0.2), (2, 0.6), (3, float("nan"))]:
        logger.log(step, {"train/reward_mean": reward, "train/reward_std": 0.1, "update/loss": -0.01})
    curve = logger.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[3]["train/reward_mean"] is None  # NaN is stored as null, the file stays valid JSON
    assert curve == tmp_path / "reward_curve.png" and curve.read_bytes()[:4] == b"\x89PNG"
    assert plot_reward_curve([], tmp_path / "empty.png") is None
    with pytest.raises(ValueError, match="log_dir"):
        TrainingLogger(tensorboard=True, console=False)
