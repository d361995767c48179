"""The whole SFT example in one process tree: store, algorithm and runners wired by ``Trainer``.

Reads ``examples/sft/config.yaml`` (the same file ``agentbolt train`` runs), trains the embedded model on the
training problems, and prints held-out accuracy before and after, overall and per arithmetic shape (product, sum,
difference, quotient, product plus), with 95 % Wilson intervals, the wall time and the peak resident memory.
Everything of the run goes to a new directory under ``--output-dir``: the SQLite store, checkpoints,
``metrics.jsonl``, the reward curve and ``summary.json``; the summary is also written as a result file,
``benchmarks/results/NAME.json`` (``--result-name NAME``; ``--no-result`` for none), as the benchmarks do.

Usage (from the repository root)::

    python -m examples.sft.allinone                                   # the configuration of docs/benchmarks.md
    python -m examples.sft.allinone --option max_steps=1 --n-val 40 --no-result   # a quick look
    python -m examples.sft.allinone --option model=/path/to/hf-model  # any option of the config file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from agentbolt.demo.run import new_run_dir
from agentbolt.utils.stats import wilson_interval
from examples.common.arguments import count
from examples.common.environment import CONFIGURATION_ERROR
from examples.common.heldout import compare, format_table
from examples.common.training import RunRecord, TrainingInterrupted, add_result_options, read_validation_passes
from examples.sft.data import family_of, load_split
from examples.sft.settings import CONFIG_FILE, run_options

__all__ = ["main", "run", "summarize"]

logger = logging.getLogger(__name__)


def summarize(
    history: Sequence[Dict[str, float]],
    wall_seconds: float,
    run_dir: Path,
    heldout: Optional[Sequence[Dict[str, Any]]] = None,
) -> Dict[str, Any]:
    """Accuracy before and after (with 95 % Wilson intervals), per-slice rows, per-step figures, time and memory.

    ``heldout`` holds the per-slice rows of :func:`examples.common.heldout.compare` (as dicts) when the run's store
    could be read back.
    """
    validations = [r for r in history if "val/correct" in r]
    if not validations:
        raise RuntimeError("the run did not validate; see the log for the failure")

    def accuracy(record: Dict[str, float]) -> Dict[str, Any]:
        correct, total = int(record["val/correct"]), int(record["val/total"])
        low, high = wilson_interval(correct, total)
        return {"correct": correct, "total": total, "accuracy": correct / total, "ci95": [low, high]}

    steps = [r for r in history if r["step"] > 0]
    before, after = accuracy(validations[0]), accuracy(validations[-1])
    return {
        "held_out_before": before,
        "held_out_after": after,
        "gain_points": round(100 * (after["accuracy"] - before["accuracy"]), 1),
        "heldout": list(heldout or []),
        "steps": [
            {
                "step": int(r["step"]),
                "train_success": r.get("train/success"),
                "selected": r.get("select/selected"),
                "student_prompts": r.get("samples/student_prompts"),
                "loss": r.get("update/loss"),
                "collect_seconds": r.get("time/collect_seconds"),
                "update_seconds": r.get("time/update_seconds"),
                "update_samples_per_second": r.get("update/samples_per_second"),
            }
            for r in steps
        ],
        "wall_seconds": round(wall_seconds, 1),
        "peak_rss_mb": {
            "main": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "largest_child": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        },
        "run_dir": str(run_dir),
    }


def heldout_rows(store_path: Path, val: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per-slice (arithmetic shape) and overall rows of the first and last validation pass in the run's store."""
    passes = asyncio.run(
        read_validation_passes(store_path, [p["id"] for p in val], family_of, ("accuracy",), metadata_key="sft_task")
    )
    if len(passes) < 2:
        logger.warning("the store holds %d validation pass(es); no per-slice comparison", len(passes))
        return []
    return [row.as_dict() for row in compare(passes[min(passes)], passes[max(passes)])]


def run(
    options: Dict[str, Any],
    *,
    output_dir: Path,
    n_val: Optional[int],
    n_runners: int,
    poll_interval: float,
    console: bool = True,
) -> Dict[str, Any]:
    """Train as ``options`` say (the config file's options, overridden) and return the summary.

    Raises:
        TrainingInterrupted: The run stopped (Ctrl-C) before its final validation; no ``summary.json`` is written.
    """
    started = time.perf_counter()
    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    import agentbolt as agl
    from agentbolt.serving.server import find_free_port
    from examples.sft.agent import math_agent

    run_dir = new_run_dir(output_dir)
    options = {
        **options,
        "checkpoint_dir": str(run_dir / "checkpoints"),
        "log_dir": str(run_dir / "logs"),
        "resume": False,
        "console": console,
    }
    (run_dir / "options.json").write_text(json.dumps(options, indent=1), encoding="utf-8")
    train, val = load_split("train"), load_split("val")
    val = val[:n_val] if n_val is not None else val
    algorithm = agl.SFT(**options)
    tracer = agl.OtelTracer()
    store_path = run_dir / "store.db"
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store_path,  # opened and, when fit ends, closed by the trainer: the file alone then holds the run
        tracer=tracer,
        strategy=agl.ClientServerExecutionStrategy(
            n_runners=n_runners, server_host="127.0.0.1", server_port=find_free_port("127.0.0.1")
        ),
        runner=agl.LitAgentRunner(tracer=tracer, poll_interval=poll_interval),
    )
    import openai  # noqa: F401  # imported before the runners fork, so they share its pages

    trainer.fit(math_agent, train_dataset=train, val_dataset=val)
    # Trainer.fit returns normally after Ctrl-C; the final validation (at step max_steps) then never ran.
    final_step = algorithm.config.max_steps
    if not any(r.get("step") == final_step and "val/correct" in r for r in algorithm.history):
        raise TrainingInterrupted(f"the run stopped before its final validation (step {final_step}); see {run_dir}")
    rows = heldout_rows(store_path, val)
    summary = summarize(algorithm.history, time.perf_counter() - started, run_dir, rows)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    """Command line of the all-in-one example; exits 130 (no result file) when interrupted before the final
    validation."""
    words = list(sys.argv[1:] if argv is None else argv)
    record = replace(
        RunRecord.start("sft_allinone", words), command=shlex.join(["python", "-m", "examples.sft.allinone", *words])
    )
    parser = argparse.ArgumentParser(prog="python -m examples.sft.allinone", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG_FILE, help="Config file whose options are used.")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="Override an option.")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/sft"), help="Runs go under this directory.")
    parser.add_argument("--n-val", type=count(1), default=None, help="Held-out problems (default: all 200).")
    parser.add_argument("--runners", type=count(1), default=None, help="Runner processes (default: the config's).")
    parser.add_argument("--summary-json", type=Path, default=None, help="Also write the summary here.")
    parser.add_argument("--verbose", "-v", action="store_true", help="Show library logs.")
    add_result_options(parser)
    args = parser.parse_args(words)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        options, trainer_config = run_options(args.config, args.option)
    except ValueError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {exc}\n")
    n_runners = args.runners or trainer_config.n_runners
    try:
        summary = run(
            options,
            output_dir=args.output_dir,
            n_val=args.n_val,
            n_runners=n_runners,
            poll_interval=trainer_config.poll_interval,
        )
    except TrainingInterrupted as exc:
        print(f"{exc}; no result file written", file=sys.stderr)
        print("held-out accuracy after: not measured (interrupted)")
        return 130
    if args.summary_json is not None:
        args.summary_json.parent.mkdir(parents=True, exist_ok=True)
        args.summary_json.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    before, after = summary["held_out_before"], summary["held_out_after"]

    def show(result: Dict[str, Any]) -> str:
        low, high = result["ci95"]
        return f"{100 * result['accuracy']:.1f}% ({result['correct']}/{result['total']}, 95% CI {100 * low:.1f}-{100 * high:.1f})"

    print(f"held-out accuracy before: {show(before)}")
    print(f"held-out accuracy after:  {show(after)}  ({summary['gain_points']:+.1f} points)")
    if summary["heldout"]:
        from examples.common.heldout import SliceChange

        print(format_table([SliceChange(**row) for row in summary["heldout"]]))
    print(f"wall time {summary['wall_seconds']:.0f} s; run directory {summary['run_dir']}")
    record.finish(
        {**summary, "options": options, "n_runners": n_runners, "poll_interval": trainer_config.poll_interval}, args
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
