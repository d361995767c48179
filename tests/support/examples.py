"""Running the examples' command lines as a user does: ``python -m examples...`` from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Optional

from support.servers import REPO

__all__ = ["error_line", "run_example"]

HOSTED_SERVICE_VARIABLES = ("OPENAI_", "AZURE_", "TINKER_")
"""Prefixes of the variables that would point an example at a hosted service; the tests run without them."""


def run_example(args: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` from the repository root, without the hosted services' variables, plus ``env`` (the
    timeout only guards the test run against a command that hangs)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(HOSTED_SERVICE_VARIABLES)}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=environ, capture_output=True, text=True, timeout=120
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of stderr that reports the error (argparse prints its usage before it); fails unless the command
    exited 2 without a traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    return line
