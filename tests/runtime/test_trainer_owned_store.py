"""A SQLite store the Trainer opened from a path is closed when fit/dev end; a store passed in stays open."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

import agentbolt as agl
from agentbolt.store.sqlite import SqliteLightningStore

TASKS: List[Dict[str, Any]] = [{"n": n} for n in (1, 2, 3)]
FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05}
RESOURCES = {"llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")}


@agl.rollout
def parity_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    return float(task["n"] % 2)


@agl.algo
async def three_rollouts(store: agl.LightningStore, initial_resources: Any) -> None:
    await store.add_resources(initial_resources)
    rollouts = [await store.enqueue_rollout(input=task, mode="train") for task in TASKS]
    await store.wait_for_rollouts(rollout_ids=[r.rollout_id for r in rollouts], timeout=60)


@agl.algo
async def failing_after_one_rollout(store: agl.LightningStore, initial_resources: Any) -> None:
    await store.add_resources(initial_resources)
    rollout = await store.enqueue_rollout(input=TASKS[0], mode="train")
    await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=60)
    raise RuntimeError("the algorithm failed")


def _trainer(store: Any, algorithm: Any, strategy: Any = "shm") -> agl.Trainer:
    return agl.Trainer(
        strategy=strategy, store=store, runner=FAST_RUNNER, algorithm=algorithm, initial_resources=RESOURCES
    )


def _rollouts_in_copy_of_main_file(path: Path, tmp_path: Path) -> int:
    """The number of rollouts in a copy of ``path`` alone (without any ``-wal`` or ``-shm`` beside it)."""
    copy = tmp_path / "copy" / "store.sqlite"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)

    async def count() -> int:
        store = SqliteLightningStore(copy, read_only=True)
        try:
            return len(await store.query_rollouts())
        finally:
            await store.close()

    return asyncio.run(count())


@pytest.mark.parametrize("command", ["fit", "dev"])
def test_store_opened_from_path_is_closed_when_the_run_ends(command: str, tmp_path: Path) -> None:
    path = tmp_path / "run" / "store.sqlite"
    if command == "fit":
        _trainer(path, three_rollouts).fit(parity_agent, progress=False)
    else:
        _trainer(path, agl.Baseline(polling_interval=0.05, span_verbosity="none")).dev(
            parity_agent, TASKS, progress=False
        )
    assert not Path(f"{path}-wal").exists()
    assert _rollouts_in_copy_of_main_file(path, tmp_path) == len(TASKS)


def test_store_opened_from_path_is_closed_after_a_client_server_run(tmp_path: Path) -> None:
    from support.servers import free_port

    path = tmp_path / "store.sqlite"
    strategy = {"type": "cs", "server_port": free_port(), "n_runners": 1}
    _trainer(path, three_rollouts, strategy).fit(parity_agent, progress=False)
    assert not Path(f"{path}-wal").exists()
    assert _rollouts_in_copy_of_main_file(path, tmp_path) == len(TASKS)


def test_store_opened_from_path_is_closed_when_the_algorithm_fails(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    trainer = _trainer(path, failing_after_one_rollout)
    with contextlib.suppress(RuntimeError):  # whether the strategy re-raises it is not what this test is about
        trainer.fit(parity_agent, progress=False)
    assert not Path(f"{path}-wal").exists()
    assert _rollouts_in_copy_of_main_file(path, tmp_path) == 1


def test_store_opened_from_path_is_reopened_for_the_next_run(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    trainer = _trainer(path, three_rollouts)
    trainer.fit(parity_agent, progress=False)
    trainer.fit(parity_agent, progress=False)
    assert not Path(f"{path}-wal").exists()
    assert _rollouts_in_copy_of_main_file(path, tmp_path) == 2 * len(TASKS)


def test_store_passed_in_stays_open(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "store.sqlite")
    try:
        _trainer(store, three_rollouts).fit(parity_agent, progress=False)
        assert len(asyncio.run(store.query_rollouts())) == len(TASKS)
    finally:
        asyncio.run(store.close())
