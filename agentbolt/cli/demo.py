"""``agentbolt demo``: train the embedded model to use a calculator tool, on this machine, in minutes."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from agentbolt.cli.errors import CliError

__all__ = ["HELP", "INTERRUPTED_EXIT_CODE", "demo_command"]

INTERRUPTED_EXIT_CODE = 130
"""Exit code of a run stopped by Ctrl-C (or SIGTERM)."""

HELP = (
    "Train SmolLM2-135M-Instruct with GRPO to answer arithmetic questions with a calculator tool, and report "
    "held-out accuracy before and after."
)


def demo_command(
    steps: Optional[int] = typer.Option(None, "--steps", min=0, help="GRPO training steps (default: 4; --quick: 2)."),
    summary_json: Optional[Path] = typer.Option(
        None, "--summary-json", help="Also write the run summary (accuracies, steps, wall time) to this JSON file."
    ),
    output_dir: Path = typer.Option(
        Path("agentbolt-demo"), "--output-dir", help="Each run gets a new directory under this one."
    ),
    quick: bool = typer.Option(False, "--quick", help="Fewer steps and held-out questions, for a first look."),
    seed: int = typer.Option(
        0,
        "--seed",
        min=-(2**63),  # torch's range of seeds (GRPO's seed option)
        max=2**64 - 1,
        help="Seed of the generated data, sampling and training.",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show library logs."),
) -> int:
    """Pull the embedded model, start the store, engine, gateway and runners, train, and print the summary."""
    from rich.console import Console

    from agentbolt.demo.run import DemoConfig, run_demo
    from agentbolt.serving.transformers_engine import configure_openmp

    configure_openmp()
    from agentbolt.models import ModelNotAvailableError

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:  # keep the console to the demo's own progress
        from agentbolt.logging import quiet_model_loading

        quiet_model_loading()
    from agentbolt.algorithm.grpo.distributed import launched_rank

    console = Console()
    output_dir = output_dir.expanduser()  # "--output-dir=~/runs" reaches us unexpanded
    summary_json = summary_json.expanduser() if summary_json is not None else None
    _check_outputs(output_dir, summary_json)  # before minutes of training, not after
    overrides = {"output_dir": output_dir, "seed": seed}
    if steps is not None:
        overrides["steps"] = steps
    config = DemoConfig.quick(**overrides) if quick else DemoConfig(**overrides)  # type: ignore[arg-type]
    try:
        rank, _ = launched_rank()
    except ValueError as exc:  # malformed torchrun variables
        raise CliError(str(exc)) from None
    if rank > 0:  # a follower rank under torchrun: rank 0 reports
        try:
            run_demo(config)
        except ModelNotAvailableError as exc:
            raise CliError(str(exc)) from None
        return 0
    console.print(
        f"[bold]agentbolt demo[/bold]: GRPO on {config.model}, {config.steps} steps x {config.batch_size} questions "
        f"x {config.group_size} rollouts; {config.n_val} held-out questions. Output under {output_dir}/"
    )
    from agentbolt.demo.run import DemoInterrupted

    try:
        with console.status("Preparing the model and the inference engine's decoding kernels ..."):
            from agentbolt.models import resolve_model
            from agentbolt.serving.decode_kernels import load_decode_kernels

            resolve_model(config.model)
            load_decode_kernels()  # compiled once per machine (about 30 s), then loaded from the cache
        result = run_demo(config)
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
    except DemoInterrupted as exc:
        print(f"agentbolt demo: {exc}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except KeyboardInterrupt:  # before the runners started: the model was loading
        print("agentbolt demo: interrupted before training started", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    assert result is not None  # rank 0, or a run alone
    if summary_json is not None:
        summary_json.parent.mkdir(parents=True, exist_ok=True)
        summary_json.write_text(json.dumps(result.summary(), indent=2) + "\n", encoding="utf-8")

    from rich.table import Table

    gain = 100.0 * (result.final_val_accuracy - result.baseline_val_accuracy)
    table = Table(title="agentbolt demo", show_header=False)
    table.add_row("model", f"{result.model} ({result.dtype})")
    table.add_row("held-out accuracy before", f"{100 * result.baseline_val_accuracy:.1f}%")
    table.add_row("held-out accuracy after", f"{100 * result.final_val_accuracy:.1f}% ({gain:+.1f} points)")
    table.add_row("training", f"{result.steps} steps, {result.train_rollouts} rollouts")
    table.add_row(
        "wall time",
        f"{result.wall_seconds:.0f} s (rollouts {result.rollout_seconds:.0f} s, updates {result.update_seconds:.0f} s)",
    )
    console.print(table)
    outputs = [
        ("reward curve", result.curve_path or "(not written: matplotlib is missing)"),
        ("checkpoint", result.checkpoint_dir or "(none)"),
        ("metrics", result.metrics_path),
        ("store", result.store_path),
    ]
    if summary_json is not None:
        outputs.append(("summary", str(summary_json)))
    for name, path in outputs:
        console.print(f"{name + ':':14} {path}", soft_wrap=True, highlight=False)
    return 0


def _check_outputs(output_dir: Path, summary_json: Optional[Path]) -> None:
    """Refuse an ``--output-dir`` or ``--summary-json`` the run could not write into once it has trained.

    Raises:
        CliError: The option at fault and why (exit code 2).
    """
    from agentbolt.algorithm.finetuning.algorithm import check_writable_dir

    try:
        check_writable_dir(output_dir, "--output-dir")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if summary_json is None:
        return
    if summary_json.is_dir():
        raise CliError(f"--summary-json {summary_json} is a directory, not a file")
    if summary_json.exists() and not os.access(summary_json, os.W_OK):
        raise CliError(f"--summary-json {summary_json} is not writable")
    try:
        check_writable_dir(summary_json.parent, f"--summary-json {summary_json}")
    except ValueError as exc:
        raise CliError(str(exc)) from None
