"""Full stack: store, runners, LLM gateway, in-process engine and GRPO teach a tiny random model a toy task.

Task: the user says ``ping`` and the answer must be ``yes``. The model is a randomly initialised 2-layer Llama over
a 9-word vocabulary with small initial weights, so its first answers are close to uniform (chance is about 1 in 9)
and it must learn from the rewards alone. Everything is real: HTTP on 127.0.0.1, the OpenAI SDK in the agent, the gateway recording token
ids and log-probs, the store, the runners and the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

from word_model import ask, build_word_model, fit

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO

TASKS = [{"prompt": "ping", "answer": "yes"}]


@agl.rollout
async def toy_agent(task: dict, llm: agl.LLM) -> float:
    return 1.0 if await ask(llm, task["prompt"]) == task["answer"] else 0.0


def test_grpo_learns_the_toy_task_through_the_full_stack(tmp_path: Path) -> None:
    model_dir = build_word_model(tmp_path / "word-llama")
    algorithm = GRPO(
        model=str(model_dir),
        served_model_name="word-llama",
        finetune="full",
        batch_size=1,
        group_size=16,
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
    # Starts near chance, ends above 0.9.
    assert train[0]["train/reward_mean"] < 0.5
    assert sum(r["train/reward_mean"] for r in train[-3:]) / 3 > 0.9
    assert history[-1]["val/accuracy"] == 1.0
    # Every rollout produced one trained sample with the engine's log-probs; the first update was on-policy.
    for record in train:
        counts = {k: v for k, v in record.items() if k.startswith(("rollouts/", "samples/"))}
        assert counts["rollouts/failed"] == 0 and counts["samples/calls"] == 16, counts
        assert counts["samples/missing_tokens"] == 0 and counts["samples/missing_logprobs"] == 0, counts
    first_update = next(r for r in train if "update/loss" in r)
    assert first_update["update/first_minibatch_ratio_max_dev"] < 1e-4
    # Artifacts: metrics log, reward curve, checkpoints.
    lines = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(11))
    assert (tmp_path / "logs" / "reward_curve.png").stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_000005", "step_000010"]
