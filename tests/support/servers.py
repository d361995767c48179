"""Ports and server processes for tests: free and taken ports, ``agentbolt store`` subprocesses and their outages."""

from __future__ import annotations

import contextlib
import http.server
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List, Literal, Optional, Sequence

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


@contextlib.contextmanager
def serving_in_thread(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 with ``handler``, in a thread; yields its base URL (no trailing /)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


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
    should pass ``subprocess.DEVNULL``. stdout is piped for :func:`wait_serving` (the command prints a few lines).
    """
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if backend_args is None:
        backend_args = ["--backend", "sqlite", "--path", str(path)]
    command = [sys.executable, "-m", "agentbolt", "store", *backend_args]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING", *extra_args]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr)


def wait_serving(process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Wait for the line ``agentbolt store: serving ...`` of a :func:`start_store_process` server.

    The command prints it once every worker process is up, while the health route answers as soon as one is: a test
    that kills workers must wait for this line, or it may kill one still starting, which fails the server's start.

    Raises:
        AssertionError: ``process`` exited first (with its stderr), or ``timeout`` seconds passed.
    """
    assert process.stdout is not None, "start the server with stdout=PIPE"
    deadline = time.monotonic() + timeout
    fd = process.stdout.fileno()
    printed = b""
    # A selector, not select.select: a long test run can hold more than 1,024 descriptors.
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"agentbolt store: serving" not in printed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the store did not say it was serving within {timeout:g} seconds: {printed!r}")
            if not selector.select(min(remaining, 0.5)):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                stderr = process.stderr.read().decode() if process.stderr else ""
                raise AssertionError(f"server exited early: {stderr}")
            printed += chunk


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


OutageKind = Literal["pause", "restart", "kill"]


class StoreServerProcess:
    """An ``agentbolt store`` subprocess on a SQLite file that a test pauses, or stops and restarts on the same data.

    Its stderr goes to a log file next to the database, quoted when the server fails to start.
    """

    def __init__(self, db: Path, port: Optional[int] = None) -> None:
        self.db = db
        self.port = port if port is not None else free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.errors: List[BaseException] = []
        """Failures of outages ended in the background (a restart that did not come up)."""

    def start(self) -> None:
        """Start the server and wait until it answers its health route."""
        log = self.db.with_name(f"store-{time.monotonic_ns()}.log")
        with open(log, "wb") as stderr:
            self.process = start_store_process(self.db, self.port, stderr=stderr.fileno())
        try:
            wait_healthy(self.endpoint + STORE_HEALTH_PATH, self.process, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log:\n{log.read_text(errors='replace')[-3000:]}") from None

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the server with ``signum`` (a paused server is resumed first so that it can exit)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.send_signal(signal.SIGCONT)
            self.process.wait(20)

    def outage(self, kind: OutageKind, seconds: float) -> threading.Thread:
        """Begin an outage now and end it ``seconds`` later from a background thread (returned, to join).

        ``"pause"`` stops the process (SIGSTOP) and resumes it; ``"restart"`` stops it with SIGTERM and ``"kill"``
        with SIGKILL, then starts a new server on the same file and port. When this returns, the server is already
        unreachable.
        """
        assert self.process is not None
        if kind == "pause":
            self.process.send_signal(signal.SIGSTOP)
        else:
            self.stop(signal.SIGTERM if kind == "restart" else signal.SIGKILL)

        def end() -> None:
            try:
                time.sleep(seconds)
                if kind == "pause":
                    assert self.process is not None
                    self.process.send_signal(signal.SIGCONT)
                else:
                    self.start()
            except BaseException as exc:  # reported by the test through `errors`, not lost in the thread
                self.errors.append(exc)

        thread = threading.Thread(target=end, name=f"store-{kind}", daemon=True)
        thread.start()
        return thread
