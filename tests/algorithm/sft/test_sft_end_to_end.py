"""Full stack: store, runner, LLM gateway, in-process engine and SFT on a tiny random word model.

Task: the user says ``ping`` and the answer must be ``yes``; the model starts near uniform over 9 words. Everything
is real: HTTP on 127.0.0.1, the OpenAI SDK in the agent, the gateway recording token ids, the store, the runner and
the trainer. Each call is seeded by its rank (one runner takes the rollouts in order), so a run is deterministic.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from support.models import serving
from support.word_model import PingAgent, build_word_model, fit

import agentbolt as agl
from agentbolt.algorithm.sft import SFT, train_from_messages

TASKS = [{"prompt": "ping", "answer": "yes"}]


def _sft(model_dir: Path, **options) -> SFT:
    base = {
        "model": str(model_dir),
        "served_model_name": "word-llama",
        "finetune": "full",
        "batch_size": 1,
        "rollouts_per_task": 12,
        "learning_rate": 2e-2,
        "epochs": 4,
        "train_batch_size": 8,
        "micro_batch_size": 8,
        "console": False,
        "rollout_timeout": 120,
        "sampling_parameters": {"temperature": 1.0},
    }
    base.update(options)
    return SFT(**base)


def _weights(algorithm: SFT) -> Dict[str, torch.Tensor]:
    assert algorithm.trainer is not None
    return {n: p.detach().clone() for n, p in algorithm.trainer.model.named_parameters()}


def test_sft_learns_the_toy_task_from_its_own_best_rollouts(tmp_path: Path) -> None:
    algorithm = _sft(build_word_model(tmp_path / "word"), max_steps=4, min_reward=1.0, top_fraction=None)
    fit(algorithm, PingAgent(), train=TASKS, val=TASKS)
    history = algorithm.history
    assert history[0]["step"] == 0 and history[0]["val/accuracy"] == 0.0
    steps = [r for r in history if r["step"] > 0]
    assert len(steps) == 4
    # Successes are selected (identical token sequences kept once) and trained on; success grows step by step.
    first = steps[0]
    assert first["samples/from_tokens"] == first["samples/calls"] == 12 and first["samples/missing_tokens"] == 0
    assert first["select/selected"] == 1 and first["select/below_min_reward"] > 0
    assert first["train/success"] < 0.5
    assert steps[-1]["train/success"] > first["train/success"]
    assert history[-1]["val/accuracy"] == 1.0


def _teacher(tmp_path: Path) -> Path:
    """A word model fine-tuned offline (from chat messages) to answer ``yes``: the teacher of the distillation."""
    chat = [{"messages": [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "yes"}]}] * 4
    result = train_from_messages(
        chat,
        model=str(build_word_model(tmp_path / "teacher-base")),
        output_dir=tmp_path / "teacher",
        finetune="full",
        epochs=30,
        train_batch_size=4,
        learning_rate=5e-2,
    )
    assert result.finished and result.model_dir is not None and result.adapter_dir is None
    return result.model_dir


def test_distillation_trains_the_student_on_a_local_teachers_answers(tmp_path: Path) -> None:
    teacher_dir = _teacher(tmp_path)
    student_dir = build_word_model(tmp_path / "student")
    with serving(teacher_dir) as teacher:
        algorithm = _sft(
            student_dir,
            max_steps=2,
            rollouts_per_task=4,
            teacher_url=teacher.base_url,
            teacher_model="tiny",
            top_fraction=None,
        )
        fit(algorithm, PingAgent(), train=TASKS, val=TASKS)
    history = algorithm.history
    steps = [r for r in history if r["step"] > 0]
    # The teacher answers every training rollout right; the student is trained on the re-tokenized messages.
    assert all(r["train/success"] == 1.0 for r in steps)
    assert all(r["samples/from_messages"] == 4 and r["samples/from_tokens"] == 0 for r in steps)
    assert history[0]["val/accuracy"] == 0.0 and history[-1]["val/accuracy"] == 1.0


def test_rollouts_without_llm_calls_skip_the_step_and_leave_the_weights(tmp_path: Path, caplog) -> None:
    @agl.rollout
    async def silent_agent(task: dict, llm: agl.LLM) -> float:
        return 1.0  # rewarded, but never calls the model: nothing to learn from

    algorithm = _sft(build_word_model(tmp_path / "word"), max_steps=2, rollouts_per_task=2)
    with caplog.at_level(logging.WARNING, logger="agentbolt.algorithm.sft.algorithm"):
        fit(algorithm, silent_agent, train=TASKS)
    steps = [r for r in algorithm.history if r["step"] > 0]
    assert [r["rollouts/without_calls"] for r in steps] == [2.0, 2.0]
    assert all(r["select/selected"] == 0 and r["update/optimizer_steps"] == 0 for r in steps)
    assert "no sample was selected" in caplog.text and "no LLM call was recorded" in caplog.text
    assert algorithm.trainer is not None and algorithm.trainer.global_step == 2


def test_a_resumed_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    model_dir = build_word_model(tmp_path / "word")
    options = {"min_reward": 1.0, "top_fraction": None, "rollouts_per_task": 8, "checkpoint_interval": 1}
    whole = _sft(model_dir, max_steps=3, checkpoint_dir=str(tmp_path / "whole"), **options)
    fit(whole, PingAgent(), train=TASKS)

    agent = PingAgent()  # one agent across both parts: its call counter (the sampling seeds) continues
    first = _sft(model_dir, max_steps=1, checkpoint_dir=str(tmp_path / "parts"), **options)
    fit(first, agent, train=TASKS)
    rest = _sft(model_dir, max_steps=3, checkpoint_dir=str(tmp_path / "parts"), **options)
    fit(rest, agent, train=TASKS)

    assert [r["step"] for r in rest.history] == [2.0, 3.0]
    ignore = ("time/", "update/seconds", "update/samples_per_second", "update/tokens_per_second")

    def comparable(records: List[dict]) -> List[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(ignore)} for r in records]

    assert comparable(rest.history) == comparable(whole.history[1:])
    a, b = _weights(whole), _weights(rest)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_decaying_schedule_without_its_length_is_refused_before_training(tmp_path: Path) -> None:
    algorithm = _sft(tmp_path, lr_scheduler="cosine")
    with pytest.raises(ValueError, match="needs total_optimizer_steps"):
        fit(algorithm, PingAgent(), train=TASKS)


def test_checkpoints_without_a_directory_are_refused_before_training(tmp_path: Path) -> None:
    algorithm = _sft(tmp_path, checkpoint_interval=2)
    with pytest.raises(ValueError, match="checkpoint_interval=2 needs a checkpoint_dir"):
        fit(algorithm, PingAgent(), train=TASKS)
    assert algorithm.trainer is None
