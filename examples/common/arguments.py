"""Argparse ``type`` functions for the examples' options: a value out of range is a usage error (one line, exit 2),
not a traceback minutes later or a run that silently does something else."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable, Optional

from examples.common.environment import CONFIGURATION_ERROR

__all__ = ["count", "number", "require_port_free", "require_writable_directory", "tcp_port", "torch_device"]


def count(minimum: int = 1, maximum: Optional[int] = None) -> Callable[[str], int]:
    """A whole number of at least ``minimum`` (and, when given, at most ``maximum``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def number(
    *, minimum: float = -math.inf, above: Optional[float] = None, maximum: float = math.inf
) -> Callable[[str], float]:
    """A finite number of at least ``minimum`` (or, with ``above``, greater than ``above``) and at most ``maximum``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be greater than {above:g}, got {value:g}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {value:g}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {value:g}")
        return value

    return parse


def torch_device(text: str) -> str:
    """A torch device name (``cpu``, ``cuda``, ``cuda:1``, ``mps``)."""
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"expected a torch device name such as 'cpu', 'cuda', 'cuda:1' or 'mps', got {text!r}"
        ) from None
    return text


def tcp_port(text: str) -> int:
    """A TCP port number, 1 to 65535."""
    value = count(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, got {value}")
    return value


def require_port_free(parser: argparse.ArgumentParser, option: str, host: str, port: int) -> None:
    """Return when something can listen on ``host:port``; else exit 2 with
    ``error: OPTION PORT: cannot listen on HOST:PORT: REASON``."""
    from agentbolt.utils.server_launcher import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as exc:
        parser.exit(
            CONFIGURATION_ERROR, f"error: {option} {port}: cannot listen on {host}:{port}: {exc.strerror or exc}\n"
        )


def require_writable_directory(parser: argparse.ArgumentParser, option: str, path: Path) -> None:
    """Return when ``path`` is (now) a directory this process can write in, creating it if needed; else exit 2 with
    ``error: OPTION PATH is a file, not a directory`` or ``error: OPTION PATH: cannot create it: REASON`` or
    ``error: OPTION PATH: not writable``."""
    if path.exists() and not path.is_dir():
        parser.exit(CONFIGURATION_ERROR, f"error: {option} {path} is a file, not a directory\n")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.exit(CONFIGURATION_ERROR, f"error: {option} {path}: cannot create it: {exc.strerror or exc}\n")
    if not os.access(path, os.W_OK | os.X_OK):
        parser.exit(CONFIGURATION_ERROR, f"error: {option} {path}: not writable\n")
