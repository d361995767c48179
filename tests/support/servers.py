"""Ports and server processes for tests: free and taken ports, ``agentbolt store`` subprocesses."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import httpx

from agentbolt.utils.server_launcher import pick_free_port

REPO = Path(__file__).resolve().parents[2]
STORE_HEALTH_PATH = "/v1/agl/health"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    return pick_free_port("127.0.0.1")


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 held by a listening socket for the duration of the block."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def start_store_process(
    path: Optional[Path],
    port: int,
    extra_args: Sequence[str] = (),
    stderr: int = subprocess.PIPE,
    backend_args: Optional[Sequence[str]] = None,
) -> subprocess.Popen[bytes]:
    """Start ``agentbolt store`` at 127.0.0.1:``port``, on a SQLite file or with ``backend_args``
    (e.g. ``["--backend", "postgres", "--dsn", dsn]``).

    ``stderr`` is piped by default, for failure reports; a process that logs much while nobody reads the pipe
    should pass ``subprocess.DEVNULL``.
    """
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if backend_args is None:
        backend_args = ["--backend", "sqlite", "--path", str(path)]
    command = [sys.executable, "-m", "agentbolt", "store", *backend_args]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING", *extra_args]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def wait_healthy(url: str, process: Optional[subprocess.Popen[bytes]] = None, timeout: float = 60.0) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        AssertionError: ``process`` exited first (with its stderr), or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            stderr = process.stderr.read().decode() if process.stderr else ""
            raise AssertionError(f"server exited early: {stderr}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer 200 within {timeout:g} seconds")
