"""What a training step counts, through the full stack (store, runner, gateway, in-process engine, trainer).

The agents here use a rollout counter instead of the model's answers to decide what happens, so every step's
counts are known in advance: one runner takes the rollouts in the order GRPO enqueued them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from word_model import ask, build_word_model, fit

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO


@pytest.fixture(scope="module")
def word_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_model(tmp_path_factory.mktemp("word-llama"))


def _algorithm(model_dir: Path, **options: object) -> GRPO:
    base = {
        "model": str(model_dir),
        "served_model_name": "word-llama",
        "finetune": "full",
        "learning_rate": 1e-3,
        "console": False,
        "rollout_timeout": 120,
        "seed": 0,
    }
    return GRPO(**{**base, **options})


def test_failed_rollouts_count_in_their_group_and_their_calls_are_pushed_down(word_model: Path) -> None:
    counter = itertools.count()

    @agl.rollout
    async def crashing_agent(task: dict, llm: agl.LLM) -> float:
        # In every run of four rollouts: a success, a crash after the LLM call, a success, a crash before it.
        n = next(counter) % 4
        if n == 3:
            raise RuntimeError("crashed before calling the model")
        await ask(llm, task["prompt"])
        if n == 1:
            raise RuntimeError("crashed after calling the model")
        return 1.0

    algorithm = _algorithm(word_model, batch_size=1, group_size=4, max_steps=2)
    fit(algorithm, crashing_agent, train=[{"prompt": "ping"}], val=[{"prompt": "ping"}] * 4)

    validations = [r for r in algorithm.history if "val/accuracy" in r]
    assert [r["step"] for r in validations] == [0, 2]
    for record in validations:  # failed rollouts are incorrect and score failed_rollout_reward (0.0)
        assert (record["val/accuracy"], record["val/reward_mean"], record["val/failed_rollouts"]) == (0.5, 0.5, 2)
    train = [r for r in algorithm.history if "train/reward_mean" in r]
    assert len(train) == 2
    for record in train:
        counts = {k: v for k, v in record.items() if k.startswith(("rollouts/", "samples/", "groups/", "train/"))}
        assert counts["train/reward_mean"] == 0.5, counts  # over all four rollouts, not the two survivors
        assert (counts["rollouts/failed"], counts["rollouts/failed_scored"], counts["rollouts/late"]) == (2, 2, 0)
        assert counts["groups/zero_variance"] == 0, counts  # the survivors alone would all score 1
        # The two successes and the call made before the crash are trained on; the other crash made no call.
        assert (counts["samples/calls"], counts["samples/from_failed"], counts["samples/trained"]) == (3, 1, 3)


def test_the_lr_schedule_spans_exactly_the_optimizer_steps_taken(word_model: Path) -> None:
    counter = itertools.count()

    @agl.rollout
    async def planner(task: dict, llm: agl.LLM) -> float:
        n = next(counter)  # rollouts 0-7 are step 1, 8-15 step 2...
        for _ in range(1 + n % 3):  # one to three LLM calls per rollout
            await ask(llm, task["prompt"])
        if 8 <= n < 20:
            return 1.0  # step 2 and the first group of step 3 score all alike: no signal
        return float(n % 2)

    algorithm = _algorithm(
        word_model,
        batch_size=2,
        group_size=4,
        max_steps=4,
        minibatch_size=3,  # 8 rollouts per step: 3 minibatches per epoch
        ppo_epochs=2,
        lr_scheduler="cosine",
        warmup_steps=2,
        min_lr_ratio=0.1,
        learning_rate=1e-3,
    )
    fit(algorithm, planner, train=[{"prompt": "ping"}, {"prompt": "pong"}])

    train = [r for r in algorithm.history if "train/reward_mean" in r]
    last = train[-1]
    # The cosine decay ends exactly with the run: 4 steps x 2 epochs x 3 minibatches, whatever the number of calls
    # per rollout and whether a step had anything to train.
    assert last["update/optimizer_steps"] + last.get("update/skipped_optimizer_steps", 0.0) == 24
    assert last["update/lr"] == pytest.approx(1e-4)
    counts = [(r.get("update/optimizer_steps"), r.get("update/skipped_optimizer_steps")) for r in train]
    assert counts == [(6, 0), (6, 6), (12, 6), (18, 6)]
    assert [r["samples/trained"] > 0 for r in train] == [True, False, True, True]


def _step_counts(algorithm: GRPO) -> list[dict[str, float]]:
    train = [r for r in algorithm.history if "train/reward_mean" in r]
    return [{k: v for k, v in r.items() if k.startswith(("rollouts/", "samples/", "groups/"))} for r in train]


def test_dynamic_sampling_makes_up_for_groups_without_a_signal(word_model: Path) -> None:
    counter = itertools.count()

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        n = next(counter)  # rollouts 0-3: the first group, 4-7 the second, 8-11 the group drawn to make up
        await ask(llm, task["prompt"])
        return 1.0 if n < 4 else float(n % 2)  # the first group scores all alike: no signal

    algorithm = _algorithm(word_model, batch_size=2, group_size=4, max_steps=1, resample_rounds=3)
    fit(algorithm, agent, train=[{"prompt": "ping"}, {"prompt": "pong"}, {"prompt": "pang"}])

    # One round of one task was enough: two groups with a signal, as many as batch_size.
    [counts] = _step_counts(algorithm)
    assert (counts["groups/total"], counts["groups/zero_variance"], counts["groups/resampled"]) == (3, 1, 1)
    assert (counts["rollouts/total"], counts["samples/trained"]) == (12, 8)


def test_dynamic_sampling_stops_after_its_rounds(word_model: Path) -> None:
    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        await ask(llm, task["prompt"])
        return 1.0  # no group ever carries a signal

    algorithm = _algorithm(word_model, batch_size=2, group_size=2, max_steps=1, resample_rounds=2)
    fit(algorithm, agent, train=[{"prompt": "ping"}, {"prompt": "pong"}, {"prompt": "pang"}])

    [counts] = _step_counts(algorithm)
    assert (counts["groups/total"], counts["groups/zero_variance"], counts["groups/resampled"]) == (6, 6, 4)
    assert (counts["rollouts/total"], counts["samples/trained"]) == (12, 0)


def test_dynamic_sampling_judges_groups_by_the_rewards_it_trains_on(word_model: Path) -> None:
    counter = itertools.count()

    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        n = next(counter)  # rollouts 0-3: the first group, 4-7 the group drawn to make up for it
        await ask(llm, task["prompt"])
        # Per-call credit trains on this reward: alike in the first group, different in the second.
        agl.emit_reward(0.5 if n < 4 else float(n % 2))
        return float(n % 2)  # final rewards that differ in both groups

    algorithm = _algorithm(word_model, batch_size=1, group_size=4, max_steps=1, resample_rounds=2, credit="per_call")
    fit(algorithm, agent, train=[{"prompt": "ping"}, {"prompt": "pong"}])

    # The first group's final rewards differ, but the samples it would train on all got 0.5: it has no signal.
    [counts] = _step_counts(algorithm)
    assert (counts["groups/total"], counts["groups/zero_variance"], counts["groups/resampled"]) == (2, 1, 1)
    assert (counts["rollouts/total"], counts["samples/trained"]) == (8, 4)


def _unchanged_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "the policy is unchanged" in r.getMessage()]


def test_a_step_whose_groups_all_score_alike_warns_naming_equal_rewards_and_the_temperature(
    word_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        await ask(llm, task["prompt"])
        return 1.0  # every rollout of every group alike: no signal

    algorithm = _algorithm(
        word_model, batch_size=2, group_size=2, max_steps=1, sampling_parameters={"temperature": 0.7}
    )
    with caplog.at_level("WARNING"):
        fit(algorithm, agent, train=[{"prompt": "ping"}, {"prompt": "pong"}])

    (warning,) = _unchanged_warnings(caplog)
    assert "Step 1" in warning
    assert "in each of the 2 group(s) every rollout got the same reward (rewards seen: 1)" in warning
    assert "sampled at temperature 0.7; likely cause" in warning  # as configured: nothing more to say
    assert "always or never solves these tasks at this temperature" in warning


def test_a_step_without_signal_from_greedy_calls_names_greedy_sampling_as_the_cause(
    word_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @agl.rollout
    async def greedy_agent(task: dict, llm: agl.LLM) -> float:
        # The agent overrides the published sampling parameters with its own temperature.
        await ask(agl.LLM(endpoint=llm.endpoint, model=llm.model, sampling_parameters={"temperature": 0.0}), "ping")
        return 0.0

    algorithm = _algorithm(word_model, batch_size=1, group_size=2, max_steps=1)
    with caplog.at_level("WARNING"):
        fit(algorithm, greedy_agent, train=[{"prompt": "ping"}])

    (warning,) = _unchanged_warnings(caplog)
    assert "sampled at temperature 0 (sampling_parameters sets 1)" in warning
    assert "sampled greedily, so the rollouts of a task all give the same answer" in warning
