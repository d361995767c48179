"""``agentbolt vllm ARGS...``: vLLM's own command line, instrumented for training.

``agentbolt vllm serve MODEL [vLLM options]`` is ``vllm serve`` with two differences: chat and completion responses
carry the prompt's and the response's token ids unless a request opts out (:mod:`agentbolt.instrumentation.vllm`),
and runtime LoRA loading (``/v1/load_lora_adapter``) is enabled unless ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` says
otherwise. Arguments, help and exit codes are vLLM's (``agentbolt vllm serve --help``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional, Sequence

import typer

from agentbolt.cli.errors import CliError
from agentbolt.cli.invocation import run_command

__all__ = ["CONTEXT_SETTINGS", "HELP", "main", "run_vllm_cli", "vllm_command"]

HELP = "vLLM's CLI (e.g. 'serve MODEL'), instrumented: responses carry token ids, runtime LoRA loading is on."

CONTEXT_SETTINGS: Dict[str, Any] = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": [],  # --help goes to vLLM
}
"""Every argument, options included, is vLLM's."""


def run_vllm_cli(args: Sequence[str]) -> int:
    """Instrument vLLM, then run its CLI with ``args`` in this process; returns its exit code.

    Raises:
        CliError: vLLM is not installed, or too old to return token ids.
    """
    from agentbolt.instrumentation.vllm import instrument_vllm

    try:
        instrument_vllm()
    except (ImportError, RuntimeError) as exc:
        raise CliError(str(exc)) from None
    os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    from vllm.entrypoints.cli.main import main as vllm_main

    saved = sys.argv
    sys.argv = ["vllm", *args]
    try:
        vllm_main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


def vllm_command(ctx: typer.Context) -> int:
    """Run vLLM's CLI with the given arguments (``agentbolt vllm serve MODEL ...``)."""
    return run_vllm_cli(list(ctx.args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``agentbolt vllm`` alone (``argv`` defaults to ``sys.argv[1:]``)."""
    return run_command(vllm_command, "vllm", HELP, argv, context_settings=CONTEXT_SETTINGS)
