"""Counters and histograms with pluggable backends: console (rolling window), Prometheus, or several at once.

Components record metrics through a :class:`MetricsBackend` without knowing where they go. Metrics must be
registered (name, label names, buckets) before they are recorded; recording validates the labels.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import re
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

from agentbolt.env_var import METRICS_ENV_VAR
from agentbolt.utils.imports import import_extra

__all__ = [
    "MetricsBackend",
    "ConsoleMetricsBackend",
    "PrometheusMetricsBackend",
    "MultiMetricsBackend",
    "setup_multiprocess_prometheus",
    "make_metrics_dir",
    "get_prometheus_registry",
    "shutdown_metrics",
    "mark_process_dead",
    "mark_exited_processes_dead",
    "default_tracker",
    "set_default_tracker",
    "tracker_from_names",
]

logger = logging.getLogger(__name__)

LabelKey = Tuple[Tuple[str, str], ...]
DEFAULT_BUCKETS: Tuple[float, ...] = (0.1, 0.2, 0.5, 1.0, 2.0)


def _normalize_label_names(label_names: Optional[Sequence[str]]) -> Tuple[str, ...]:
    """Label names as a tuple (``None`` -> empty); order and duplicates are kept."""
    return tuple(label_names) if label_names is not None else ()


def _validate_labels(
    kind: str, metric_name: str, labels: Optional[Dict[str, str]], expected_names: Sequence[str]
) -> LabelKey:
    """Label values of a recording, in the registered order.

    Args:
        kind: ``"counter"`` or ``"histogram"`` (used in the error message).
        metric_name: The metric.
        labels: The labels passed by the caller.
        expected_names: The registered label names.

    Returns:
        ``((name, value), ...)`` in registered order (extra labels are ignored).

    Raises:
        ValueError: A registered label is missing.
    """
    given = labels or {}
    result: List[Tuple[str, str]] = []
    for name in expected_names:
        if name not in given:
            raise ValueError(f"Label '{name}' is required for {kind.capitalize()} '{metric_name}'.")
        result.append((name, str(given[name])))
    return tuple(result)


def _validate_value(kind: str, metric_name: str, value: Any) -> float:
    """A recording's value as a float: a real number, and for a counter an increase (finite, not negative).

    Raises:
        ValueError: Not a number, NaN or infinite, or a negative counter increase. Prometheus would keep a NaN or
            an infinity in the metric's total for the rest of the process.
    """
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{kind.capitalize()} '{metric_name}' records numbers, got {type(value).__name__}: {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{kind.capitalize()} '{metric_name}' cannot record {number!r}.")
    if kind == "counter" and number < 0:
        raise ValueError(f"Counter '{metric_name}' can only increase, got the amount {number!r}.")
    return number


@dataclass(frozen=True)
class _MetricSpec:
    kind: str
    label_names: Tuple[str, ...]
    buckets: Optional[Tuple[float, ...]]
    group_level: Optional[int]


class MetricsBackend:
    """Base backend: keeps the metric registry and validates recordings.

    Subclasses implement :meth:`_on_register` (optional) and the two async recording methods.
    """

    def __init__(self) -> None:
        self._specs: Dict[str, _MetricSpec] = {}
        self._registry_lock = threading.Lock()

    def has_prometheus(self) -> bool:
        """Whether this backend exports to Prometheus."""
        return False

    def _register(self, name: str, spec: _MetricSpec) -> bool:
        """Record a metric spec; False when an identical one exists. Conflicts raise ``ValueError``."""
        with self._registry_lock:
            existing = self._specs.get(name)
            if existing is not None:
                if (existing.kind, existing.label_names, existing.buckets) != (
                    spec.kind,
                    spec.label_names,
                    spec.buckets,
                ):
                    raise ValueError(
                        f"Metric '{name}' is already registered as a {existing.kind} with labels "
                        f"{list(existing.label_names)}; cannot re-register it as a {spec.kind} with labels "
                        f"{list(spec.label_names)}."
                    )
                return False
            self._specs[name] = spec
            return True

    def _spec(self, kind: str, name: str) -> _MetricSpec:
        spec = self._specs.get(name)
        if spec is None or spec.kind != kind:
            raise ValueError(f"{kind.capitalize()} '{name}' is not registered.")
        return spec

    def register_counter(
        self, name: str, label_names: Optional[Sequence[str]] = None, group_level: Optional[int] = None
    ) -> None:
        """Declare a counter.

        Args:
            name: Metric name (dots allowed).
            label_names: Labels every recording must provide.
            group_level: Console grouping: aggregate over labels past the first ``group_level``.

        Raises:
            ValueError: The name is registered with a different kind or labels.
        """
        self._declare(name, _MetricSpec("counter", _normalize_label_names(label_names), None, group_level))

    def register_histogram(
        self,
        name: str,
        label_names: Optional[Sequence[str]] = None,
        buckets: Optional[Sequence[float]] = None,
        group_level: Optional[int] = None,
    ) -> None:
        """Declare a histogram.

        Args:
            name: Metric name (dots allowed).
            label_names: Labels every recording must provide.
            buckets: Bucket upper bounds (default ``(0.1, 0.2, 0.5, 1.0, 2.0)``).
            group_level: Console grouping: aggregate over labels past the first ``group_level``.

        Raises:
            ValueError: The name is registered with a different kind, labels or buckets.
        """
        spec = _MetricSpec(
            "histogram",
            _normalize_label_names(label_names),
            tuple(buckets) if buckets is not None else DEFAULT_BUCKETS,
            group_level,
        )
        self._declare(name, spec)

    def _declare(self, name: str, spec: _MetricSpec) -> bool:
        """Register ``spec`` under ``name``; a new metric is then handed to :meth:`_on_register`.

        Returns:
            Whether the metric is new (False: an identical one was registered before).

        Raises:
            ValueError: A conflicting registration, or :meth:`_on_register` refused the metric (which is then
                forgotten, so that a corrected registration can follow).
        """
        if not self._register(name, spec):
            return False
        try:
            self._on_register(name, spec)
        except BaseException:
            self._undeclare(name)
            raise
        return True

    def _undeclare(self, name: str) -> None:
        """Forget a metric whose registration failed part way."""
        with self._registry_lock:
            self._specs.pop(name, None)

    def _on_register(self, name: str, spec: _MetricSpec) -> None:
        """Hook for backends that create objects per metric."""

    async def inc_counter(self, name: str, amount: float = 1.0, labels: Optional[Dict[str, str]] = None) -> None:
        """Increase a counter.

        Raises:
            ValueError: Unregistered counter, missing label, or an amount that is not a finite number >= 0.
        """
        raise NotImplementedError()

    async def observe_histogram(self, name: str, value: float, labels: Optional[Dict[str, str]] = None) -> None:
        """Record one histogram observation.

        Raises:
            ValueError: Unregistered histogram, missing label, or a value that is not a finite number.
        """
        raise NotImplementedError()


# --------------------------------------------------------------------------------------------------------------------
# Console


@dataclass
class _Series:
    timestamps: Deque[float] = field(default_factory=deque)
    values: Deque[float] = field(default_factory=deque)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 1]) of sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def _format_duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f}ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f}µs"
    return f"{seconds * 1e9:.2f}ns"


def _format_labels(labels: LabelKey) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f"{k}={v}" for k, v in labels) + "}"


class ConsoleMetricsBackend(MetricsBackend):
    """Logs rolling-window rates (counters) and percentiles (histograms) as one INFO line at most every interval.

    Args:
        window_seconds: Events older than this are forgotten (``None`` keeps everything).
        log_interval_seconds: Minimum time between two log lines; the first event always logs.
        group_level: Aggregate series over labels past the first ``group_level`` (overrides per-metric levels;
            ``None`` defers to the metric, and a level below 1 merges all labels).
    """

    def __init__(
        self,
        window_seconds: Optional[float] = 60.0,
        log_interval_seconds: float = 10.0,
        group_level: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.window_seconds = window_seconds
        self.log_interval_seconds = log_interval_seconds
        self.group_level = group_level
        self._counter_state: Dict[Tuple[str, LabelKey], _Series] = {}
        self._hist_state: Dict[Tuple[str, LabelKey], _Series] = {}
        self._last_log_time: Optional[float] = None
        self._lock = threading.Lock()

    def _prune(self, series: _Series, now: float) -> None:
        if self.window_seconds is None:
            return
        cutoff = now - self.window_seconds
        while series.timestamps and series.timestamps[0] < cutoff:
            series.timestamps.popleft()
            series.values.popleft()

    def _record(self, state: Dict[Tuple[str, LabelKey], _Series], key: Tuple[str, LabelKey], value: float) -> None:
        now = time.time()
        with self._lock:
            series = state.setdefault(key, _Series())
            series.timestamps.append(now)
            series.values.append(value)
            self._prune(series, now)
            due = self._last_log_time is None or now - self._last_log_time >= self.log_interval_seconds
            if not due:
                return
            self._last_log_time = now
            counters, histograms = self._snapshot(now)
        self._log_snapshot(counters, histograms, now)

    def _snapshot(self, now: float) -> Tuple[Dict[Tuple[str, LabelKey], _Series], Dict[Tuple[str, LabelKey], _Series]]:
        def group(state: Dict[Tuple[str, LabelKey], _Series]) -> Dict[Tuple[str, LabelKey], _Series]:
            grouped: Dict[Tuple[str, LabelKey], _Series] = {}
            for (name, labels), series in state.items():
                self._prune(series, now)
                if not series.timestamps:
                    continue
                spec = self._specs.get(name)
                level = self.group_level if self.group_level is not None else (spec.group_level if spec else None)
                key = (name, self._truncate_labels_for_logging(labels, level))
                target = grouped.setdefault(key, _Series())
                target.timestamps.extend(series.timestamps)
                target.values.extend(series.values)
            return grouped

        return group(self._counter_state), group(self._hist_state)

    @staticmethod
    def _truncate_labels_for_logging(labels: LabelKey, group_level: Optional[int]) -> LabelKey:
        """Labels kept when grouping: the first ``group_level`` ones (none if the level is None or < 1)."""
        if group_level is None or group_level < 1:
            return ()
        return labels[:group_level]

    def _log_counter(
        self, name: str, labels: LabelKey, timestamps: Sequence[float], amounts: Sequence[float], snapshot_time: float
    ) -> Optional[str]:
        """``name{labels}=<rate>/s`` over the window, or None without events."""
        if not timestamps:
            return None
        start = min(timestamps)
        if self.window_seconds is not None:
            start = max(start, snapshot_time - self.window_seconds)
        min_duration = self.log_interval_seconds if self.log_interval_seconds > 0 else 1e-3
        rate = sum(amounts) / max(snapshot_time - start, min_duration)
        return f"{name}{_format_labels(labels)}={rate:.2f}/s"

    def _log_histogram(
        self,
        name: str,
        labels: LabelKey,
        values: Sequence[float],
        buckets: Optional[Sequence[float]],
        snapshot_time: float,
    ) -> Optional[str]:
        """``name{labels}=p50,p95,p99``, or None without observations."""
        if not values:
            return None
        ordered = sorted(values)
        parts = ",".join(_format_duration(_percentile(ordered, q)) for q in (0.5, 0.95, 0.99))
        return f"{name}{_format_labels(labels)}={parts}"

    def _log_snapshot(
        self,
        counter_snaps: Dict[Tuple[str, LabelKey], _Series],
        hist_snaps: Dict[Tuple[str, LabelKey], _Series],
        snapshot_time: float,
    ) -> None:
        entries: List[str] = []
        for (name, labels), series in counter_snaps.items():
            entry = self._log_counter(name, labels, list(series.timestamps), list(series.values), snapshot_time)
            if entry:
                entries.append(entry)
        for (name, labels), series in hist_snaps.items():
            spec = self._specs.get(name)
            entry = self._log_histogram(
                name, labels, list(series.values), spec.buckets if spec else None, snapshot_time
            )
            if entry:
                entries.append(entry)
        if entries:
            self._log("  ".join(sorted(entries)))

    def _log(self, message: str) -> None:
        logger.info(message)

    async def inc_counter(self, name: str, amount: float = 1.0, labels: Optional[Dict[str, str]] = None) -> None:
        """Count ``amount`` for the series identified by ``labels``."""
        spec = self._spec("counter", name)
        key = _validate_labels("counter", name, labels, spec.label_names)
        self._record(self._counter_state, (name, key), _validate_value("counter", name, amount))

    async def observe_histogram(self, name: str, value: float, labels: Optional[Dict[str, str]] = None) -> None:
        """Record ``value`` for the series identified by ``labels``."""
        spec = self._spec("histogram", name)
        key = _validate_labels("histogram", name, labels, spec.label_names)
        self._record(self._hist_state, (name, key), _validate_value("histogram", name, value))


# --------------------------------------------------------------------------------------------------------------------
# Prometheus


def _import_prometheus() -> Any:
    return import_extra(
        "prometheus_client", feature="PrometheusMetricsBackend", extra="prometheus", package="prometheus-client"
    )


def setup_multiprocess_prometheus() -> str:
    """Make sure ``PROMETHEUS_MULTIPROC_DIR`` points to an existing directory (a fresh temp dir if unset).

    Returns:
        The directory.

    Raises:
        ValueError: The directory it names cannot be created.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        directory = tempfile.mkdtemp(prefix="agentbolt-prometheus-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    return make_metrics_dir(directory)


def make_metrics_dir(directory: str) -> str:
    """Create ``directory`` (the ``PROMETHEUS_MULTIPROC_DIR``) when missing and return it.

    Raises:
        ValueError: It cannot be created: a file stands there, a parent is missing or not writable.
    """
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"PROMETHEUS_MULTIPROC_DIR={directory}: cannot create it ({exc.strerror or exc})") from None
    return directory


def get_prometheus_registry() -> Any:
    """The registry to expose: a multiprocess collector registry when ``PROMETHEUS_MULTIPROC_DIR`` is set."""
    prometheus_client = _import_prometheus()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return prometheus_client.REGISTRY


def shutdown_metrics(server: Any = None, worker: Any = None, *args: Any, **kwargs: Any) -> None:
    """Clean up after a worker process exits (gunicorn ``child_exit`` hook signature).

    In multiprocess mode, marks the worker's Prometheus files dead so gauges stop counting it.
    """
    mark_process_dead(getattr(worker, "pid", None) or os.getpid())


def mark_process_dead(pid: int) -> None:
    """Tell prometheus-client that process ``pid`` has exited, as its multiprocess mode asks of whoever starts
    processes: the process's ``livesum``/``liveall`` (and other ``live*``) gauge files are removed. Its counters and
    histograms keep counting in the aggregate, as prometheus-client means them to (a total must not drop when a
    process exits).

    Does nothing unless ``PROMETHEUS_MULTIPROC_DIR`` is set and prometheus-client is installed; a failure to remove
    a file is logged, never raised.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    try:
        from prometheus_client import multiprocess
    except ImportError:
        return
    try:
        multiprocess.mark_process_dead(pid, directory)
    except OSError as exc:
        logger.warning("Cannot remove the Prometheus files of exited process %d in %s: %s", pid, directory, exc)


_PROCESS_FILE = re.compile(r"_(\d+)\.db$")
"""prometheus-client's per-process file names end with ``_<pid>.db``."""


def mark_exited_processes_dead() -> List[int]:
    """:func:`mark_process_dead` for every process that left files in ``PROMETHEUS_MULTIPROC_DIR`` and is no longer
    running (an earlier run's, or one killed before anyone could mark it), so that its live gauges stop counting.

    Counter and histogram files are kept: prometheus-client sums them with the living processes' (emptying the
    directory before a deployment starts, as prometheus-client documents, is what starts totals from zero).

    Returns:
        The process ids marked dead (none without the variable or prometheus-client).
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory or not os.path.isdir(directory):
        return []
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return []
    pids = set()
    for name in os.listdir(directory):
        match = _PROCESS_FILE.search(name)
        if match is not None:
            pids.add(int(match.group(1)))
    dead = sorted(pid for pid in pids if not _process_exists(pid))
    for pid in dead:
        mark_process_dead(pid)
    return dead


def _process_exists(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this machine (of any user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return True


_PROMETHEUS_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# The collectors of each registry, shared by every backend registering there: a name is one metric per registry.
_shared_collectors: weakref.WeakKeyDictionary[Any, Dict[str, Tuple[Tuple[Any, ...], Any]]] = weakref.WeakKeyDictionary()
_shared_collectors_lock = threading.Lock()


def _check_multiprocess_setup() -> None:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set: create the directory, and warn when this process cannot write to it.

    Raises:
        ValueError: The directory cannot be created.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    make_metrics_dir(directory)
    from prometheus_client import values

    if values.ValueClass is values.MutexValue:
        logger.warning(
            "PROMETHEUS_MULTIPROC_DIR=%s was set after prometheus_client was imported: this process keeps its "
            "metrics in memory and does not write them to the directory. Set the variable before the process starts.",
            directory,
        )


class PrometheusMetricsBackend(MetricsBackend):
    """Exports metrics through ``prometheus_client`` (names get ``.`` replaced by ``_``).

    Backends registering the same metric in one registry share it (their recordings add up); registering it there
    with another kind, other labels or other buckets raises ``ValueError``. With ``PROMETHEUS_MULTIPROC_DIR`` set,
    the directory is created when missing. A recording that cannot be written there (a directory removed or not
    writable) is dropped with a warning (logged once per backend) rather than failing the caller.

    Args:
        registry: The ``prometheus_client`` registry to register metrics in (default: the global registry).

    Raises:
        ImportError: ``prometheus_client`` is not installed.
        ValueError: ``PROMETHEUS_MULTIPROC_DIR`` names a directory that cannot be created.
    """

    def __init__(self, registry: Any = None) -> None:
        super().__init__()
        self._prometheus = _import_prometheus()
        _check_multiprocess_setup()
        self._registry = registry if registry is not None else self._prometheus.REGISTRY
        self._metrics: Dict[str, Any] = {}
        self._normalized: Dict[str, str] = {}
        self._write_failed = False

    def has_prometheus(self) -> bool:
        """Always True."""
        return True

    @staticmethod
    def _normalize_name(name: str) -> str:
        return name.replace(".", "_")

    def _register(self, name: str, spec: _MetricSpec) -> bool:
        normalized = self._normalize_name(name)
        if not _PROMETHEUS_NAME.fullmatch(normalized):
            raise ValueError(
                f"Metric name {name!r} is not a Prometheus name: letters, digits, '_', ':' and '.', "
                "not starting with a digit."
            )
        for label in spec.label_names:
            if not _PROMETHEUS_LABEL.fullmatch(label) or label.startswith("__"):
                raise ValueError(
                    f"Label name {label!r} of metric {name!r} is not a Prometheus label name: letters, digits and "
                    "'_', not starting with a digit or '__'."
                )
        with self._registry_lock:
            owner = self._normalized.get(normalized)
            if owner is not None and owner != name:
                raise ValueError(
                    f"Metric '{name}' conflicts with '{owner}': both map to Prometheus name '{normalized}'."
                )
            self._normalized[normalized] = name
        try:
            return super()._register(name, spec)
        except ValueError:
            if owner is None:
                with self._registry_lock:
                    self._normalized.pop(normalized, None)
            raise

    def _undeclare(self, name: str) -> None:
        super()._undeclare(name)
        with self._registry_lock:
            self._normalized.pop(self._normalize_name(name), None)

    def _on_register(self, name: str, spec: _MetricSpec) -> None:
        normalized = self._normalize_name(name)
        signature = (spec.kind, spec.label_names, spec.buckets)
        with _shared_collectors_lock:
            collectors = _shared_collectors.setdefault(self._registry, {})
            shared = collectors.get(normalized)
            if shared is not None:
                if shared[0] != signature:
                    raise ValueError(
                        f"Prometheus metric '{normalized}' is already registered in this registry as a "
                        f"{shared[0][0]} with labels {list(shared[0][1])}; cannot register '{name}' as a "
                        f"{spec.kind} with labels {list(spec.label_names)}."
                    )
                self._metrics[name] = shared[1]
                return
            if spec.kind == "counter":
                metric = self._prometheus.Counter(
                    normalized, name, labelnames=spec.label_names, registry=self._registry
                )
            else:
                metric = self._prometheus.Histogram(
                    normalized,
                    name,
                    labelnames=spec.label_names,
                    buckets=spec.buckets or DEFAULT_BUCKETS,
                    registry=self._registry,
                )
            collectors[normalized] = (signature, metric)
        self._metrics[name] = metric

    def _write(self, kind: str, name: str, value: Any, labels: Optional[Dict[str, str]]) -> None:
        spec = self._spec(kind, name)
        key = _validate_labels(kind, name, labels, spec.label_names)
        number = _validate_value(kind, name, value)
        metric = self._metrics[name]
        try:
            child = metric.labels(*(label for _, label in key)) if key else metric
            if kind == "counter":
                child.inc(number)
            else:
                child.observe(number)
        except OSError as exc:  # multiprocess mode: the directory's files cannot be written
            first, self._write_failed = not self._write_failed, True
            logger.log(
                logging.WARNING if first else logging.DEBUG,
                "Prometheus metric %s is not recorded: cannot write to PROMETHEUS_MULTIPROC_DIR=%s (%s)%s",
                name,
                os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
                exc,
                "; further failures are logged at DEBUG level" if first else "",
            )

    async def inc_counter(self, name: str, amount: float = 1.0, labels: Optional[Dict[str, str]] = None) -> None:
        """Increase the Prometheus counter."""
        self._write("counter", name, amount, labels)

    async def observe_histogram(self, name: str, value: float, labels: Optional[Dict[str, str]] = None) -> None:
        """Observe a value on the Prometheus histogram."""
        self._write("histogram", name, value, labels)


# --------------------------------------------------------------------------------------------------------------------
# Fan-out


class MultiMetricsBackend(MetricsBackend):
    """Sends every registration and recording to several backends.

    Args:
        backends: The backends (at least one).

    Raises:
        ValueError: ``backends`` is empty.
    """

    def __init__(self, backends: Sequence[MetricsBackend]) -> None:
        super().__init__()
        if not backends:
            raise ValueError("MultiMetricsBackend needs at least one backend.")
        self.backends: List[MetricsBackend] = list(backends)

    def has_prometheus(self) -> bool:
        """True when any backend exports to Prometheus."""
        return any(backend.has_prometheus() for backend in self.backends)

    def _declare(self, name: str, spec: _MetricSpec) -> bool:
        """Register the metric on every backend (or, when one refuses it, on none)."""
        declared: List[MetricsBackend] = []
        try:
            for backend in self.backends:
                if backend._declare(name, spec):
                    declared.append(backend)
        except BaseException:
            for backend in declared:
                backend._undeclare(name)
            raise
        return bool(declared)

    async def inc_counter(self, name: str, amount: float = 1.0, labels: Optional[Dict[str, str]] = None) -> None:
        """Increase the counter on every backend."""
        for backend in self.backends:
            await backend.inc_counter(name, amount=amount, labels=labels)

    async def observe_histogram(self, name: str, value: float, labels: Optional[Dict[str, str]] = None) -> None:
        """Record the observation on every backend."""
        for backend in self.backends:
            await backend.observe_histogram(name, value, labels=labels)


# --------------------------------------------------------------------------------------------------------------------
# The process's default backend (for components built without an explicit tracker: gateway, runners, trainers)

_UNSET_DEFAULT = object()
_default: Any = _UNSET_DEFAULT
_default_lock = threading.Lock()


def tracker_from_names(names: Sequence[str]) -> Optional[MetricsBackend]:
    """A backend from names (``"prometheus"``, ``"console"``); several are combined, none gives None.

    Prometheus uses the multiprocess registry when ``PROMETHEUS_MULTIPROC_DIR`` is set.

    Raises:
        ValueError: An unknown name.
        ImportError: ``"prometheus"`` without ``prometheus-client`` installed.
    """
    backends: List[MetricsBackend] = []
    for name in dict.fromkeys(n.strip().lower() for n in names if n.strip()):
        if name == "prometheus":
            backends.append(PrometheusMetricsBackend())
        elif name == "console":
            backends.append(ConsoleMetricsBackend())
        else:
            raise ValueError(f"Unknown metrics backend {name!r}; use 'prometheus' and/or 'console'.")
    if not backends:
        return None
    return backends[0] if len(backends) == 1 else MultiMetricsBackend(backends)


def default_tracker() -> Optional[MetricsBackend]:
    """The backend components record to when given none: set by :func:`set_default_tracker`, else built once from
    the ``AGENTBOLT_METRICS`` environment variable (comma-separated backend names), else None (no metrics).

    An invalid ``AGENTBOLT_METRICS`` is logged and ignored: metrics must never stop a run.
    """
    global _default
    if _default is _UNSET_DEFAULT:
        with _default_lock:
            if _default is _UNSET_DEFAULT:
                names = os.environ.get(METRICS_ENV_VAR, "")
                try:
                    _default = tracker_from_names(names.split(","))
                except (ValueError, ImportError) as exc:
                    logger.error("%s=%r is ignored: %s", METRICS_ENV_VAR, names, exc)
                    _default = None
    return _default


def set_default_tracker(tracker: Optional[MetricsBackend]) -> None:
    """Make ``tracker`` the process's default backend (None: no metrics by default)."""
    global _default
    with _default_lock:
        _default = tracker
