"""Metrics backends: registration rules, console snapshots, Prometheus export, fan-out."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from support.servers import REPO

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


async def test_a_registration_prometheus_refuses_leaves_no_trace() -> None:
    backend = PrometheusMetricsBackend(registry=CollectorRegistry())
    with pytest.raises(ValueError, match="le"):
        backend.register_histogram("latency", ["le"])  # a label name Prometheus reserves
    backend.register_histogram("latency", ["path"])  # the name is free again
    with pytest.raises(ValueError, match="sorted"):
        backend.register_histogram("sizes", buckets=[1.0, 0.5])
    backend.register_histogram("sizes", buckets=[0.5, 1.0])
    await backend.observe_histogram("latency", 0.3, labels={"path": "/"})
    await backend.observe_histogram("sizes", 0.7)


@pytest.mark.parametrize(
    ("name", "label_names"),
    [("my-metric", None), ("1st.metric", None), ("ok.name", ["a-b"]), ("ok.name", ["__internal"]), ("", None)],
)
def test_names_prometheus_cannot_carry_are_refused(name: str, label_names: List[str]) -> None:
    console = ConsoleMetricsBackend()
    multi = MultiMetricsBackend([console, PrometheusMetricsBackend(registry=CollectorRegistry())])
    with pytest.raises(ValueError, match="Prometheus"):
        multi.register_counter(name, label_names)
    assert console._specs == {}  # no backend keeps half of the registration


async def test_backends_sharing_a_registry_share_its_metrics() -> None:
    registry = CollectorRegistry()
    first, second = PrometheusMetricsBackend(registry=registry), PrometheusMetricsBackend(registry=registry)
    for backend in (first, second):
        backend.register_counter("agl.http.total", ["path"])
        await backend.inc_counter("agl.http.total", labels={"path": "/x"})
    assert 'agl_http_total{path="/x"} 2.0' in generate_latest(registry).decode()
    with pytest.raises(ValueError, match="agl_http_total"):
        PrometheusMetricsBackend(registry=registry).register_counter("agl.http.total", ["method"])


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("counter", -1.0),
        ("counter", float("nan")),
        ("counter", float("inf")),
        ("counter", "3"),
        ("histogram", float("nan")),
        ("histogram", float("inf")),
        ("histogram", None),
    ],
)
async def test_values_no_backend_can_record_are_refused(kind: str, value: object) -> None:
    registry = CollectorRegistry()
    console = ConsoleMetricsBackend(log_interval_seconds=3600)
    for backend in (console, PrometheusMetricsBackend(registry=registry)):
        backend.register_counter("jobs")
        backend.register_histogram("seconds")
        with pytest.raises(ValueError, match=r"jobs|seconds"):
            if kind == "counter":
                await backend.inc_counter("jobs", value)  # type: ignore[arg-type]
            else:
                await backend.observe_histogram("seconds", value)  # type: ignore[arg-type]
    assert console._counter_state == {} and console._hist_state == {}
    assert "jobs_total 0.0" in generate_latest(registry).decode()


def _python_with_metrics_dir(code: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose ``PROMETHEUS_MULTIPROC_DIR`` is ``directory``."""
    env = dict(
        os.environ, PYTHONPATH=str(REPO), PROMETHEUS_MULTIPROC_DIR=str(directory), AGENTBOLT_METRICS="prometheus"
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_missing_multiprocess_directory_is_created(tmp_path: Path) -> None:
    directory = tmp_path / "metrics" / "run"
    done = _python_with_metrics_dir(
        """
        import asyncio
        from agentbolt.runner.metrics import runner_metrics
        asyncio.run(runner_metrics().record("succeeded", "train", 1.5))
        """,
        directory,
    )
    assert done.returncode == 0, done.stderr
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    assert 'agentbolt_runner_rollouts_total{mode="train",status="succeeded"} 1.0' in generate_latest(registry).decode()


def test_a_recording_the_directory_cannot_take_is_dropped_with_one_warning(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    done = _python_with_metrics_dir(
        """
        import asyncio, os, shutil
        from agentbolt.utils.metrics import PrometheusMetricsBackend
        backend = PrometheusMetricsBackend()
        backend.register_counter("jobs", ["kind"])
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        for kind in ("a", "b"):
            asyncio.run(backend.inc_counter("jobs", labels={"kind": kind}))
        print("the caller went on")
        """,
        directory,
    )
    assert done.returncode == 0, done.stderr
    assert "the caller went on" in done.stdout
    assert done.stderr.count(f"cannot write to PROMETHEUS_MULTIPROC_DIR={directory}") == 1


def test_a_multiprocess_directory_set_too_late_is_reported(tmp_path: Path) -> None:
    done = _python_with_metrics_dir(
        """
        import os
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR")
        directory = os.environ["METRICS_DIR_LATER"]
        import prometheus_client
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        from agentbolt.utils.metrics import PrometheusMetricsBackend
        PrometheusMetricsBackend(registry=prometheus_client.CollectorRegistry())
        """.replace('os.environ["METRICS_DIR_LATER"]', repr(str(tmp_path))),
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "was set after prometheus_client was imported" in done.stderr


def _documented_metrics() -> Dict[str, Tuple[str, Tuple[str, ...]]]:
    """``docs/metrics.md``'s table: each metric name with its kind and label names."""
    documented: Dict[str, Tuple[str, Tuple[str, ...]]] = {}
    for line in (Path(REPO) / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        kinds = [kind.strip() for kind in cells[1].split(",")]
        labels = tuple(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cells[2])))
        for index, name in enumerate(names):
            documented[name] = (kinds[min(index, len(kinds) - 1)], labels)
    return documented


def test_the_documented_metrics_are_the_registered_ones() -> None:
    from agentbolt.algorithm.grpo.metrics import TrackerMetricsSink
    from agentbolt.gateway.metrics import GatewayMetrics
    from agentbolt.runner.metrics import RunnerMetrics
    from agentbolt.store.http.server import build_store_app
    from agentbolt.store.memory import InMemoryLightningStore

    backend = ConsoleMetricsBackend()
    InMemoryLightningStore(thread_safe=True, tracker=backend)
    build_store_app(lambda *args, **kwargs: None, server_id="metrics-doc", tracker=backend)
    GatewayMetrics(backend)
    RunnerMetrics(backend)
    TrackerMetricsSink(backend)
    registered = {name: (spec.kind, spec.label_names) for name, spec in backend._specs.items()}
    assert registered == _documented_metrics()
