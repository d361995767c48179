"""Errors raised by CLI commands."""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A user-facing error printed as one line; ``exit_code`` 2 means bad arguments."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
