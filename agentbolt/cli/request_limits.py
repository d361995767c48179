"""The request-limit options of the commands that run an HTTP server (``store``, ``proxy``, ``serve``):
``--max-request-bytes`` and ``--body-timeout``, defined and checked once (see :mod:`agentbolt.utils.request_limits`).

Each function returns a fresh option to use as a parameter's default::

    def command(max_request_bytes: int = max_request_bytes_option(), body_timeout: float = body_timeout_option()): ...
"""

from __future__ import annotations

import math
from typing import Any

import typer

from agentbolt.cli.errors import CliError
from agentbolt.utils.request_limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES

__all__ = ["body_timeout_option", "max_request_bytes_option"]


def max_request_bytes_option() -> Any:
    """``--max-request-bytes``: the largest request body the server accepts (an integer of at least 1)."""
    return typer.Option(
        DEFAULT_MAX_REQUEST_BYTES, "--max-request-bytes", min=1, help="Largest request body accepted (413 beyond)."
    )


def body_timeout_option() -> Any:
    """``--body-timeout``: seconds a request body may take to arrive after its headers (a finite number > 0)."""
    return typer.Option(
        DEFAULT_BODY_TIMEOUT,
        "--body-timeout",
        callback=_checked_body_timeout,
        help="Seconds a request body may take to arrive after its headers (408 beyond, and the connection is closed).",
    )


def _checked_body_timeout(value: float) -> float:
    """``value`` if it is a finite number of seconds above 0.

    Raises:
        CliError: ``value`` is 0, negative, NaN or infinite.
    """
    if not math.isfinite(value) or value <= 0:
        raise CliError(f"--body-timeout must be a finite number > 0, got {value}")
    return value
