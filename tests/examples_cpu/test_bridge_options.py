"""The command lines of the bridges to hosted services (azure, tinker, chartqa, claude_code): a count or ratio out of
range, or a store that does not answer, stops the command at once with exit code 2 and one error line naming it,
before any key is checked or any service is called."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List

import pytest
from support.examples import error_line, run_example
from support.servers import free_port

REPO = Path(__file__).resolve().parents[2]
CLAUDE_STAND_IN = shlex.join([sys.executable, str(Path(__file__).with_name("claude_stand_in") / "claude")])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["examples.chartqa.agent", "--model", "m", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
        (
            ["examples.chartqa.agent", "--model", "m", "--limit", "1000000000"],
            "argument --limit: must be at most 1000, got 1000000000",
        ),
        (["examples.azure.capital_agent", "--model", "m", "--limit", "-1"], "argument --limit: must be at least 1"),
        (["examples.azure.train_capital_agent", "--iterations", "0"], "argument --iterations: must be at least 1"),
        (
            ["examples.azure.train_capital_agent", "--data-filter-ratio", "1.5"],
            "argument --data-filter-ratio: must be at most 1, got 1.5",
        ),
        (["examples.tinker.train_guess_number", "--steps", "-1"], "argument --steps: must be at least 1, got -1"),
        (["examples.tinker.train_guess_number", "--group-size", "1"], "argument --group-size: must be at least 2"),
        (
            ["examples.claude_code.claude_code_agent", "--claude", CLAUDE_STAND_IN, "--max-turns", "0"],
            "argument --max-turns: must be at least 1, got 0",
        ),
    ],
)
def test_a_value_out_of_range_is_refused_before_anything_else(args: List[str], message: str) -> None:
    assert message in error_line(run_example(args))


def test_claude_code_with_a_store_that_refuses_connections_names_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = error_line(
        run_example(["examples.claude_code.claude_code_agent", "--claude", CLAUDE_STAND_IN, "--store", url])
    )
    assert line.startswith(f"error: cannot reach the store at {url} (")
