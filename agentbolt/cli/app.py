"""The ``agentbolt`` typer application: the top of the command line, which no other module imports.

Each command lives in its own module of :mod:`agentbolt.cli` and imports heavy dependencies only when it runs;
registering a command is one line below. The command modules know nothing of this one: each has its own ``main``
entry that runs it alone (:func:`agentbolt.cli.invocation.run_command`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import typer

from agentbolt.cli import demo, export, models, prometheus, proxy, serve, store, train, vllm
from agentbolt.cli.invocation import run_app

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


app.command("store", help=store.HELP, context_settings=store.CONTEXT_SETTINGS)(store.store_command)
app.command("proxy", help=proxy.HELP)(proxy.proxy_command)
app.command("serve", help=serve.HELP)(serve.serve_command)
app.add_typer(models.app, name="models", help=models.HELP)
app.command("demo", help=demo.HELP)(demo.demo_command)
app.command("export", help=export.HELP)(export.export_command)
app.command("train", help=train.HELP)(train.train_command)
app.command("vllm", help=vllm.HELP, context_settings=vllm.CONTEXT_SETTINGS)(vllm.vllm_command)
app.command("prometheus", help=prometheus.HELP)(prometheus.prometheus_command)


def run(argv: Optional[Sequence[str]] = None, prog_name: str = "agentbolt") -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    ``prog_name`` is the name usage lines and errors show: ``agentbolt``, or ``agl`` for the reference's command
    name (the same commands, flags and behaviour).
    """
    return run_app(app, argv, prog_name=prog_name)
