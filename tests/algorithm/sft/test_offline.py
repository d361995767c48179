"""Offline SFT (``train_from_messages``) on the tiny random Llama: token ids the model cannot read, resuming on the
same data only, a run that is already complete, the ``data`` option, console progress."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch

from agentbolt.algorithm.finetuning.trainer import CheckpointError
from agentbolt.algorithm.sft.data import DataError
from agentbolt.algorithm.sft.offline import train_from_messages

OPTIONS: Dict[str, Any] = {"epochs": 2, "train_batch_size": 2, "learning_rate": 1e-2, "seed": 3}


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)


def _conversations(path: Path, n: int = 4, topic: str = "question") -> Path:
    records = [
        {"messages": [{"role": "user", "content": f"{topic} {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_token_ids_the_model_does_not_have_are_refused_naming_the_record(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "ids.jsonl"
    record = {"prompt": [], "completion": [], "prompt_token_ids": [1, 2, 3], "response_token_ids": [99999999, 5]}
    data.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match=r"^sample 1: token id 99999999 is outside the vocabulary .* \(259 tokens\)"):
        train_from_messages(data, model=str(tiny_model_dir))


def test_token_ids_of_another_model_are_trained_on_the_messages_instead_with_a_warning(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "calls.jsonl"
    prompt = [{"role": "user", "content": "question"}]
    completion = [{"role": "assistant", "content": "answer"}]
    recorded = {"prompt_token_ids": [1, 48746, 3], "response_token_ids": [7], "model": "smollm2-135m-instruct"}
    data.write_text(json.dumps({"prompt": prompt, "completion": completion, **recorded}) + "\n")
    with caplog.at_level(logging.WARNING):
        result = train_from_messages(data, model=str(tiny_model_dir), **OPTIONS)
    assert result.finished
    assert result.data["samples/out_of_vocabulary"] == 1 and result.data["samples/from_messages"] == 1
    assert "1 of 1 samples hold token ids outside the vocabulary" in caplog.text


def test_token_ids_recorded_by_another_model_are_trained_with_a_warning_naming_both_models(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "calls.jsonl"
    record = {"prompt": [], "completion": [], "prompt_token_ids": [1, 2], "response_token_ids": [7], "model": "other"}
    data.write_text(json.dumps(record) + "\n")
    with caplog.at_level(logging.WARNING):
        result = train_from_messages(data, model=str(tiny_model_dir), **OPTIONS)
    assert result.data["samples/from_tokens"] == 1
    assert "recorded by another model (1 by 'other') than the one being trained" in caplog.text
    assert repr(str(tiny_model_dir)) in caplog.text


def test_a_run_is_resumed_only_on_the_data_it_was_trained_on(tmp_path: Path, tiny_model_dir: Path) -> None:
    first = _conversations(tmp_path / "first.jsonl")
    out = tmp_path / "out"
    train_from_messages(first, model=str(tiny_model_dir), output_dir=out, stop_after=1, **OPTIONS)
    same_size = _conversations(tmp_path / "second.jsonl", topic="other question")
    with pytest.raises(CheckpointError, match=r"step_000001 was trained on other data \(4 samples, digest \w{12}; "):
        train_from_messages(same_size, model=str(tiny_model_dir), output_dir=out, **OPTIONS)
    resumed = train_from_messages(first, model=str(tiny_model_dir), output_dir=out, **OPTIONS)
    assert resumed.finished and [h["optimizer_step"] for h in resumed.history] == [2.0, 3.0, 4.0]


def test_a_run_that_does_not_resume_refuses_an_output_dir_holding_checkpoints(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    out = tmp_path / "out"
    train_from_messages(data, model=str(tiny_model_dir), output_dir=out, stop_after=1, **OPTIONS)
    kept = sorted(path.name for path in (out / "checkpoints").iterdir())
    with pytest.raises(CheckpointError, match=r"already holds another run's checkpoints \(latest: step_000001\)"):
        train_from_messages(data, model=str(tiny_model_dir), output_dir=out, resume=False, **OPTIONS)
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == kept


def test_the_log_dir_holds_one_record_per_optimizer_step_across_a_resume(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    out, logs = tmp_path / "out", tmp_path / "logs"
    train_from_messages(data, model=str(tiny_model_dir), output_dir=out, log_dir=str(logs), stop_after=1, **OPTIONS)
    done = train_from_messages(data, model=str(tiny_model_dir), output_dir=out, log_dir=str(logs), **OPTIONS)
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["loss"] for r in records[1:]] == [h["loss"] for h in done.history]
    with pytest.raises(ValueError, match="already holds the metrics of another run"):
        train_from_messages(
            data, model=str(tiny_model_dir), output_dir=tmp_path / "other", log_dir=str(logs), **OPTIONS
        )


def test_a_run_stopped_before_its_first_checkpoint_starts_again_in_its_log_dir(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agentbolt.algorithm.sft.trainer import SFTTrainer

    data = _conversations(tmp_path / "chat.jsonl")
    out, logs = tmp_path / "out", tmp_path / "logs"
    step = SFTTrainer.optimizer_step

    def ctrl_c_in_the_third_step(trainer: SFTTrainer, batch: Any) -> Dict[str, float]:
        if trainer.global_step == 2:
            raise KeyboardInterrupt
        return step(trainer, batch)

    with monkeypatch.context() as patched:
        patched.setattr(SFTTrainer, "optimizer_step", ctrl_c_in_the_third_step)
        with pytest.raises(KeyboardInterrupt):  # no checkpoint_interval: the only checkpoint is the last step's
            train_from_messages(data, model=str(tiny_model_dir), output_dir=out, log_dir=str(logs), **OPTIONS)
    assert [json.loads(line)["step"] for line in (logs / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    run_id = json.loads((out / "checkpoints" / "run.json").read_text())["run_id"]

    with caplog.at_level(logging.WARNING):
        done = train_from_messages(data, model=str(tiny_model_dir), output_dir=out, log_dir=str(logs), **OPTIONS)
    assert done.finished and [h["optimizer_step"] for h in done.history] == [1.0, 2.0, 3.0, 4.0]
    assert f"Run {run_id} stopped before its first checkpoint" in caplog.text
    assert [json.loads(line)["step"] for line in (logs / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert not (out / "checkpoints" / "run.json").exists()


def test_a_run_already_complete_trains_nothing_and_returns_the_history_of_the_run(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    out = tmp_path / "out"
    done = train_from_messages(data, model=str(tiny_model_dir), output_dir=out, **OPTIONS)
    with caplog.at_level(logging.WARNING):
        again = train_from_messages(data, model=str(tiny_model_dir), output_dir=out, **OPTIONS)
    assert "already complete" in caplog.text and again.finished and again.adapter_dir == done.adapter_dir
    assert again.history == done.history and again.history[-1]["optimizer_step"] == 4.0


def test_the_data_option_is_given_by_keyword_beside_the_chat_data(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "calls.jsonl"
    record = {
        "prompt": [{"role": "user", "content": "question"}],
        "completion": [{"role": "assistant", "content": "answer"}],
        "prompt_token_ids": [1, 2],
        "response_token_ids": [7],
    }
    data.write_text(json.dumps(record) + "\n")
    result = train_from_messages(data, data="messages", model=str(tiny_model_dir), **OPTIONS)
    assert result.data["samples/from_messages"] == 1 and result.data["samples/from_tokens"] == 0
    with pytest.warns(DeprecationWarning, match="pass the chat data as the first argument"):
        earlier = train_from_messages(data=data, model=str(tiny_model_dir), **OPTIONS)
    assert earlier.data["samples/from_tokens"] == 1
    with pytest.raises(TypeError, match=r"got data='messages' \(the SFTConfig option\) but no chat data"):
        train_from_messages(data="messages", model=str(tiny_model_dir))


def test_console_shows_a_progress_bar_and_a_line_per_optimizer_step(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    train_from_messages(data, model=str(tiny_model_dir), console=True, **OPTIONS)
    out = capsys.readouterr().out
    lines: List[str] = [line for line in out.splitlines() if "step " in line and "loss" in line]
    assert len(lines) == 4 and "step 4: loss" in lines[-1]
    assert "SFT" in out and "4/4" in out


@pytest.mark.parametrize("stop_after", [-1, 1.5, True])
def test_a_stop_after_that_is_no_number_of_steps_is_refused_naming_it(
    tmp_path: Path, tiny_model_dir: Path, stop_after: Any
) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    with pytest.raises(ValueError, match=rf"stop_after must be None or a number of optimizer steps .*got {stop_after}"):
        train_from_messages(data, model=str(tiny_model_dir), output_dir=tmp_path / "out", stop_after=stop_after)
    assert not (tmp_path / "out").exists()


def test_a_log_dir_that_is_a_file_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    log_file = tmp_path / "logs"
    log_file.write_text("not a directory\n")
    with pytest.raises(ValueError, match=r"log_dir: .*logs is a file, not a directory"):
        train_from_messages(data, model=str(tmp_path / "no-such-model"), output_dir=tmp_path / "out", log_dir=log_file)
    assert log_file.read_text() == "not a directory\n"


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"max_sequence_length": 3}, "of 4 samples, too long: 4"),
        ({"min_reward": 1.0}, "of 4 samples, no_reward: 4"),
    ],
)
def test_data_of_which_nothing_is_kept_is_refused_naming_only_the_reasons(
    tmp_path: Path, tiny_model_dir: Path, options: Dict[str, Any], reason: str
) -> None:
    data = _conversations(tmp_path / "chat.jsonl")
    with pytest.raises(DataError) as raised:
        train_from_messages(data, model=str(tiny_model_dir), **options)
    assert str(raised.value) == f"no usable sample to train on: {reason}"
