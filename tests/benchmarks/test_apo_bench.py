"""``benchmarks/apo_bench.py``: the command of each optimizer's run, ``--demo-format`` included, is one the example
accepts, and bad options are refused before anything runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "apo_bench.py"


@pytest.fixture(scope="module")
def apo_bench() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports result_files from its own folder
    try:
        spec = importlib.util.spec_from_file_location("apo_bench", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


@pytest.mark.parametrize("demo_format", ["text", "messages"])
def test_each_run_passes_the_demo_format_to_the_example(apo_bench: ModuleType, demo_format: str) -> None:
    from examples.apo.room_selector_apo import parse_args

    command = apo_bench.example_command("fewshot", Path("out.json"), demo_format, ["--limit", "8", "--runners", "2"])
    assert command[:3] == [sys.executable, "-m", "examples.apo.room_selector_apo"]
    args = parse_args(command[3:])
    assert (args.algorithm, args.demo_format, args.limit, args.runners) == ("fewshot", demo_format, 8, 2)
    assert args.output == Path("out.json")


def test_an_unknown_demo_format_is_refused_with_exit_code_2() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--demo-format", "html", "--no-result"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--demo-format: invalid choice: 'html'" in done.stderr


def test_the_names_example_runs_fewshot_with_its_own_options(apo_bench: ModuleType) -> None:
    from examples.apo.fewshot_names import parse_args

    command = apo_bench.example_command(
        "fewshot", Path("out.json"), None, ["--limit", "8", "--candidates", "3"], "names"
    )
    assert command[:3] == [sys.executable, "-m", "examples.apo.fewshot_names"] and "--algorithm" not in command
    assert "--demo-format" not in command  # the example's own default: chat turns
    args = parse_args(command[3:])
    assert (args.demo_format, args.limit, args.candidates, args.output) == ("messages", 8, 3, Path("out.json"))
    with pytest.raises(ValueError, match="runs fewshot, not apo"):
        apo_bench.example_command("apo", Path("out.json"), "text", [], "names")


def test_an_optimizer_the_example_does_not_run_is_refused_with_exit_code_2() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--example", "names", "--algorithms", "pareto", "--no-result"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "the names example runs fewshot, not pareto" in done.stderr
