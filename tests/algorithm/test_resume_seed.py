"""An online run (GRPO, SFT) resumes only with the seed its checkpoint's task order was drawn from.

Runs here are real (store, gateway, in-process engine, trainer, checkpoints) on a tiny word model; the rollouts are
finished by a worker that only makes the store calls a runner would.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, List, Type

import pytest
from support.word_model import build_word_model

import agentbolt as agl
from agentbolt.algorithm.finetuning.algorithm import FinetuningAlgorithm
from agentbolt.algorithm.finetuning.trainer import CheckpointError
from agentbolt.algorithm.grpo.algorithm import GRPO
from agentbolt.algorithm.sft import SFT

TASKS = [{"prompt": "ping"}, {"prompt": "pong"}, {"prompt": "ping pong"}]
ALGORITHMS = [pytest.param(GRPO, id="grpo"), pytest.param(SFT, id="sft")]


@pytest.fixture(scope="module")
def word_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_model(tmp_path_factory.mktemp("word-llama"))


def _algorithm(kind: Type[FinetuningAlgorithm], word_model: Path, tmp_path: Path, **options: Any) -> Any:
    per_task = {"group_size": 2} if kind is GRPO else {"rollouts_per_task": 2}
    return kind(
        model=str(word_model),
        served_model_name="word-llama",
        finetune="full",
        batch_size=1,
        console=False,
        val_before_train=False,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_interval=1,
        log_dir=str(tmp_path / "logs"),
        rollout_timeout=60,
        **per_task,
        **options,
    )


async def _finish_rollouts(store: agl.LightningStore) -> None:
    """Finish every queued rollout (without reward), forever."""
    while True:
        for rollout in await store.query_rollouts(status_in=["queuing"]):
            await store.update_rollout(rollout.rollout_id, status="succeeded")
        await asyncio.sleep(0.02)


async def _run(algorithm: FinetuningAlgorithm, store: agl.LightningStore) -> None:
    """Run ``algorithm`` to its end, its rollouts finished by a worker."""
    algorithm.set_store(store)
    worker = asyncio.create_task(_finish_rollouts(store))
    try:
        await algorithm._run_with_datasets(TASKS, None)
    finally:
        worker.cancel()


def _logged_steps(tmp_path: Path) -> List[int]:
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.parametrize("kind", ALGORITHMS)
async def test_a_run_resumed_with_another_seed_is_refused_naming_both_seeds_before_the_model_loads(
    kind: Type[FinetuningAlgorithm], word_model: Path, tmp_path: Path
) -> None:
    store = agl.InMemoryLightningStore()
    await _run(_algorithm(kind, word_model, tmp_path, max_steps=1, seed=3), store)
    rollouts = len(await store.query_rollouts())

    other = _algorithm(kind, word_model, tmp_path, max_steps=2, seed=4)
    with pytest.raises(
        CheckpointError, match=r"step_000001 was trained with seed=3 \(this run: 4\).*new checkpoint_dir"
    ):
        await _run(other, store)
    assert other.trainer is None  # refused before the model loaded
    assert _logged_steps(tmp_path) == [1] and len(await store.query_rollouts()) == rollouts

    await _run(_algorithm(kind, word_model, tmp_path, max_steps=2, seed=3), store)
    assert _logged_steps(tmp_path) == [1, 2]


@pytest.mark.parametrize("kind", ALGORITHMS)
async def test_a_checkpoint_that_does_not_record_its_seed_resumes_with_any_seed(
    kind: Type[FinetuningAlgorithm], word_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = agl.InMemoryLightningStore()
    await _run(_algorithm(kind, word_model, tmp_path, max_steps=1, seed=3), store)
    state_file = tmp_path / "ckpt" / "step_000001" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["extra"].pop("seed") == 3
    state_file.write_text(json.dumps(state))

    with caplog.at_level(logging.DEBUG, logger="agentbolt.algorithm.finetuning.trainer"):
        await _run(_algorithm(kind, word_model, tmp_path, max_steps=2, seed=4), store)
    assert _logged_steps(tmp_path) == [1, 2]
    assert "does not record ['seed']; resuming without checking them" in caplog.text
    saved = json.loads((tmp_path / "ckpt" / "step_000002" / "trainer_state.json").read_text())
    assert saved["extra"]["seed"] == 4  # the checkpoints it writes record the seed again
