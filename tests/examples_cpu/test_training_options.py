"""The command line of the trained examples' ``train.py``: a value out of range, an unknown dtype or model stops the
command at once with exit code 2 and one error line, before a run directory, a runner or the engine exists."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List

import pytest
from support.examples import run_example


def run_train(example: str, args: List[str], output_dir: Path) -> subprocess.CompletedProcess[str]:
    """``python -m examples.EXAMPLE.train ARGS`` (no result file, runs under ``output_dir``)."""
    return run_example([f"examples.{example}.train", *args, "--output-dir", str(output_dir), "--no-result"])


CREDIT = "argument --format-credit: format credit must be at least 0 and"


@pytest.mark.parametrize(
    ("example", "args", "message"),
    [
        ("calc", ["--steps", "-1"], "argument --steps: must be at least 0, got -1"),
        ("rag", ["--n-test", "-3"], "argument --n-test: must be at least 1, got -3"),
        ("sql", ["--n-train", "0"], "argument --n-train: must be at least 1, got 0"),
        ("search_r1", ["--runners", "0"], "argument --runners: must be at least 1, got 0"),
        ("calc", ["--group-size", "1"], "argument --group-size: must be at least 2, got 1"),
        ("calc", ["--temperature", "0"], "argument --temperature: must be greater than 0, got 0"),
        ("calc", ["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
        ("calc", ["--device", "tpu"], "argument --device: expected a torch device name"),
        ("calc", ["--model", "no-such-model"], "error: --model: model 'no-such-model' is neither a registry name"),
        ("calc", ["--format-credit", "0.6"], f"{CREDIT} below 0.5 (a wrong answer can earn it twice"),
        ("sql", ["--format-credit", "0.5"], f"{CREDIT} below 0.5"),
        ("rag", ["--format-credit", "-0.1"], f"{CREDIT} below 0.5"),
    ],
)
def test_a_bad_option_exits_2_with_one_error_line_before_anything_starts(
    example: str, args: List[str], message: str, tmp_path: Path
) -> None:
    result = run_train(example, args, tmp_path / "runs")
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_an_output_dir_that_is_a_file_exits_2_naming_it(tmp_path: Path) -> None:
    output = tmp_path / "runs"
    output.write_text("", encoding="utf-8")
    result = run_train("calc", [], output)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"error: --output-dir {output} is a file, not a directory"


def test_an_output_dir_under_a_file_exits_2_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("", encoding="utf-8")
    output = blocker / "calc"
    result = run_train("calc", [], output)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"error: --output-dir {output}: cannot create it: Not a directory"


def test_a_format_credit_at_or_above_the_limit_is_refused_in_code_too() -> None:
    from examples.common.training import TrainingConfig
    from examples.search_r1.agent import SearchR1Agent
    from examples.sql.agent import SqlAgent

    assert TrainingConfig(format_credit=0.49).format_credit == 0.49
    for credit in (0.5, 0.6, -0.1, float("nan")):
        for build in (TrainingConfig, SqlAgent, SearchR1Agent):  # the agents built directly, too
            with pytest.raises(ValueError, match=r"format credit must be at least 0 and below 0\.5 .*got"):
                build(format_credit=credit)


def test_help_describes_every_configuration_option() -> None:
    result = run_example(["examples.calc.train", "--help"])
    assert result.returncode == 0, result.stderr[-2000:]
    text = " ".join(result.stdout.split())
    for description in (
        "--steps STEPS GRPO training steps. (default: 4)",
        "--group-size GROUP_SIZE Rollouts per task (one GRPO group). (default: 8)",
        "--n-test N_TEST Use the first N held-out tasks (None: all). (default: 64)",
        "--dtype {auto,float32,bfloat16,float16}",
    ):
        assert description in text


BROKEN_TASK_FILES = [
    ("", "no tasks"),
    ('{"id": "train-0", "question": "q"\n', ":1: not valid JSON"),
    ('["a list"]\n', ":1: expected a JSON object, got list"),
    ('{"id": "train-0", "question": "q", "answer": 1}\n', ":1: missing key(s) expression, frame, operation"),
]


@pytest.mark.parametrize(("text", "message"), BROKEN_TASK_FILES)
def test_a_broken_task_file_is_named_with_what_is_wrong(text: str, message: str, tmp_path: Path) -> None:
    from examples.calc.task import load_split
    from examples.common.tasks import TaskFileError

    (tmp_path / "train.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(TaskFileError) as raised:
        load_split("train", tmp_path)
    assert str(raised.value).startswith(str(tmp_path / "train.jsonl")) and message in str(raised.value)


@pytest.mark.parametrize("example", ["rag", "sql"])
def test_every_examples_task_loader_names_a_missing_file(example: str, tmp_path: Path) -> None:
    from examples.common.tasks import TaskFileError
    from examples.rag.corpus import load_questions
    from examples.sql.databases import load_split

    load = load_questions if example == "rag" else load_split
    with pytest.raises(TaskFileError, match=r"test\.jsonl: no such file"):
        load("test", data_dir=tmp_path)


def test_train_with_a_broken_task_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from examples.calc.task import load_split
    from examples.calc.train import SPEC
    from examples.common.training import main

    (tmp_path / "train.jsonl").write_text("{not json\n", encoding="utf-8")
    spec = replace(SPEC, load_train=lambda: load_split("train", tmp_path))
    with pytest.raises(SystemExit) as stopped:
        main(spec, ["--output-dir", str(tmp_path / "runs"), "--no-result"])
    assert stopped.value.code == 2
    message = "not valid JSON (Expecting property name enclosed in double quotes)"
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'train.jsonl'}:1: {message}"
    assert not (tmp_path / "runs").exists()
