"""A runner stopping after its store went away reports the spans it could not deliver in agentbolt's own words:
OpenTelemetry's exporter lines (retries, timeouts, its shutdown cutting a retry short) stay out of the log.

Real processes and a real OTLP/HTTP exporter on 127.0.0.1; the store is killed while a span waits to be exported.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from support.interrupt import ctrl_c_when
from support.servers import free_port

from agentbolt.tracer.otel import _OtlpStoreTarget
from agentbolt.utils.otlp import LightningStoreOTLPExporter

from .test_cs_environment import SPLIT_SCRIPT, split_role_environment

OTEL_LINES = ("Transient error", "Shutdown in progress", "Failed to export", "already shutdown")
"""What OpenTelemetry's OTLP/HTTP exporter logs about a failing export and its shutdown."""


def _otel_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if any(text in line for text in OTEL_LINES)]


def test_a_runner_stopping_after_its_store_went_away_logs_no_exporter_lines(tmp_path: Path) -> None:
    port = free_port()
    started = tmp_path / "started"
    algorithm = subprocess.Popen(
        [sys.executable, "-c", SPLIT_SCRIPT, "algorithm", str(started), "wait"],
        env=split_role_environment("algorithm", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store_gone_at: List[float] = []

    def store_gone_while_a_span_is_exported() -> bool:
        """Kill the algorithm (and its store server) once the runner is in its rollout; Ctrl-C once the rollout's
        first span (written a second after it ended) has met the dead store and is being retried."""
        if not started.exists():
            assert algorithm.poll() is None, "the algorithm ended before the runner reached its rollout"
            return False
        if not store_gone_at:
            algorithm.kill()
            algorithm.wait()
            store_gone_at.append(time.monotonic())
        return time.monotonic() - store_gone_at[0] > 3.0

    try:
        runner, stdout, stderr = ctrl_c_when(
            [sys.executable, "-c", SPLIT_SCRIPT, "runner", str(started)],
            store_gone_while_a_span_is_exported,
            env=split_role_environment("runner", port),
            wait_seconds=120,
            exit_seconds=30,
        )
    finally:
        if algorithm.poll() is None:
            algorithm.kill()
            algorithm.wait()
    assert runner.returncode == 0, stderr
    assert "returned runner" in stdout, stderr
    assert _otel_lines(stderr) == [], stderr
    lost = [line for line in stderr.splitlines() if "lost" in line]
    assert len(lost) == 1 and "span(s)" in lost[0], stderr


@pytest.fixture
def unreachable_target() -> _OtlpStoreTarget:
    """An exporter bound to a port nothing listens on, giving up after its first attempt."""
    exporter = LightningStoreOTLPExporter(endpoint=f"http://127.0.0.1:{free_port()}/v1/traces", timeout=0.2)
    return _OtlpStoreTarget(exporter)


def test_a_failed_export_while_running_still_logs_the_exporter_lines(
    unreachable_target: _OtlpStoreTarget, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="opentelemetry"):
        unreachable_target.export([], "ro-1", "at-1")
    assert [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")], caplog.text


def test_a_failed_export_at_shutdown_logs_no_exporter_lines(
    unreachable_target: _OtlpStoreTarget, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable_target.closing = True
    with caplog.at_level(logging.WARNING, logger="opentelemetry"):
        unreachable_target.export([], "ro-1", "at-1")
    assert [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")] == [], caplog.text
