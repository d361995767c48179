"""The command lines of the SFT example (``allinone``, ``algorithm``): a count out of range, a missing config file or an
option SFT does not have stops the command at once with exit code 2 and one error line, before a run directory exists
or a model loads."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from support.examples import error_line, run_example
from support.servers import free_port


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-val", "-1"], "argument --n-val: must be at least 1, got -1"),
        (["--runners", "0"], "argument --runners: must be at least 1, got 0"),
        (["--option", "no_such_option=1"], "error: option no_such_option: not an option of SFT, got 1"),
        (["--option", "batch_size=0"], "error: option batch_size: Input should be greater than or equal to 1, got 0"),
        (["--config", "no-such-config.yaml"], "error: no-such-config.yaml: no such config file"),
    ],
)
def test_allinone_refuses_a_bad_option_before_a_run_starts(args: List[str], message: str, tmp_path: Path) -> None:
    assert message in error_line(run_example(["examples.sft.allinone", *args, "--output-dir", str(tmp_path / "runs")]))
    assert not (tmp_path / "runs").exists()


def test_the_algorithm_process_refuses_an_option_sft_does_not_have() -> None:
    store = f"http://127.0.0.1:{free_port()}"
    line = error_line(run_example(["examples.sft.algorithm", "--store", store, "--option", "no_such_option=1"]))
    assert line == "error: option no_such_option: not an option of SFT, got 1"


def test_the_algorithm_process_over_another_runs_log_is_one_error_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.jsonl").write_text('{"step": 0, "val/reward": 0.5}\n')
    store = f"http://127.0.0.1:{free_port()}"
    options = ["--option", f"log_dir={logs}", "--option", f"checkpoint_dir={tmp_path / 'checkpoints'}"]
    line = error_line(run_example(["examples.sft.algorithm", "--store", store, *options]))
    assert "already holds the metrics of another run" in line
