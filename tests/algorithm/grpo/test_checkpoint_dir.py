"""Checkpoint directories: an unusable one is refused before the model loads, and save errors are CheckpointError."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_llama

import agentbolt as agl
from agentbolt.algorithm.finetuning.trainer import CheckpointError
from agentbolt.algorithm.grpo.algorithm import GRPO
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.trainer import PolicyTrainer


def _under_a_file(tmp_path: Path) -> Path:
    regular = tmp_path / "not-a-dir"
    regular.write_text("a regular file")
    return regular / "ckpt"


def _fail_if_the_model_loads(algorithm: GRPO) -> None:
    def load_model() -> None:
        raise AssertionError("the model was loaded before checkpoint_dir was checked")

    algorithm._build_trainer = load_model  # type: ignore[assignment,method-assign]


def _stop_when_the_model_loads(algorithm: GRPO) -> None:
    def load_model() -> None:
        raise RuntimeError("stop here")

    algorithm._build_trainer = load_model  # type: ignore[assignment,method-assign]


async def test_a_checkpoint_dir_under_a_regular_file_fails_the_run_before_the_model_loads(tmp_path: Path) -> None:
    algorithm = GRPO(checkpoint_dir=str(_under_a_file(tmp_path)), max_steps=1, console=False)
    algorithm.set_store(agl.InMemoryLightningStore())

    _fail_if_the_model_loads(algorithm)
    with pytest.raises(CheckpointError, match="not-a-dir"):
        await algorithm.run(train_dataset=[{"task": 1}])


async def test_a_missing_checkpoint_dir_is_created_before_the_model_loads(tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "runs" / "ckpt"
    algorithm = GRPO(checkpoint_dir=str(checkpoint_dir), max_steps=1, console=False)
    algorithm.set_store(agl.InMemoryLightningStore())

    _stop_when_the_model_loads(algorithm)
    with pytest.raises(RuntimeError, match="stop here"):
        await algorithm.run(train_dataset=[{"task": 1}])
    assert [p.name for p in checkpoint_dir.iterdir()] == ["run.json"]  # the run's id, until its first checkpoint


def test_saving_under_a_regular_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    trainer = PolicyTrainer(tiny_llama(), GRPOConfig())
    with pytest.raises(CheckpointError, match="could not write checkpoint"):
        trainer.save_checkpoint(_under_a_file(tmp_path))


def _holding_a_checkpoint(tmp_path: Path) -> Path:
    checkpoint_dir = tmp_path / "ckpt"
    PolicyTrainer(tiny_llama(), GRPOConfig()).save_checkpoint(checkpoint_dir)
    return checkpoint_dir


async def test_a_run_that_does_not_resume_refuses_another_runs_checkpoints(tmp_path: Path) -> None:
    checkpoint_dir = _holding_a_checkpoint(tmp_path)
    before = sorted(path.name for path in checkpoint_dir.rglob("*"))
    algorithm = GRPO(checkpoint_dir=str(checkpoint_dir), resume=False, max_steps=1, console=False)
    algorithm.set_store(agl.InMemoryLightningStore())

    _fail_if_the_model_loads(algorithm)
    with pytest.raises(CheckpointError, match=r"already holds another run's checkpoints \(latest: step_0+\)"):
        await algorithm.run(train_dataset=[{"task": 1}])
    assert sorted(path.name for path in checkpoint_dir.rglob("*")) == before


async def test_a_resuming_run_takes_the_checkpoints_it_finds(tmp_path: Path) -> None:
    checkpoint_dir = _holding_a_checkpoint(tmp_path)
    algorithm = GRPO(checkpoint_dir=str(checkpoint_dir), max_steps=1, console=False)
    algorithm.set_store(agl.InMemoryLightningStore())

    _stop_when_the_model_loads(algorithm)
    with pytest.raises(RuntimeError, match="stop here"):
        await algorithm.run(train_dataset=[{"task": 1}])
