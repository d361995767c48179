"""``benchmarks/sft_bench.py`` on the tiny random Llama: every loop runs and the result file holds the comparison."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_sft_step_and_the_bare_loops_are_timed_side_by_side(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    command = [sys.executable, "benchmarks/sft_bench.py", "--model", "tiny", "--batch", "2", "--prompt", "12"]
    command += ["--response", "4", "--lora-r", "4", "--threads", "1", "--repeats", "1"]
    command += ["--results-dir", str(tmp_path), "--result-name", "sft-tiny"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "sft-tiny.json").read_text())
    assert document["benchmark"] == "sft_bench" and document["command"].startswith("python benchmarks/sft_bench.py")
    results = document["results"]
    loops = {"sft", "sft_packed", "bare_hf", "bare_targets"}
    assert set(results["step_seconds"]) == set(results["samples_per_second"]) == loops
    assert all(value > 0 for value in results["step_seconds"].values())
    ratio = results["step_seconds"]["sft"] / results["step_seconds"]["bare_targets"]
    assert results["overhead_ratio_vs_bare_targets"] == pytest.approx(ratio, rel=0.01)
    assert results["batch"] == {"samples": 2, "prompt_tokens": 12, "response_tokens": 4}
    assert results["tokens_per_step"] == 2 * 16
