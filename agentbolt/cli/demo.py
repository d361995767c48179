"""``agentbolt demo``: train the embedded model to use a calculator tool, on this machine, in minutes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import typer

from agentbolt.cli.errors import CliError

__all__ = ["HELP", "demo_command"]

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
    seed: int = typer.Option(0, "--seed", help="Seed of the generated data, sampling and training."),
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
    # Checked before minutes of training, not after.
    if output_dir.exists() and not output_dir.is_dir():
        raise CliError(f"--output-dir {output_dir} is a file, not a directory")
    if summary_json is not None and summary_json.is_dir():
        raise CliError(f"--summary-json {summary_json} is a directory, not a file")
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
    try:
        with console.status("Preparing the model and the inference engine's decoding kernels ..."):
            from agentbolt.models import resolve_model
            from agentbolt.serving.decode_kernels import load_decode_kernels

            resolve_model(config.model)
            load_decode_kernels()  # compiled once per machine (about 30 s), then loaded from the cache
        result = run_demo(config)
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
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
