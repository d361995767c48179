"""Ctrl-C during ``train_from_messages`` logs which checkpoint the run left, then stops as before.

The run is a real child process training the tiny random Llama; SIGINT is sent once the run has reached the point
the test is about (its first checkpoint, or its first optimizer step without any checkpoint).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest
from support.models import write_conversations

from agentbolt.algorithm.finetuning.trainer import latest_checkpoint

CHILD = """
import logging, sys
from agentbolt.algorithm.sft.offline import train_from_messages

logging.basicConfig(level=logging.WARNING)
data, model, out, logs, interval = sys.argv[1:6]
train_from_messages(
    data, model=model, output_dir=out, log_dir=logs, checkpoint_interval=int(interval),
    epochs=5000, train_batch_size=1, learning_rate=1e-3, seed=0,
)
"""

STARTUP_SECONDS = 180.0  # a generous bound on importing torch and loading the model, not a timing assertion


def _data(path: Path) -> Path:
    write_conversations(path, 2)
    return path


def _interrupt_when(tmp_path: Path, model_dir: Path, interval: int, ready: Callable[[], bool]) -> str:
    """Run the child, send SIGINT once ``ready()``, and return its stderr (the child is always ended)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    stderr_path = tmp_path / "stderr.txt"
    args = [str(_data(tmp_path / "chat.jsonl")), str(model_dir), str(tmp_path / "out"), str(tmp_path / "logs")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with stderr_path.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(script), *args, str(interval)], stdout=subprocess.DEVNULL, stderr=stderr, env=env
        )
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while not ready():
                if child.poll() is not None:
                    pytest.fail(
                        f"the run ended (code {child.returncode}) before it was interrupted:\n{stderr_path.read_text()}"
                    )
                if time.monotonic() > deadline:
                    pytest.fail(f"the run did not get there within {STARTUP_SECONDS} s:\n{stderr_path.read_text()}")
                time.sleep(0.05)
            os.kill(child.pid, signal.SIGINT)
            child.wait(timeout=60)
            assert child.returncode != 0, "an interrupted run must not exit as a success"
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
    return stderr_path.read_text()


def _first_step_logged(logs: Path) -> bool:
    metrics = logs / "metrics.jsonl"
    return metrics.exists() and metrics.read_text().count("\n") >= 1


def test_an_interrupted_run_names_its_last_checkpoint(tmp_path: Path, tiny_model_dir: Path) -> None:
    checkpoints = tmp_path / "out" / "checkpoints"
    first: Optional[Path] = None

    def saved() -> bool:
        nonlocal first
        first = latest_checkpoint(checkpoints)
        return first is not None

    stderr = _interrupt_when(tmp_path, tiny_model_dir, interval=1, ready=saved)
    last = latest_checkpoint(checkpoints)
    assert first is not None and last is not None and last.name >= first.name
    lines = [line for line in stderr.splitlines() if "SFT interrupted" in line]
    assert len(lines) == 1, stderr
    assert f"the last checkpoint saved is {last};" in lines[0]
    assert "KeyboardInterrupt" in stderr  # re-raised: the run stops as an interrupted run does


def test_a_run_interrupted_before_any_checkpoint_says_none_was_saved(tmp_path: Path, tiny_model_dir: Path) -> None:
    checkpoints = tmp_path / "out" / "checkpoints"
    stderr = _interrupt_when(tmp_path, tiny_model_dir, interval=0, ready=lambda: _first_step_logged(tmp_path / "logs"))
    assert latest_checkpoint(checkpoints) is None
    lines = [line for line in stderr.splitlines() if "SFT interrupted" in line]
    assert lines == [
        f"WARNING:agentbolt.algorithm.sft.offline:SFT interrupted before any checkpoint was saved in {checkpoints}."
    ], stderr
    assert "KeyboardInterrupt" in stderr
