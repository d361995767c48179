"""``agentbolt export``: write a store's rollouts, spans or samples to JSONL or parquet for any trainer.

A SQLite store file is read in place through a read-only store (``SqliteLightningStore(path, read_only=True)``): no
copy is made, nothing is written to the file or created next to it, so a read-only file (or a file in a read-only
folder) exports like any other, and a store a server is writing to is read as any of its readers reads it.
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, get_args

import typer

from agentbolt.cli.errors import CliError
from agentbolt.cli.invocation import run_command
from agentbolt.env_var import API_KEY_ENV_VAR

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = ["HELP", "export_command", "main"]

logger = logging.getLogger(__name__)

HELP = (
    "Export the rollouts, spans or samples (one per LLM call, TRL prompt/completion layout with token ids and "
    "rewards) of a store to JSONL or parquet."
)


class What(str, Enum):
    """What to export."""

    rollouts = "rollouts"
    spans = "spans"
    samples = "samples"


class Format(str, Enum):
    """Output formats."""

    jsonl = "jsonl"
    parquet = "parquet"


class Propagation(str, Enum):
    """How a rollout's rewards reach its calls."""

    backward = "backward"
    final = "final"
    none = "none"


def export_command(
    store: str = typer.Argument(
        ..., help="SQLite store file (only read, never changed), or the URL of a store server (http://host:port)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="File to write (its directory must exist)."),
    what: What = typer.Option(What.samples, "--what", case_sensitive=False, help="What each record is."),
    format: Optional[Format] = typer.Option(
        None, "--format", case_sensitive=False, help="jsonl or parquet (default: from the file suffix)."
    ),
    mode: Optional[List[str]] = typer.Option(None, "--mode", help="Keep rollouts of this mode (repeatable)."),
    status: Optional[List[str]] = typer.Option(None, "--status", help="Keep rollouts of this status (repeatable)."),
    min_reward: Optional[float] = typer.Option(None, "--min-reward", help="Lowest reward kept (inclusive)."),
    max_reward: Optional[float] = typer.Option(None, "--max-reward", help="Highest reward kept (inclusive)."),
    agent: Optional[str] = typer.Option(None, "--agent", help="Regex over agent names (samples: the call's agent)."),
    api_key: Optional[str] = typer.Option(
        None, envvar=API_KEY_ENV_VAR, show_envvar=True, help="Bearer token of a store server that requires one."
    ),
    propagation: Propagation = typer.Option(
        Propagation.backward, "--reward-propagation", case_sensitive=False, help="How rewards reach earlier calls."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show library warnings and logs."),
) -> int:
    """Export what STORE holds; prints how many records were written."""
    import aiohttp

    from agentbolt.algorithm.sft.export import (
        ExportFilter,
        close_store,
        export_records,
        open_store,
        resolve_format,
        write_records,
    )
    from agentbolt.store.sqlite import SqliteStoreError
    from agentbolt.types import RolloutStatus

    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s")

    known_modes = ("train", "val", "test")
    for value in mode or []:
        if value not in known_modes:
            raise CliError(f"--mode {value!r} is not one of {', '.join(known_modes)}")
    known_statuses = get_args(RolloutStatus)
    for value in status or []:
        if value not in known_statuses:
            raise CliError(f"--status {value!r} is not one of {', '.join(known_statuses)}")
    if not output.parent.is_dir():
        raise CliError(f"--output {output}: directory {output.parent} does not exist")
    if _is_part_of_store(output, store):
        raise CliError(f"--output {output} is the store being exported (or one of its files): choose another file")
    try:
        chosen_format = resolve_format(output, format.value if format else None)
    except ImportError as exc:
        raise CliError(str(exc)) from None
    try:
        filters = ExportFilter(
            mode=mode or None, status=status or None, min_reward=min_reward, max_reward=max_reward, agent=agent
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None

    async def read(opened: LightningStore) -> List[Dict[str, Any]]:
        try:
            return await export_records(
                opened,
                what.value,  # type: ignore[arg-type]
                filters,
                propagation=propagation.value,  # type: ignore[arg-type]
            )
        finally:
            await close_store(opened)

    try:
        opened = open_store(store, api_key=api_key)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        records = asyncio.run(read(opened))
    except (OSError, aiohttp.ClientError, SqliteStoreError) as exc:  # server errors, a file changing under a reader
        raise CliError(f"cannot read the store at {store}: {_reason(exc)}", exit_code=1) from None
    try:
        write_records(records, output, format=chosen_format)
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc.strerror or exc}", exit_code=1) from None
    count = len(records)
    print(f"agentbolt export: {count} {what.value} written to {output}")
    return 0


def _is_part_of_store(output: Path, store: str) -> bool:
    """Whether writing ``output`` would overwrite the SQLite store ``store`` or its journal files."""
    if store.startswith(("http://", "https://")):
        return False
    target = output.expanduser().resolve()
    database = Path(store).expanduser().resolve()
    return target in {database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")}


def _reason(exc: BaseException) -> str:
    """One line saying why reading the store failed."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientResponseError):
        message = str(exc.message).strip()
        if not message or message.startswith("<"):  # a web page: not a store server
            return f"the server answered {exc.status} (is it a store server?)"
        hint = f" (pass --api-key or set {API_KEY_ENV_VAR})" if exc.status == 401 else ""
        return f"the server answered {exc.status}: {message.splitlines()[0]}{hint}"
    if isinstance(exc, TimeoutError):
        return "no answer in time (is it a store server?)"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def main(argv: Optional[List[str]] = None) -> int:
    """``agentbolt export`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(export_command, "export", HELP, argv)
