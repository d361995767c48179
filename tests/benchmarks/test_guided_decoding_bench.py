"""``benchmarks/guided_decoding.py`` on the tiny random Llama: both variants run and the result file holds them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_guided_and_unguided_requests_are_timed_side_by_side(tmp_path: Path, tiny_model_dir: Path) -> None:
    command = [sys.executable, "benchmarks/guided_decoding.py", "--model", str(tiny_model_dir), "--rounds", "1"]
    command += ["--temperatures", "0", "1.0", "--n", "2", "--max-tokens", "80", "--threads", "1"]
    command += ["--results-dir", str(tmp_path), "--result-name", "guided-tiny"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "guided-tiny.json").read_text())["results"]
    rows = results["by_temperature"]
    assert [row["temperature"] for row in rows] == [0.0, 1.0]
    for row in rows:
        assert row["unguided_ms_per_token"] > 0 and row["guided_ms_per_token"] > 0
        ratio = row["guided_ms_per_token"] / row["unguided_ms_per_token"]
        assert row["guided_over_unguided"] == pytest.approx(ratio, abs=0.01)
        assert row["guided_choices"] == 2 and 0 <= row["guided_choices_matching"] <= 2 and row["guided_tokens"] > 0
