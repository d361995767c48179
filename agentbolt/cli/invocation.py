"""Running a typer application as a program: how its outcome becomes an exit code and a one-line error.

Every entry point of the command line goes through :func:`run_app`: the ``agentbolt`` application with all its
commands, and each command module's own ``main`` (``agentbolt.cli.store.main``, ...), which runs that command alone.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import typer

try:  # recent typer versions vendor click
    from typer._click import exceptions as _click_exceptions
except ImportError:  # pragma: no cover - older typer relies on click itself
    from click import exceptions as _click_exceptions  # type: ignore[no-redef]

from agentbolt.cli.errors import CliError

__all__ = ["run_app", "run_command"]


def run_app(app: typer.Typer, argv: Optional[Sequence[str]], prog_name: str) -> int:
    """Run ``app`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    A :class:`CliError` or a usage error is printed as one ``agentbolt: error: ...`` line on stderr; usage errors exit
    with 2, an interrupted command with 130.
    """
    args: List[str] = list(argv) if argv is not None else sys.argv[1:]
    try:
        result = app(args=args, prog_name=prog_name, standalone_mode=False)
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


def run_command(
    command: Callable[..., Any],
    name: str,
    help: str,
    argv: Optional[Sequence[str]],
    context_settings: Optional[Dict[str, Any]] = None,
) -> int:
    """Run one command function as the program ``agentbolt <name>``, with ``argv`` as its arguments."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(name, help=help, context_settings=context_settings)(command)
    return run_app(app, argv, prog_name=f"agentbolt {name}")
