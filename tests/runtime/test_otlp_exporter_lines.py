"""OpenTelemetry's exporter lines about a failed export of agentbolt's own OTLP target: logged while the runner
runs, dropped once it stops (it then reports the spans it gave up in one line of its own; the whole runner is in
test_cs_runner_store_gone.py).

A real OTLP/HTTP exporter bound to a port on 127.0.0.1 that nothing listens on.
"""

from __future__ import annotations

import logging

import pytest
from support.servers import free_port

from agentbolt.tracer.otel import _OtlpStoreTarget
from agentbolt.utils.otlp import LightningStoreOTLPExporter


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
