"""``agentbolt export``: write a store's rollouts, spans or samples to JSONL or parquet for any trainer.

A SQLite store file is read in place through a read-only store (``SqliteLightningStore(path, read_only=True)``): no
copy is made, nothing is written to the file or created next to it, so a read-only file (or a file in a read-only
folder) exports like any other, and a store a server is writing to is read as any of its readers reads it.

The output replaces an existing file only once it is complete (an interrupted export leaves the previous file as it
was); JSONL is written as the rollouts are read. Progress goes to stderr: a line redrawn in place on a terminal,
else a line every :data:`PROGRESS_LOG_SECONDS` seconds.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, TextIO, get_args

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

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", "": "jsonl"}
"""Output suffixes and the format each one means when ``--format`` is not given (a name without a suffix, such as
``/dev/stdout``, is JSONL); any other suffix needs ``--format``."""

PROGRESS_LOG_SECONDS = 10.0
"""Seconds between progress lines when stderr is not a terminal."""

_REDRAW_SECONDS = 0.1


class ExportProgress:
    """Shows how far an export is on ``stream``: a line redrawn in place on a terminal (erased at the end), else a
    line every :data:`PROGRESS_LOG_SECONDS` seconds (none for an export shorter than that)."""

    def __init__(self, what: str, stream: TextIO) -> None:
        self.what = what
        self.stream = stream
        self.terminal = stream.isatty()
        self.shown = time.monotonic()
        self.drawn = False

    def __call__(self, done: int, total: int, records: int) -> None:
        now = time.monotonic()
        status = f"agentbolt export: {done}/{total} rollouts read, {records} {self.what}"
        if self.terminal:
            if done < total and now - self.shown < _REDRAW_SECONDS:
                return
            self.stream.write(f"\r{status}\x1b[K")
            self.drawn = True
        elif now - self.shown >= PROGRESS_LOG_SECONDS:
            self.stream.write(status + "\n")
        else:
            return
        self.stream.flush()
        self.shown = now

    def close(self) -> None:
        """Erase the line drawn on a terminal."""
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


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
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="File to write: .jsonl (or .ndjson, or no suffix) or .parquet; any other name with --format (its "
        "directory must exist); - for the standard output.",
    ),
    what: What = typer.Option(What.samples, "--what", case_sensitive=False, help="What each record is."),
    format: Optional[Format] = typer.Option(
        None, "--format", case_sensitive=False, help="jsonl or parquet (default: from the suffix of --output)."
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
        STANDARD_OUTPUT,
        ExportFilter,
        ExportWriteError,
        close_store,
        export_store,
        open_store,
        resolve_format,
    )
    from agentbolt.store.sqlite import SqliteStoreError
    from agentbolt.types import RolloutStatus

    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    # "-" is the usual name of the standard output (never a file called "-"); /dev/stdout is written as it too,
    # through file descriptor 1, so that a shell's `>>` appends.
    to_stdout = str(output) in (STANDARD_OUTPUT, "/dev/stdout")
    if to_stdout:
        output = Path(STANDARD_OUTPUT)

    known_modes = ("train", "val", "test")
    for value in mode or []:
        if value not in known_modes:
            raise CliError(f"--mode {value!r} is not one of {', '.join(known_modes)}")
    known_statuses = get_args(RolloutStatus)
    for value in status or []:
        if value not in known_statuses:
            raise CliError(f"--status {value!r} is not one of {', '.join(known_statuses)}")
    if to_stdout:
        if format is not None and format.value == "parquet":
            raise CliError(
                "--format parquet cannot be written to the standard output (it is not seekable): name a file"
            )
    elif output.is_dir():
        raise CliError(f"--output {output} is a directory: name the file to write")
    elif not output.parent.is_dir():
        raise CliError(f"--output {output}: directory {output.parent} does not exist")
    elif _is_part_of_store(output, store):
        raise CliError(f"--output {output} is the store being exported (or one of its files): choose another file")
    if format is None and not to_stdout and output.suffix.lower() not in SUFFIXES:
        raise CliError(
            f"--output {output}: cannot tell the format from {output.suffix!r}; name the file .jsonl or .parquet, or "
            "pass --format jsonl|parquet"
        )
    try:
        if format is not None:
            chosen_format = resolve_format(output, format.value)
        else:
            chosen_format = resolve_format(output, "jsonl" if to_stdout else SUFFIXES[output.suffix.lower()])
    except ImportError as exc:
        raise CliError(str(exc)) from None
    try:
        filters = ExportFilter(
            mode=mode or None, status=status or None, min_reward=min_reward, max_reward=max_reward, agent=agent
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None

    progress = ExportProgress(what.value, sys.stderr)

    async def export(opened: LightningStore) -> int:
        try:
            return await export_store(
                opened,
                output,
                what.value,  # type: ignore[arg-type]
                format=chosen_format,  # type: ignore[arg-type]
                filters=filters,
                propagation=propagation.value,  # type: ignore[arg-type]
                progress=progress,
            )
        finally:
            await close_store(opened)

    try:
        opened = open_store(store, api_key=api_key)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        count = asyncio.run(export(opened))
    except ExportWriteError as exc:
        if to_stdout and exc.errno == errno.EPIPE:  # the reader stopped early (`| head`): nothing to report
            return 1
        raise CliError(exc.strerror or str(exc), exit_code=1) from None
    except (OSError, aiohttp.ClientError, SqliteStoreError) as exc:  # server errors, a file changing under a reader
        raise CliError(f"cannot read the store at {store}: {_reason(exc)}", exit_code=1) from None
    finally:
        progress.close()
    # On stderr, like the progress: the records may be going to stdout, and nothing else may be mixed into them.
    where = "the standard output" if to_stdout else output
    print(f"agentbolt export: {count} {what.value} written to {where} ({chosen_format})", file=sys.stderr)
    return 0


def _is_part_of_store(output: Path, store: str) -> bool:
    """Whether writing ``output`` would overwrite the SQLite store ``store`` or its journal files."""
    if store.lower().startswith(("http://", "https://")):
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
