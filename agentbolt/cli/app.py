"""The ``agentbolt`` typer application.

Each command lives in its own module of :mod:`agentbolt.cli` and imports heavy dependencies only when it runs;
registering a command is one line below.
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence

import typer

try:  # recent typer versions vendor click
    from typer._click import exceptions as _click_exceptions
except ImportError:  # pragma: no cover - older typer relies on click itself
    from click import exceptions as _click_exceptions  # type: ignore[no-redef]

from agentbolt.cli import demo, models, proxy, serve, store
from agentbolt.cli.errors import CliError

__all__ = ["app", "run"]

app = typer.Typer(
    name="agentbolt",
    help="Train AI agents from the traces of their LLM calls.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Train AI agents from the traces of their LLM calls."""


app.command("store", help=store.HELP)(store.store_command)
app.command("proxy", help=proxy.HELP)(proxy.proxy_command)
app.command("serve", help=serve.HELP)(serve.serve_command)
app.add_typer(models.app, name="models", help=models.HELP)
app.command("demo", help=demo.HELP)(demo.demo_command)


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args: List[str] = list(argv) if argv is not None else sys.argv[1:]
    try:
        result = app(args=args, prog_name="agentbolt", standalone_mode=False)
    except CliError as exc:
        print(f"agentbolt: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except _click_exceptions.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx is not None else str(exc))
        return 0
    except _click_exceptions.UsageError as exc:
        print(f"agentbolt: error: {exc.format_message()}", file=sys.stderr)
        return 2
    except _click_exceptions.ClickException as exc:
        print(f"agentbolt: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return 130
    return int(result) if isinstance(result, int) else 0
