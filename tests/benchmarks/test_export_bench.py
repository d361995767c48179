"""``benchmarks/export_bench.py`` at a few thousand records: each writer runs in its own process, and the result file
holds its time, peak memory and file size; the file written is what ``read_records`` reads back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_the_writers_are_measured_each_in_its_own_process(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/export_bench.py", "--records", "1500"]
    command += ["--results-dir", str(tmp_path), "--result-name", "export"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "export.json").read_text())["results"]
    assert results["records"] == 1500
    assert set(results["writers"]) == {"write_records_parquet", "whole_table_parquet", "write_records_jsonl"}
    for measured in results["writers"].values():
        assert measured["seconds"] > 0 and measured["peak_rss_mb"] > 0 and measured["file_mb"] > 0


def test_the_whole_table_baseline_writes_the_same_records(tmp_path: Path) -> None:
    from export_bench import sample_records, write_whole_table

    from agentbolt.algorithm.sft.export import read_records, write_records

    write_whole_table(sample_records(5), tmp_path / "whole.parquet")
    write_records(sample_records(5), tmp_path / "streamed.parquet")
    assert read_records(tmp_path / "streamed.parquet") == list(sample_records(5))
    import pyarrow.parquet as pq

    whole = pq.read_table(str(tmp_path / "whole.parquet")).to_pylist()
    assert [json.loads(r["prompt"]) for r in whole] == [r["prompt"] for r in sample_records(5)]
