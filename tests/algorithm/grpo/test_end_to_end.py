"""Full stack: store, runners, LLM gateway, in-process engine and GRPO teach a tiny random model a toy task.

Task: the user says ``ping`` and the answer must be ``yes``. The model is a randomly initialised 2-layer Llama over
a 9-word vocabulary with small initial weights, so its first answers are close to uniform (chance is about 1 in 9)
and it must learn from the rewards alone. Everything is real: HTTP on 127.0.0.1, the OpenAI SDK in the agent, the
gateway recording token ids and log-probs, the store, the runner and the trainer. This is the learning test of the
default suite: deterministic (each call is seeded by its rank) and well under a minute on two busy cores.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Dict, List, Tuple

from word_model import ask, build_word_model, fit

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO

TASKS = [{"prompt": "ping", "answer": "yes"}]


GROUP_SIZE = 16


def _mean_and_standard_error(records: List[Dict[str, float]]) -> Tuple[float, float]:
    """Mean 0/1 reward of some steps' rollouts and its binomial standard error.

    The rate in the error is kept within [1/n, 1 - 1/n], so a start without any success still has some noise.
    """
    n = GROUP_SIZE * len(records)
    mean = sum(r["train/reward_mean"] for r in records) / len(records)
    rate = min(max(mean, 1 / n), 1 - 1 / n)
    return mean, math.sqrt(rate * (1 - rate) / n)


def test_grpo_learns_the_toy_task_through_the_full_stack(tmp_path: Path) -> None:
    counter = itertools.count()

    @agl.rollout
    async def toy_agent(task: dict, llm: agl.LLM) -> float:
        # One runner takes the rollouts in order, so seeding each call by its rank makes the run deterministic.
        return 1.0 if await ask(llm, task["prompt"], seed=next(counter)) == task["answer"] else 0.0

    model_dir = build_word_model(tmp_path / "word-llama")
    algorithm = GRPO(
        model=str(model_dir),
        served_model_name="word-llama",
        finetune="full",
        batch_size=1,
        group_size=GROUP_SIZE,
        max_steps=10,
        learning_rate=2e-2,
        micro_batch_size=16,
        val_interval=5,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_interval=5,
        log_dir=str(tmp_path / "logs"),
        console=False,
        rollout_timeout=120,
        seed=0,
    )
    fit(algorithm, toy_agent, train=TASKS, val=TASKS)

    history = algorithm.history
    train = [r for r in history if "train/reward_mean" in r]
    assert len(train) == 10 and history[0]["step"] == 0 and "val/accuracy" in history[0]
    # Starts near chance (about 1 in 9), ends above 0.9: a rise of many times the noise of the start.
    first, first_error = _mean_and_standard_error(train[:2])
    last, _ = _mean_and_standard_error(train[-3:])
    assert first < 0.35
    assert last > 0.9
    assert last - first > 6 * first_error
    assert history[-1]["val/accuracy"] == 1.0
    # Every rollout produced one trained sample with the engine's log-probs; the first update was on-policy.
    for record in train:
        counts = {k: v for k, v in record.items() if k.startswith(("rollouts/", "samples/"))}
        assert counts["rollouts/failed"] == 0 and counts["samples/calls"] == GROUP_SIZE, counts
        assert counts["samples/missing_tokens"] == 0 and counts["samples/missing_logprobs"] == 0, counts
    first_update = next(r for r in train if "update/loss" in r)
    assert first_update["update/first_minibatch_ratio_max_dev"] < 1e-4
    # Artifacts: metrics log, reward curve, checkpoints.
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(11))
    assert (tmp_path / "logs" / "reward_curve.png").stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_000005", "step_000010"]
