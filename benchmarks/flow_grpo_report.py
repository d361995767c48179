"""Held-out results of Flow-GRPO runs side by side, read from the validation records in each run's store.

A run of ``python -m examples.flow_grpo.train`` records one solve record per held-out question and validation pass
in its ``store.sqlite``. This script reads them back for one or more run directories (for instance an
``--untrained`` baseline and a training run on the same questions) and writes, per run and pass, success per
source with 95 % Wilson intervals and the loop statistics (planner turns, tool calls, stop reasons, first actions),
plus the questions every pass solved. Nothing is re-run: the figures are the runs' own.

Usage:
    .venv/bin/python benchmarks/flow_grpo_report.py runs/flow-grpo/cpu-untrained-X runs/flow-grpo/cpu-X
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List

from result_files import RunRecord, add_result_options


def run_report(run_dir: Path) -> Dict[str, Any]:
    """Every validation pass of one run: per-source success, loop statistics and the solved question ids.

    Raises:
        FileNotFoundError: The directory holds no ``store.sqlite``.
        ValueError: The store holds no validation pass.
    """
    from agentbolt.store.sqlite import SqliteLightningStore
    from examples.flow_grpo.evaluation import loop_stats, read_validation_records, source_success

    path = run_dir / "store.sqlite"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no store.sqlite (not a Flow-GRPO run directory)")
    passes = read_validation_records(SqliteLightningStore(str(path)))
    if not passes:
        raise ValueError(f"{path} holds no validation pass")
    report: Dict[str, Any] = {}
    for step in sorted(passes):
        records = passes[step]
        report[f"step_{step}"] = {
            "success": [row.model_dump() for row in source_success(records)],
            "loop": loop_stats(records).model_dump(),
            "solved_ids": [str(r["id"]) for r in records if float(r["reward"]) >= 1.0],
        }
    return report


def main() -> int:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Flow-GRPO run directories (each with store.sqlite)")
    add_result_options(parser)
    args = parser.parse_args()
    results: Dict[str, Any] = {}
    errors: List[str] = []
    for run_dir in args.runs:
        try:
            results[run_dir.name] = run_report(run_dir)
        except (FileNotFoundError, ValueError) as exc:
            errors.append(str(exc))
    if errors:
        for message in errors:
            print(f"error: {message}", file=sys.stderr)
        return 2
    record.finish(results, args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the examples package lives at the root
    raise SystemExit(main())
