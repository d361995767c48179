#!/usr/bin/env python
"""Memory and time of writing an export as parquet: ``write_records`` (a JSON-lines spool, then row groups) against
building the whole table in memory first (how parquet exports were written before), and JSONL for reference.

Each writer runs in a child process of its own, so that its peak RSS (``ru_maxrss``) is its alone. The records are
synthetic SFT samples made on the fly by a generator (none is held by the caller): a 3-message prompt, a 400-character
completion, 300 prompt and 120 response token ids, a reward, a rollout id and an agent name, like the ``samples``
records of ``agentbolt export``.

Prints one JSON object and writes a result file (``--result-name``)::

    {"records": N, "writers": {"write_records_parquet": {"seconds": s, "peak_rss_mb": m, "file_mb": f}, ...}}

Usage::

    python benchmarks/export_bench.py [--records 90000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator

from result_files import RunRecord, add_result_options

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WRITERS = ("write_records_parquet", "whole_table_parquet", "write_records_jsonl")


def sample_records(count: int) -> Iterator[Dict[str, Any]]:
    for i in range(count):
        yield {
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? Answer with the number only."}] * 3,
            "completion": [{"role": "assistant", "content": "x" * 400}],
            "prompt_token_ids": list(range(300)),
            "response_token_ids": list(range(120)),
            "reward": 1.0,
            "rollout_id": f"ro-{i:08d}",
            "agent_name": "solver",
        }


def write_whole_table(records: Iterator[Dict[str, Any]], path: Path) -> None:
    """The records as one table built in memory, nested values as JSON text: the former parquet export."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentbolt.algorithm.sft.export import _nested  # the same rule for what is written as JSON text

    held = list(records)
    names = list(dict.fromkeys(name for record in held for name in record))
    columns = {}
    for name in names:
        values = [record.get(name) for record in held]
        if any(_nested(value) for value in values):
            values = [None if v is None else json.dumps(v, ensure_ascii=False) for v in values]
        columns[name] = pa.array(values)
    pq.write_table(pa.table(columns), str(path))


def run_writer(writer: str, count: int) -> Dict[str, Any]:
    """In this process: write ``count`` records with ``writer``; seconds, peak RSS and file size."""
    from agentbolt.algorithm.sft.export import write_records

    directory = Path(tempfile.mkdtemp(prefix="export-bench-"))
    path = directory / ("samples.jsonl" if writer.endswith("jsonl") else "samples.parquet")
    started = time.perf_counter()
    if writer == "whole_table_parquet":
        write_whole_table(sample_records(count), path)
    else:
        write_records(sample_records(count), path)
    seconds = time.perf_counter() - started
    size = path.stat().st_size
    path.unlink()
    directory.rmdir()
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "file_mb": round(size / 2**20, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=90_000)
    parser.add_argument("--child", choices=WRITERS, help=argparse.SUPPRESS)
    add_result_options(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_writer(args.child, args.records)))
        return
    record = RunRecord.start(__file__)
    writers = {}
    for writer in WRITERS:
        child = [sys.executable, __file__, "--child", writer, "--records", str(args.records)]
        done = subprocess.run(child, check=True, capture_output=True, text=True)
        writers[writer] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{writer}: {writers[writer]}", file=sys.stderr)
    record.finish({"records": args.records, "writers": writers}, args)


if __name__ == "__main__":
    main()
