"""Held-out score of an example agent before and after each prompt optimizer, with the embedded model as the agent.

Runs the example once per optimizer (each in its own process, one after the other) and writes one result file
(``benchmarks/results/NAME.json``, see ``benchmarks/result_files.py``): per optimizer, the test-split score of the
seed and of the best prompt (overall and per slice, with 95% Wilson intervals), the score of the best constant
answer (one answer whatever the request), rollouts and optimizer tokens spent, wall time and the load before the run.

``--example`` names the agent: ``room_selector`` (``python -m examples.apo.room_selector_apo --algorithm NAME``;
slices per number of needs and per expected room) or ``names`` (``python -m examples.apo.fewshot_names``, the
name formatter, FewShotAPO only; slices per shape of the name).

``--demo-format`` chooses how ``FewShotAPO`` puts its demonstrations into the prompt: as text inside the template
(``text``) or as earlier chat turns of the template's ``examples`` (``messages``); by default the example's own
choice. Other options (``--rounds``,
``--val-batch-size``, ``--runners``, ``--threads``, ``--limit``...) are passed on to the example. Hold the
machine-wide measurement lock while it runs:

    flock /tmp/agentbolt-measure.lock nice -n -19 .venv/bin/python benchmarks/apo_bench.py --algorithms fewshot \\
        --demo-format messages --log-dir /tmp/apo_logs --result-name apo_fewshot_messages
    .venv/bin/python benchmarks/apo_bench.py --algorithms fewshot --limit 8 --no-result     # a quick look
    flock /tmp/agentbolt-measure.lock nice -n -19 .venv/bin/python benchmarks/apo_bench.py --example names \\
        --algorithms fewshot --demo-format messages --log-dir /tmp/apo_logs --result-name apo_fewshot_names
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from result_files import RunRecord, add_result_options

ROOT = Path(__file__).resolve().parent.parent

DEMO_FORMATS = ("text", "messages")
"""How FewShotAPO writes demonstrations: into the template's text, or as chat turns (with real tool calls)."""

EXAMPLES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "room_selector": ("examples.apo.room_selector_apo", ("fewshot", "apo", "pareto")),
    "names": ("examples.apo.fewshot_names", ("fewshot",)),
}
"""Example name -> (its module, the optimizers it runs)."""


def check_algorithm(example: str, algorithm: str) -> None:
    """Raises ValueError unless ``example`` runs the optimizer ``algorithm``."""
    algorithms = EXAMPLES[example][1]
    if algorithm not in algorithms:
        raise ValueError(f"the {example} example runs {', '.join(algorithms)}, not {algorithm}")


def example_command(
    algorithm: str, output: Path, demo_format: Optional[str], extra: Sequence[str], example: str = "room_selector"
) -> List[str]:
    """The command line of one optimizer's run of the example (``demo_format`` None: the example's default)."""
    check_algorithm(example, algorithm)
    module, algorithms = EXAMPLES[example]
    command = [sys.executable, "-m", module] + (["--algorithm", algorithm] if len(algorithms) > 1 else [])
    if demo_format is not None:
        command += ["--demo-format", demo_format]
    return [*command, "--output", str(output), *extra]


def run_one(
    algorithm: str,
    demo_format: Optional[str],
    extra: Sequence[str],
    log_dir: Optional[Path] = None,
    example: str = "room_selector",
) -> Dict[str, Any]:
    """One optimizer run in a fresh process; its result document plus the load before it started.

    The run's log (every critique, candidate score and new best prompt) goes to ``log_dir/ALGORITHM.log`` when a
    directory is given.
    """
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "result.json"
        command = example_command(algorithm, output, demo_format, extra, example)
        load = os.getloadavg()
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - started
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / f"{algorithm}.log").write_text(completed.stderr, encoding="utf-8")
        if completed.returncode != 0:
            return {"algorithm": algorithm, "error": completed.stderr[-4000:], "returncode": completed.returncode}
        result = json.loads(output.read_text(encoding="utf-8"))
    result["load_before"] = [round(value, 2) for value in load]
    result["process_wall_seconds"] = round(wall, 1)
    if "test_seed" in result and "test_best" in result:
        result["gain_points"] = round(
            100 * (result["test_best"]["all"]["score"] - result["test_seed"]["all"]["score"]), 1
        )
    return result


def main(argv: Optional[Sequence[str]] = None) -> None:
    record = RunRecord.start(__file__, argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="room_selector")
    parser.add_argument("--algorithms", nargs="+", default=None, help="default: every optimizer the example runs")
    parser.add_argument(
        "--demo-format",
        choices=DEMO_FORMATS,
        default=None,
        help="FewShotAPO's demonstrations (default: the example's: text for room_selector, messages for names)",
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each run's log here")
    add_result_options(parser)
    args, extra = parser.parse_known_args(argv)
    algorithms = args.algorithms or list(EXAMPLES[args.example][1])
    for algorithm in algorithms:
        try:
            check_algorithm(args.example, algorithm)
        except ValueError as exc:
            parser.error(str(exc))
    runs = {
        algorithm: run_one(algorithm, args.demo_format, extra, args.log_dir, args.example) for algorithm in algorithms
    }
    report = {"benchmark": f"apo_{args.example}", "demo_format": args.demo_format, "example_args": extra, "runs": runs}
    record.finish(report, args)


if __name__ == "__main__":
    main()
