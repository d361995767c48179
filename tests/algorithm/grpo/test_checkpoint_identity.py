"""A checkpoint is resumed only by the policy it belongs to: the same base model and the same LoRA settings.

Tensor shapes cannot tell: a sibling base model of the same architecture, or another ``lora_alpha``, fits them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_samples, tiny_llama

from agentbolt.algorithm.finetuning.trainer import CheckpointError
from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.trainer import PolicyTrainer


def _saved(tmp_path: Path, **options: Any) -> Path:
    trainer = PolicyTrainer(tiny_llama(), GRPOConfig(model="org/base-a", **options))
    trainer.train_step(make_samples(4))
    return trainer.save_checkpoint(tmp_path / "ckpt")


def _trainable(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}


def test_a_checkpoint_of_another_base_model_of_the_same_shapes_is_refused_naming_both(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    other = PolicyTrainer(tiny_llama(seed=1), GRPOConfig(model="org/base-b"))
    before = _trainable(other)
    with pytest.raises(CheckpointError, match=r"trained with model 'org/base-a' \(this run: 'org/base-b'\)"):
        other.load_checkpoint(path)
    assert all(torch.equal(before[name], value) for name, value in _trainable(other).items())
    assert other.global_step == 0


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("lora_alpha", 64.0, r"lora_alpha 16\.0 \(this run: 64\.0\)"),
        ("lora_r", 4, r"lora_r 8 \(this run: 4\)"),
        (
            "lora_target_modules",
            ["q_proj", "v_proj"],
            r"lora_target_modules \[.*'o_proj'.*\] \(this run: \['q_proj', 'v_proj'\]\)",
        ),
    ],
)
def test_a_checkpoint_with_other_lora_settings_is_refused_naming_both(
    tmp_path: Path, option: str, value: Any, named: str
) -> None:
    path = _saved(tmp_path)
    with pytest.raises(CheckpointError, match=named):
        PolicyTrainer(tiny_llama(), GRPOConfig(model="org/base-a", **{option: value})).load_checkpoint(path)


def test_the_policy_it_belongs_to_resumes_it(tmp_path: Path) -> None:
    path = _saved(tmp_path, lora_target_modules=["v_proj", "q_proj"])
    resumed = PolicyTrainer(tiny_llama(), GRPOConfig(model="org/base-a", lora_target_modules=["q_proj", "v_proj"]))
    resumed.load_checkpoint(path)
    assert resumed.global_step == 1


def test_a_checkpoint_without_the_policys_identity_is_resumed_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _saved(tmp_path)
    state_file = path / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["policy"]  # as written before checkpoints recorded it
    state_file.write_text(json.dumps(state))

    resumed = PolicyTrainer(tiny_llama(seed=1), GRPOConfig(model="org/base-b"))
    with caplog.at_level("WARNING"):
        resumed.load_checkpoint(path)
    assert resumed.global_step == 1
    assert any("does not record the base model and LoRA settings" in r.getMessage() for r in caplog.records)
    # What the shapes can tell is still refused.
    with pytest.raises(CheckpointError, match="does not fit the model"):
        PolicyTrainer(tiny_llama(), GRPOConfig(lora_r=4)).load_checkpoint(path)
