"""``agentbolt export`` to the standard output: the records alone on stdout, whatever names it (``-`` or
``/dev/stdout``), and the closing line on stderr. Each test runs the real command in a subprocess on a real store
file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from agentbolt.store.sqlite import SqliteLightningStore

AGENTBOLT = Path(sys.executable).with_name("agentbolt")
ROLLOUTS = 3


async def _fill(path: Path) -> None:
    store = SqliteLightningStore(path)
    try:
        for index in range(ROLLOUTS):
            rollout = await store.start_rollout(input={"question": index}, mode="train")
            await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")
    finally:
        await store.close()


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    asyncio.run(_fill(path))
    return path


def _export(store_file: Path, output: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTBOLT), "export", str(store_file), "--what", "rollouts", "-o", output],
        cwd=store_file.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _records(stdout: str) -> List[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


@pytest.mark.parametrize("output", ["-", "/dev/stdout"])
def test_records_written_to_stdout_are_alone_there_and_the_summary_goes_to_stderr(
    store_file: Path, output: str
) -> None:
    finished = _export(store_file, output)
    assert finished.returncode == 0, finished.stderr
    records = _records(finished.stdout)  # every line is a record: nothing else is mixed in
    assert len(records) == ROLLOUTS and all(record["status"] == "succeeded" for record in records)
    assert f"agentbolt export: {ROLLOUTS} rollouts written to /dev/stdout (jsonl)" in finished.stderr


def test_a_dash_output_creates_no_file_named_dash(store_file: Path) -> None:
    finished = _export(store_file, "-")
    assert finished.returncode == 0, finished.stderr
    assert not (store_file.parent / "-").exists()
    assert sorted(path.name for path in store_file.parent.iterdir()) == ["store.db"]
