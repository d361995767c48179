"""A resumed run trains with its config's optimizer hyperparameters, not those the checkpoint was saved with."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_samples, tiny_llama

from agentbolt.algorithm.grpo.config import GRPOConfig
from agentbolt.algorithm.grpo.trainer import PolicyTrainer


def _config(**overrides: object) -> GRPOConfig:
    base = {"learning_rate": 2e-2, "micro_batch_size": 4, "max_grad_norm": None, "weight_decay": 0.0}
    base.update(overrides)
    return GRPOConfig(**base)  # type: ignore[arg-type]


def test_the_configs_lr_weight_decay_and_betas_replace_the_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = PolicyTrainer(tiny_llama(), _config(lr_scheduler="linear", warmup_steps=2, max_steps=4))
    first.train_step(make_samples(4))
    path = first.save_checkpoint(tmp_path)

    changed = _config(
        learning_rate=5e-2, weight_decay=0.1, adam_betas=(0.8, 0.99), lr_scheduler="linear", warmup_steps=2, max_steps=4
    )
    resumed = PolicyTrainer(tiny_llama(), changed)
    with caplog.at_level("WARNING"):
        resumed.load_checkpoint(path)
    (group,) = resumed.optimizer.param_groups
    # The schedule keeps its place (one optimizer step taken, inside the warmup) on the new peak.
    assert group["lr"] == pytest.approx(5e-2 * 2 / 3)
    assert resumed.scheduler.base_lrs == [5e-2]
    assert resumed.scheduler.get_last_lr() == [pytest.approx(5e-2 * 2 / 3)]
    assert (group["weight_decay"], tuple(group["betas"])) == (0.1, (0.8, 0.99))
    assert resumed.train_step(make_samples(4, seed=1))["lr"] == pytest.approx(5e-2)  # the warmup ends on the new peak
    (warning,) = [r.getMessage() for r in caplog.records if "Resuming from" in r.getMessage()]
    for named in ("learning_rate 0.02 -> 0.05", "weight_decay 0.0 -> 0.1", "adam_betas (0.9, 0.999) -> (0.8, 0.99)"):
        assert named in warning
    assert resumed.optimizer.state  # Adam's moments are restored


def test_resuming_with_the_same_config_warns_about_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = PolicyTrainer(tiny_llama(), _config())
    first.train_step(make_samples(4))
    path = first.save_checkpoint(tmp_path)
    resumed = PolicyTrainer(tiny_llama(), _config())
    with caplog.at_level("WARNING"):
        resumed.load_checkpoint(path)
    assert not [r for r in caplog.records if "Resuming from" in r.getMessage()]
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(2e-2)
