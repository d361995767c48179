"""A runner process (``AGL_CURRENT_ROLE=runner``) whose store server is gone: it waits for it, and Ctrl-C stops it.

Real processes on 127.0.0.1 and a real SIGINT to the runner's process group, as a terminal sends it. Once asked to
stop, the runner does not retry calls to a store that does not answer: what it could not write is reported (spans as
one count of lost spans), and the process exits without tracebacks or asyncio warnings.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from support.interrupt import ctrl_c_when
from support.servers import StoreServerProcess, free_port

from agentbolt.store.client_server import LightningStoreClient

from .test_cs_environment import SPLIT_SCRIPT, split_role_environment

OTEL_EXPORTER_LINES = ("Transient error", "Shutdown in progress", "Failed to export", "already shutdown")
"""What OpenTelemetry's OTLP/HTTP exporter logs about a failing export and its shutdown."""

STOP_SECONDS = 30.0
"""How long the runner may take to exit after Ctrl-C before the test fails (a bound for the test, not a target)."""


def _problems(stderr: str) -> List[str]:
    """Lines that must not appear when a process stops on Ctrl-C."""
    return [line for line in stderr.splitlines() if "Traceback" in line or "Task was destroyed" in line]


def test_ctrl_c_stops_a_runner_in_a_rollout_promptly_when_the_store_is_gone(tmp_path: Path) -> None:
    port = free_port()
    started = tmp_path / "started"
    algorithm = subprocess.Popen(
        [sys.executable, "-c", SPLIT_SCRIPT, "algorithm", str(started), "a", "b", "wait"],
        env=split_role_environment("algorithm", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store_gone_at: List[float] = []

    def store_gone() -> bool:
        """Once the runner is in the rollout "wait", kill the algorithm (and its store server) for good."""
        if not started.exists():
            assert algorithm.poll() is None, "the algorithm ended before the runner reached its rollout"
            return False
        if not store_gone_at:
            algorithm.kill()
            algorithm.wait()
            store_gone_at.append(time.monotonic())
        # The runner's calls now meet a store that is gone, and the rollout's first span (written a second after
        # the rollout ended) is being retried by the OTLP exporter.
        return time.monotonic() - store_gone_at[0] > 3.0

    try:
        runner, stdout, stderr = ctrl_c_when(
            [sys.executable, "-c", SPLIT_SCRIPT, "runner", str(started)],
            store_gone,
            env=split_role_environment("runner", port),
            wait_seconds=120,
            exit_seconds=STOP_SECONDS,
        )
    finally:
        if algorithm.poll() is None:
            algorithm.kill()
            algorithm.wait()
    assert runner.returncode == 0, stderr
    assert "returned runner" in stdout, stderr
    assert _problems(stderr) == [], stderr
    # The spans of the interrupted rollout that never reached the store: one line with their count, in agentbolt's
    # words only (OpenTelemetry's exporter lines about its retries and shutdown stay out).
    lost = [line for line in stderr.splitlines() if "lost" in line]
    assert len(lost) == 1 and "span" in lost[0], stderr
    assert [line for line in stderr.splitlines() if any(text in line for text in OTEL_EXPORTER_LINES)] == [], stderr


def _registered(endpoint: str) -> bool:
    async def workers() -> int:
        client = LightningStoreClient(endpoint)
        try:
            return len(await client.query_workers())
        finally:
            await client.close()

    return asyncio.run(workers()) > 0


def test_an_idle_runner_whose_store_was_killed_waits_quietly_and_stops_on_ctrl_c(
    store_server_process: StoreServerProcess, tmp_path: Path
) -> None:
    server = store_server_process
    killed_at: Optional[float] = None

    def store_killed_a_while_ago() -> bool:
        """Kill the store server once the runner is registered; Ctrl-C after several heartbeats failed."""
        nonlocal killed_at
        if killed_at is None:
            if not _registered(server.endpoint):
                return False
            server.stop(signal.SIGKILL)
            killed_at = time.monotonic()
        return time.monotonic() - killed_at > 6.0  # about six heartbeats and sixty polls of a store that is gone

    runner, stdout, stderr = ctrl_c_when(
        [sys.executable, "-c", SPLIT_SCRIPT, "runner", str(tmp_path / "started")],
        store_killed_a_while_ago,
        env=split_role_environment("runner", server.port),
        wait_seconds=120,
        exit_seconds=STOP_SECONDS,
    )
    # ctrl_c_when checked that the runner was still running (waiting for its store) when Ctrl-C came.
    assert runner.returncode == 0, stderr
    assert "returned runner" in stdout, stderr
    assert _problems(stderr) == [], stderr
    # The outage is reported when it starts, not once per failed call.
    about_the_store = [line for line in stderr.splitlines() if str(server.port) in line]
    assert 1 <= len(about_the_store) <= 3, stderr
