"""Metrics backends: registration rules, console snapshots, Prometheus export, fan-out."""

from __future__ import annotations

import logging
import os
import shutil
from typing import List

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agentbolt.utils import metrics
from agentbolt.utils.metrics import (
    ConsoleMetricsBackend,
    MultiMetricsBackend,
    PrometheusMetricsBackend,
    _normalize_label_names,
    _validate_labels,
    get_prometheus_registry,
    setup_multiprocess_prometheus,
)


class FakeClock:
    """Controls ``time.time()`` as seen by the metrics module (a test clock, not a mock of the backend)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(metrics.time, "time", fake.time)
    return fake


def test_label_helpers() -> None:
    assert _normalize_label_names(None) == ()
    assert _normalize_label_names(["b", "a", "b"]) == ("b", "a", "b")
    assert _validate_labels("counter", "c", {"b": 2, "a": "1", "x": "ignored"}, ("a", "b")) == (("a", "1"), ("b", "2"))
    with pytest.raises(ValueError, match=r"Label 'b' is required for Histogram 'h'\."):
        _validate_labels("histogram", "h", {"a": "1"}, ("a", "b"))


async def test_registration_rules() -> None:
    backend = ConsoleMetricsBackend()
    backend.register_counter("requests", ["path"])
    backend.register_counter("requests", ["path"])  # identical: no-op
    with pytest.raises(ValueError, match="already registered"):
        backend.register_counter("requests", ["method"])
    with pytest.raises(ValueError, match="already registered"):
        backend.register_histogram("requests", ["path"])
    backend.register_histogram("latency", buckets=[0.1, 1.0])
    with pytest.raises(ValueError):
        backend.register_histogram("latency", buckets=[0.5])
    with pytest.raises(ValueError, match="not registered"):
        await backend.inc_counter("unknown")
    with pytest.raises(ValueError, match="not registered"):
        await backend.observe_histogram("requests", 1.0, labels={"path": "/"})
    with pytest.raises(ValueError, match="required"):
        await backend.inc_counter("requests")
    assert not backend.has_prometheus()


async def test_console_snapshot_rates_and_percentiles(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    backend = ConsoleMetricsBackend(window_seconds=60, log_interval_seconds=10)
    backend.register_counter("http.total", ["path", "method"], group_level=1)
    backend.register_histogram("http.latency")
    logged: List[str] = []
    backend._log = logged.append  # type: ignore[method-assign]
    await backend.inc_counter("http.total", labels={"path": "/a", "method": "GET"})
    assert logged == ["http.total{path=/a}=0.10/s"]  # first event logs at once; 1 event / 10 s minimum duration
    for i in range(20):
        clock.now += 1
        await backend.inc_counter("http.total", labels={"path": "/a", "method": "POST" if i % 2 else "GET"})
        await backend.observe_histogram("http.latency", 0.001 * (i + 1))
    # Logs happen at most every 10 s: at t+10 and t+20 (when the counter is increased, before the observation).
    assert len(logged) == 3
    histogram, counter = logged[-1].split("  ")  # entries are sorted
    assert counter == "http.total{path=/a}=1.05/s"  # 21 events over 20 s
    assert histogram == "http.latency=10.00ms,18.10ms,18.82ms"  # 1..19 ms, linear interpolation
    clock.now += 200  # everything leaves the window
    await backend.observe_histogram("http.latency", 2.5)
    assert logged[-1] == "http.latency=2.50s,2.50s,2.50s"


async def test_console_logs_through_module_logger(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    backend = ConsoleMetricsBackend(log_interval_seconds=0, group_level=0)
    backend.register_histogram("tiny", ["k"])
    with caplog.at_level(logging.INFO, logger="agentbolt.utils.metrics"):
        await backend.observe_histogram("tiny", 2e-7, labels={"k": "v"})
    assert "tiny=200.00ns,200.00ns,200.00ns" in caplog.text


async def test_prometheus_backend_exports() -> None:
    registry = CollectorRegistry()
    backend = PrometheusMetricsBackend(registry=registry)
    assert backend.has_prometheus()
    backend.register_counter("agl.http.total", ["path"])
    backend.register_histogram("agl.http.latency", buckets=[0.1, 1.0])
    with pytest.raises(ValueError, match="conflicts"):
        backend.register_counter("agl_http.total")
    await backend.inc_counter("agl.http.total", 2, labels={"path": "/x"})
    await backend.observe_histogram("agl.http.latency", 0.5)
    text = generate_latest(registry).decode()
    assert 'agl_http_total{path="/x"} 2.0' in text
    assert 'agl_http_latency_bucket{le="1.0"} 1.0' in text


async def test_multi_backend_fans_out() -> None:
    console = ConsoleMetricsBackend(log_interval_seconds=3600)
    prometheus = PrometheusMetricsBackend(registry=CollectorRegistry())
    multi = MultiMetricsBackend([console, prometheus])
    assert multi.has_prometheus()
    multi.register_counter("jobs", ["kind"])
    await multi.inc_counter("jobs", labels={"kind": "a"})
    assert sum(len(s.values) for s in console._counter_state.values()) == 1
    with pytest.raises(ValueError, match="required"):
        await multi.inc_counter("jobs")
    with pytest.raises(ValueError, match="at least one"):
        MultiMetricsBackend([])
    assert not MultiMetricsBackend([console]).has_prometheus()


def test_multiprocess_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert get_prometheus_registry() is not None
    directory = setup_multiprocess_prometheus()
    try:
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == directory and os.path.isdir(directory)
        assert setup_multiprocess_prometheus() == directory  # an existing setting is kept
        registry = get_prometheus_registry()
        assert isinstance(registry, CollectorRegistry)
        metrics.shutdown_metrics()
    finally:
        # Set by the function itself (not through monkeypatch): remove it so later tests run single-process.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(directory, ignore_errors=True)
