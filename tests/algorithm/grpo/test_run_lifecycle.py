"""A run's identity across processes: its log, its run id in the store, its rollouts, and re-running a finished run.

Runs here are real (store, gateway, in-process engine, trainer, checkpoints); the rollouts are finished by a worker
that only makes the store calls a runner would, so a test decides which steps complete and where a run is
interrupted (its task cancelled, as Ctrl-C does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Collection, List

import pytest
from word_model import build_word_model

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO

TASKS = [{"prompt": "ping"}]


@pytest.fixture(scope="module")
def word_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_model(tmp_path_factory.mktemp("word-llama"))


def _grpo(word_model: Path, tmp_path: Path, **options: Any) -> GRPO:
    base: dict[str, Any] = {
        "model": str(word_model),
        "served_model_name": "word-llama",
        "finetune": "full",
        "batch_size": 1,
        "group_size": 2,
        "console": False,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint_interval": 1,
        "log_dir": str(tmp_path / "logs"),
        "rollout_timeout": 60,
    }
    merged = {**base, **options}
    if merged["checkpoint_dir"] is None:
        merged["checkpoint_interval"] = 0  # no checkpoints to take
    return GRPO(**merged)


def _step(rollout: agl.Rollout) -> int:
    return int(str((rollout.metadata or {})["grpo_group"]).split("-")[1])


async def _finish_rollouts(store: agl.LightningStore, through_step: int, leave: Collection[str]) -> None:
    """Finish every queued rollout of the steps up to ``through_step`` (without reward) but those in ``leave``,
    forever."""
    while True:
        for rollout in await store.query_rollouts(status_in=["queuing"]):
            if _step(rollout) <= through_step and rollout.rollout_id not in leave:
                await store.update_rollout(rollout.rollout_id, status="succeeded")
        await asyncio.sleep(0.02)


async def _run(
    algorithm: GRPO, store: agl.LightningStore, *, through_step: int = 10**6, leave: Collection[str] = ()
) -> None:
    """Run ``algorithm`` to its end, its rollouts finished by a worker."""
    algorithm.set_store(store)
    worker = asyncio.create_task(_finish_rollouts(store, through_step, leave))
    try:
        await algorithm._run_with_datasets(TASKS, None)
    finally:
        worker.cancel()


async def _interrupted_in_step(algorithm: GRPO, store: agl.LightningStore, step: int) -> List[agl.Rollout]:
    """Run ``algorithm`` until the rollouts of ``step`` are enqueued, then cancel it; those rollouts."""
    run = asyncio.create_task(_run(algorithm, store, through_step=step - 1))
    while not (waiting := [r for r in await store.query_rollouts() if _step(r) == step]) and not run.done():
        await asyncio.sleep(0.02)
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    assert waiting, "the run ended before the step it was to be interrupted in"
    return waiting


def _logged_steps(tmp_path: Path) -> List[int]:
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


async def test_a_new_run_into_a_log_dir_holding_another_runs_metrics_is_refused(
    word_model: Path, tmp_path: Path
) -> None:
    store = agl.InMemoryLightningStore()
    await _run(_grpo(word_model, tmp_path, max_steps=1, checkpoint_dir=None), store)
    logged = (tmp_path / "logs" / "metrics.jsonl").read_text()

    second = _grpo(word_model, tmp_path, max_steps=1, checkpoint_dir=None)
    with pytest.raises(
        ValueError, match=r"already holds the metrics of another run \(steps 1 to 1 in .*metrics\.jsonl"
    ):
        await _run(second, store)
    assert second.trainer is None  # refused before the model loaded
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == logged


async def test_a_resumed_run_continues_its_log_and_its_run_id_without_the_steps_it_runs_again(
    word_model: Path, tmp_path: Path
) -> None:
    store = agl.InMemoryLightningStore()
    first = _grpo(word_model, tmp_path, max_steps=4, checkpoint_interval=2)
    await _interrupted_in_step(first, store, 4)  # steps 1-3 logged, step 2 checkpointed
    assert _logged_steps(tmp_path) == [1, 2, 3]

    resumed = _grpo(word_model, tmp_path, max_steps=4, checkpoint_interval=2)
    await _run(resumed, store)

    assert _logged_steps(tmp_path) == [1, 2, 3, 4]  # step 3, run again, is logged once
    assert resumed.run_id == first.run_id
    records = await store.query_metrics()
    assert [(r.run_id, r.step) for r in records] == [(first.run_id, step) for step in (1, 2, 3, 4)]


async def test_runs_whose_log_dirs_share_a_name_have_their_own_run_ids_in_a_shared_store(
    word_model: Path, tmp_path: Path
) -> None:
    store = agl.InMemoryLightningStore()
    runs = [
        _grpo(word_model, tmp_path / name, max_steps=1, checkpoint_dir=None, log_dir=str(tmp_path / name / "logs"))
        for name in ("a", "b")
    ]
    for algorithm in runs:
        await _run(algorithm, store)

    assert runs[0].run_id != runs[1].run_id
    assert all(str(algorithm.run_id).startswith("logs-") for algorithm in runs)
    assert sorted(r.run_id for r in await store.query_metrics()) == sorted(str(a.run_id) for a in runs)


async def test_rerunning_a_finished_run_logs_that_it_is_complete_and_what_to_change(
    word_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = agl.InMemoryLightningStore()
    await _run(_grpo(word_model, tmp_path, max_steps=2), store)
    rollouts = len(await store.query_rollouts())
    logged = (tmp_path / "logs" / "metrics.jsonl").read_text()

    again = _grpo(word_model, tmp_path, max_steps=2)
    with caplog.at_level(logging.WARNING):
        await _run(again, store)

    (message,) = [r.getMessage() for r in caplog.records if "already complete" in r.getMessage()]
    assert "step_000002 is at step 2 and max_steps is 2" in message
    assert "raise max_steps above 2" in message and "new checkpoint_dir" in message
    assert again.history == [] and len(await store.query_rollouts()) == rollouts
    assert (tmp_path / "logs" / "metrics.jsonl").read_text() == logged


async def test_a_resumed_run_cancels_the_rollouts_its_interrupted_process_left_unfinished(
    word_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = agl.InMemoryLightningStore()
    first = _grpo(word_model, tmp_path, max_steps=2)
    stale = await _interrupted_in_step(first, store, 2)
    started = await store.dequeue_rollout(worker_id="runner-of-the-interrupted-process")
    assert started is not None and started.rollout_id in {r.rollout_id for r in stale}
    other_run = await store.enqueue_rollout(
        input=TASKS[0], mode="train", metadata={"grpo_group": "train-2-0", "run_id": "another-run", "step": 2}
    )

    left = {r.rollout_id for r in stale} | {other_run.rollout_id}
    with caplog.at_level(logging.WARNING):
        await _run(_grpo(word_model, tmp_path, max_steps=2), store, leave=left)

    for rollout in stale:
        current = await store.get_rollout_by_id(rollout.rollout_id)
        assert current is not None and current.status == "cancelled", current
    unrelated = await store.get_rollout_by_id(other_run.rollout_id)
    assert unrelated is not None and unrelated.status == "queuing"
    assert any(f"Cancelled {len(stale)} rollout(s) of step(s) 2" in r.getMessage() for r in caplog.records)
    rerun = [r for r in await store.query_rollouts() if _step(r) == 2 and r.rollout_id not in left]
    assert len(rerun) == 2 and {r.status for r in rerun} == {"succeeded"}  # step 2 was rolled out again


async def test_a_run_interrupted_before_its_first_checkpoint_starts_again_under_its_id(
    word_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = agl.InMemoryLightningStore()
    first = _grpo(word_model, tmp_path, max_steps=3, checkpoint_interval=3)
    stale = await _interrupted_in_step(first, store, 3)  # steps 1-2 logged, no checkpoint yet
    assert _logged_steps(tmp_path) == [1, 2] and not list((tmp_path / "ckpt").glob("step_*"))

    with pytest.raises(ValueError, match="already holds the metrics of another run"):  # a new run is still refused
        await _run(_grpo(word_model, tmp_path, max_steps=3, checkpoint_interval=3, resume=False), store)

    again = _grpo(word_model, tmp_path, max_steps=3, checkpoint_interval=3)
    with caplog.at_level(logging.WARNING):
        await _run(again, store, leave={r.rollout_id for r in stale})

    assert again.run_id == first.run_id
    assert any(
        "stopped before its first checkpoint; it starts again from step 0" in r.getMessage() for r in caplog.records
    )
    assert _logged_steps(tmp_path) == [1, 2, 3]  # the interrupted process's records replaced, not doubled
    records = await store.query_metrics()
    assert [(r.run_id, r.step) for r in records] == [(first.run_id, step) for step in (1, 2, 3)]
    for rollout in stale:
        current = await store.get_rollout_by_id(rollout.rollout_id)
        assert current is not None and current.status == "cancelled", current
    assert not (tmp_path / "ckpt" / "run.json").exists()  # the checkpoint holds the run's id now


async def test_a_finished_run_leaves_no_run_file_so_its_log_is_never_taken_for_an_interrupted_runs(
    word_model: Path, tmp_path: Path
) -> None:
    store = agl.InMemoryLightningStore()
    await _run(_grpo(word_model, tmp_path, max_steps=0), store)  # validation only: no checkpoint written
    await _run(_grpo(word_model, tmp_path, max_steps=1), store)
    for checkpoint in (tmp_path / "ckpt").glob("step_*"):  # the user deletes the checkpoints to start over
        shutil.rmtree(checkpoint)
    assert not (tmp_path / "ckpt" / "run.json").exists()
    with pytest.raises(ValueError, match="already holds the metrics of another run"):
        await _run(_grpo(word_model, tmp_path, max_steps=1), store)
