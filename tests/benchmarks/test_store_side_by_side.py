"""``benchmarks/store_bench.py --side-by-side``: the reference's store server and ours driven by one client.

The command docs/benchmarks.md quotes measures for minutes; this runs the same comparison at a few calls per row,
against the reference installed by ``make bench-reference`` (slow suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.postgres import postgres_unavailable_reason

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
REFERENCE_SERVER = REPO / ".venv-ref" / "bin" / "agl"


@pytest.mark.timeout(1200)
def test_side_by_side_with_the_reference_gives_ratios(tmp_path: Path) -> None:
    if not REFERENCE_SERVER.exists():
        pytest.skip(f"{REFERENCE_SERVER} is missing: run `make bench-reference` (installs agentlightning from PyPI)")
    targets = ["reference", "sqlite"] + ([] if postgres_unavailable_reason() else ["postgres"])
    command = [sys.executable, str(REPO / "benchmarks" / "store_bench.py"), "--side-by-side", "--targets", *targets]
    command += ["--rounds", "1", "--count", "10", "--queries", "3", "--concurrency", "1", "4"]
    command += ["--results-dir", str(tmp_path), "--result-name", "side-by-side"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "side-by-side.json").read_text())["results"]["side_by_side"]
    assert {row["backend"] for row in rows} == set(targets)
    ours = [row for row in rows if row["backend"] != "reference" and row["op"] != "query_spans"]
    assert ours and all(row["ratio_to_reference"] > 0 for row in ours)
    assert all(row["ops_per_s"] > 0 for row in rows if row["op"] != "query_spans")
