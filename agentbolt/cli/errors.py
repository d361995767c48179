"""Errors raised by CLI commands."""

from __future__ import annotations

__all__ = ["CliError", "check_port_free"]


class CliError(Exception):
    """A user-facing error printed as one line; ``exit_code`` 2 means bad arguments."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def check_port_free(host: str, port: int, option: str = "") -> None:
    """Fail early, before anything is loaded or any data file touched, when the address is taken.

    Raises:
        CliError: Nothing can listen on ``host:port`` (in use, or not an address of this machine).
    """
    from agentbolt.utils.server_launcher import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as exc:
        where = f"{option} {port}: " if option else ""
        raise CliError(f"{where}cannot listen on {host}:{port}: {exc.strerror or exc}") from None
