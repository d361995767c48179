"""Checkpoints and logs that a killed process, a full disk or a careless hand left damaged, on the tiny random Llama.

A resumed run never takes a half-written or damaged checkpoint for a good one: it resumes from the latest complete
checkpoint, or refuses with a ``CheckpointError`` naming the file at fault and the checkpoint to resume from instead,
before it trains. Nothing in the checkpoint directory is deleted to make room.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
import torch
from support.models import write_conversations

from agentbolt.algorithm.finetuning.trainer import CheckpointError, check_checkpoint_dir, latest_checkpoint
from agentbolt.algorithm.grpo.metrics import read_metrics
from agentbolt.algorithm.sft.offline import train_from_messages

OPTIONS: Dict[str, Any] = {
    "epochs": 2,
    "train_batch_size": 2,
    "learning_rate": 1e-2,
    "seed": 3,
    "checkpoint_interval": 1,
}

CHILD = """
import sys
from agentbolt.algorithm.sft.offline import train_from_messages

data, model, out, logs = sys.argv[1:5]
train_from_messages(data, model=model, output_dir=out, log_dir=logs, checkpoint_interval=1, epochs=5000,
                    train_batch_size=2, learning_rate=1e-2, seed=3)
"""

STARTUP_SECONDS = 180.0  # a generous bound on importing torch and loading the model, not a timing assertion


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)


def _conversations(path: Path) -> Path:
    write_conversations(path, 4)
    return path


def _train(tmp_path: Path, model_dir: Path, **options: Any) -> Any:
    return train_from_messages(
        _conversations(tmp_path / "chat.jsonl"),
        model=str(model_dir),
        output_dir=tmp_path / "out",
        log_dir=str(tmp_path / "logs"),
        **{**OPTIONS, **options},
    )


def _logged_steps(tmp_path: Path) -> List[int]:
    return [json.loads(line)["step"] for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_a_process_killed_while_writing_a_checkpoint_leaves_the_previous_one_as_the_latest(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    checkpoints = tmp_path / "out" / "checkpoints"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    args = [str(_conversations(tmp_path / "chat.jsonl")), str(tiny_model_dir), str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with (tmp_path / "stderr.txt").open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(script), *args, str(tmp_path / "logs")],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            # SIGKILL as soon as the second checkpoint is being written: its files are not all there yet.
            while not (checkpoints / ".step_000002.tmp").exists():
                assert child.poll() is None, (tmp_path / "stderr.txt").read_text()
                assert time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
                time.sleep(0.001)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
    assert latest_checkpoint(checkpoints) == checkpoints / "step_000001"

    done = _train(tmp_path, tiny_model_dir)
    assert done.finished and [h["optimizer_step"] for h in done.history] == [2.0, 3.0, 4.0]
    assert _logged_steps(tmp_path) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda p: (p / "trainer_state.json").write_text("{not json"), "trainer_state.json is corrupt"),
        (lambda p: (p / "optimizer.pt").unlink(), "optimizer.pt is missing"),
        (lambda p: shutil.copy(p / "optimizer.pt", p / "rng.pt"), "rng.pt is corrupt"),
        (
            lambda p: os.truncate(p / "adapter" / "adapter_model.safetensors", 100),
            "adapter_model.safetensors is corrupt",
        ),
    ],
)
def test_a_damaged_latest_checkpoint_is_refused_naming_the_file_and_the_checkpoint_to_resume_from(
    tmp_path: Path, tiny_model_dir: Path, damage: Callable[[Path], Any], named: str
) -> None:
    _train(tmp_path, tiny_model_dir, stop_after=2)
    checkpoints = tmp_path / "out" / "checkpoints"
    damage(checkpoints / "step_000002")
    with pytest.raises(CheckpointError, match=named) as refused:
        _train(tmp_path, tiny_model_dir)
    assert "Move step_000002 out of" in str(refused.value)
    assert "continues from the checkpoint before it, step_000001" in str(refused.value)
    assert _logged_steps(tmp_path) == [1, 2]  # nothing trained

    (checkpoints / "step_000002").rename(tmp_path / "damaged")  # as the message says
    done = _train(tmp_path, tiny_model_dir)
    assert [h["optimizer_step"] for h in done.history] == [2.0, 3.0, 4.0]
    assert _logged_steps(tmp_path) == [1, 2, 3, 4]


def test_entries_named_as_later_checkpoints_that_are_not_ones_are_refused_before_training(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    _train(tmp_path, tiny_model_dir, stop_after=2)
    checkpoints = tmp_path / "out" / "checkpoints"
    (checkpoints / "step_000002" / "trainer_state.json").rename(tmp_path / "trainer_state.json")  # an incomplete copy
    (checkpoints / "step_000004").write_text("notes")  # a file
    for harmless in ("step_abc", "step_000003.tmp", "step_000001.old"):
        (checkpoints / harmless).mkdir()
    with pytest.raises(CheckpointError) as refused:
        _train(tmp_path, tiny_model_dir)
    message = str(refused.value)
    assert f"holds {checkpoints / 'step_000002'}, {checkpoints / 'step_000004'}: named as a checkpoint" in message
    assert "the run then resumes from step_000001" in message
    assert _logged_steps(tmp_path) == [1, 2]  # nothing trained
    assert (checkpoints / "step_000004").read_text() == "notes"
    assert (checkpoints / "step_000002" / "adapter").is_dir()  # nothing deleted

    shutil.move(checkpoints / "step_000002", tmp_path / "incomplete")
    shutil.move(checkpoints / "step_000004", tmp_path / "notes")
    done = _train(tmp_path, tiny_model_dir)
    assert [h["optimizer_step"] for h in done.history] == [2.0, 3.0, 4.0]


def test_a_metrics_line_cut_short_by_a_killed_process_is_dropped_when_the_run_resumes(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _train(tmp_path, tiny_model_dir, stop_after=1)
    log = tmp_path / "logs" / "metrics.jsonl"
    with log.open("a") as handle:  # the killed process logged step 2 but for its end, and saved no checkpoint
        handle.write('{"step": 2, "time": 1796143635.76, "optimizer_step": 2.0, "loss": 7.74')
    with caplog.at_level(logging.WARNING):
        _train(tmp_path, tiny_model_dir)
    assert "metrics.jsonl ends with a line cut short; it is dropped" in caplog.text
    assert _logged_steps(tmp_path) == [1, 2, 3, 4]


def test_reading_a_metrics_log_skips_a_line_that_is_not_a_record_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo\n[]\n\n{"step": 3, "loss": 0.5}\n')
    with caplog.at_level(logging.WARNING):
        records = read_metrics(log)
    assert records == [{"step": 1, "loss": 1.0}, {"step": 3, "loss": 0.5}]
    assert f"{log} line 2 is not a metrics record" in caplog.text
    assert f"{log} line 3 is not a metrics record" in caplog.text


@pytest.mark.parametrize(("option", "other"), [("train_batch_size", 1), ("seed", 4)])
def test_a_run_is_resumed_only_with_the_batches_its_steps_count(
    tmp_path: Path, tiny_model_dir: Path, option: str, other: int
) -> None:
    _train(tmp_path, tiny_model_dir, stop_after=2)
    with pytest.raises(
        CheckpointError, match=rf"step_000002 was trained with {option}={OPTIONS[option]} \(this run: {other}\)"
    ):
        _train(tmp_path, tiny_model_dir, **{option: other})
    assert _logged_steps(tmp_path) == [1, 2]  # nothing trained
    done = _train(tmp_path, tiny_model_dir, learning_rate=5e-3)  # the learning rate may change
    assert [h["optimizer_step"] for h in done.history] == [3.0, 4.0]


def test_a_checkpoint_given_as_the_checkpoint_dir_is_refused_naming_the_directory_to_give(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from agentbolt.algorithm.finetuning.algorithm import check_run_directories

    _train(tmp_path, tiny_model_dir, stop_after=1)
    checkpoint = tmp_path / "out" / "checkpoints" / "step_000001"
    kept = sorted(path.name for path in checkpoint.iterdir())
    with pytest.raises(
        CheckpointError, match=f"is a checkpoint, not a directory of checkpoints: .*'{checkpoint.parent}'"
    ):
        check_run_directories(checkpoint, None, resume=True)
    assert sorted(path.name for path in checkpoint.iterdir()) == kept  # nothing written into it


def test_the_staging_directory_of_a_checkpoint_an_interrupted_run_was_writing_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    (root / ".step_000009.tmp" / "adapter").mkdir(parents=True)
    (root / ".step_000009.tmp" / "adapter" / "adapter_model.safetensors").write_bytes(b"half")
    kept = [root / ".step_abc.tmp", root / "step_000003.tmp", root / ".step_000004.bak"]
    for path in kept:
        path.mkdir()
    check_checkpoint_dir(root)
    assert not (root / ".step_000009.tmp").exists()
    assert all(path.is_dir() for path in kept)
