"""``agentbolt models pull|list|info``: the model registry from the command line."""

from __future__ import annotations

import json
import sys

import typer

from agentbolt.cli.errors import CliError

__all__ = ["HELP", "app"]

HELP = "Manage models: pull (convert) the embedded model, list registry models, show model details."

app = typer.Typer(help=HELP, no_args_is_help=True, add_completion=False)


def _progress(message: str) -> None:
    print(f"agentbolt models: {message}", file=sys.stderr, flush=True)


@app.command("pull")
def pull(
    name: str = typer.Argument("smollm2-135m-instruct", help="Registry name."),
    force: bool = typer.Option(False, help="Convert again even if a cached copy exists."),
) -> int:
    """Convert a registry model into a cached safetensors directory (once) and print its path."""
    from agentbolt.models import ModelNotAvailableError, model_cache_dir, pull_model

    try:
        already = (model_cache_dir(name) / "config.json").is_file() and not force
        path = pull_model(name, force=force, progress=_progress)
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
    if already:
        _progress(f"{name} is already pulled")
    print(path)
    return 0


@app.command("list")
def list_command(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> int:
    """List registry models and whether they are installed and pulled here."""
    from agentbolt.models import list_models

    rows = list_models()
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "installed", "pulled", "description")
    for row in rows:
        table.add_row(
            str(row["name"]),
            "yes" if row["installed"] else "no",
            "yes" if row["pulled"] else "no",
            str(row["description"]),
        )
    Console(width=160).print(table)
    return 0


@app.command("info")
def info(name: str = typer.Argument(..., help="Registry name, model directory or hub id.")) -> int:
    """Print a model's location and architecture as JSON."""
    from agentbolt.models import ModelNotAvailableError, model_info

    try:
        details = model_info(name)
    except ModelNotAvailableError as exc:
        raise CliError(str(exc)) from None
    print(json.dumps(details, indent=2))
    return 0
