"""``agentbolt export`` to the standard output: the records alone on stdout, whatever names it (``-`` or
``/dev/stdout``), and the closing line on stderr. Each test runs the real command in a subprocess on a real store
file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, List

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


def _export(store_file: Path, output: str, *options: str, **run: Any) -> subprocess.CompletedProcess[str]:
    run.setdefault("capture_output", True)
    return subprocess.run(
        [str(AGENTBOLT), "export", str(store_file), "--what", "rollouts", "-o", output, *options],
        cwd=store_file.parent,
        text=True,
        timeout=120,
        **run,
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
    assert f"agentbolt export: {ROLLOUTS} rollouts written to the standard output (jsonl)" in finished.stderr


def test_a_dash_output_creates_no_file_named_dash(store_file: Path) -> None:
    finished = _export(store_file, "-")
    assert finished.returncode == 0, finished.stderr
    assert not (store_file.parent / "-").exists()
    assert sorted(path.name for path in store_file.parent.iterdir()) == ["store.db"]


@pytest.mark.parametrize("output", ["-", "/dev/stdout"])
@pytest.mark.parametrize("mode", ["w", "a"])
def test_stdout_redirected_to_a_file_receives_the_records(store_file: Path, output: str, mode: str) -> None:
    # `agentbolt export ... -o - > file` (or >>): /dev/stdout is a link to the shell's file, which gets the records.
    redirected = store_file.parent / "out.jsonl"
    redirected.write_text('{"earlier": true}\n')
    with redirected.open(mode) as stdout:
        finished = _export(store_file, output, stdout=stdout, stderr=subprocess.PIPE, capture_output=False)
    assert finished.returncode == 0, finished.stderr
    records = _records(redirected.read_text())
    expected = ROLLOUTS + (1 if mode == "a" else 0)  # appended where the shell appends
    assert len(records) == expected and records[-1]["status"] == "succeeded"
    assert Path("/dev/stdout").is_symlink()  # the link itself is never replaced


def test_an_output_that_is_a_link_is_written_through(store_file: Path) -> None:
    target = store_file.parent / "real.jsonl"
    target.write_text("old\n")
    (store_file.parent / "link.jsonl").symlink_to(target.name)
    finished = _export(store_file, "link.jsonl")
    assert finished.returncode == 0, finished.stderr
    assert (store_file.parent / "link.jsonl").is_symlink() and len(_records(target.read_text())) == ROLLOUTS


def test_a_reader_that_stops_early_ends_the_export_quietly(store_file: Path) -> None:
    process = subprocess.Popen(
        [str(AGENTBOLT), "export", str(store_file), "--what", "rollouts", "-o", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head -0` does: every write meets a closed pipe
    errors = process.stderr.read()
    assert process.wait(timeout=120) == 1
    assert "Traceback" not in errors and "error" not in errors.lower(), errors


def test_parquet_to_stdout_is_refused_before_reading(store_file: Path) -> None:
    finished = _export(store_file, "-", "--format", "parquet")
    assert finished.returncode == 2 and "standard output" in finished.stderr and not finished.stdout
