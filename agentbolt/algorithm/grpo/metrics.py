"""Where GRPO's per-step metrics go: console, JSONL, TensorBoard, Weights & Biases, the store, Prometheus, and a
reward-curve PNG.

Each training step produces one flat ``{name: float}`` record. :class:`TrainingLogger` fans a record out to every
configured sink; optional back-ends (rich, TensorBoard, wandb, matplotlib) are imported only when used. When the
algorithm runs under a trainer, the records also go to the algorithm's store (``add_metrics``, read by the
dashboard's Training page) and, when a process metrics backend is configured (``AGENTBOLT_METRICS``), to the
``agentbolt.trainer.*`` metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Coroutine, Dict, List, Optional, Protocol, Set

__all__ = [
    "MetricsSink",
    "StoreMetricsSink",
    "TrackerMetricsSink",
    "TrainingLogger",
    "check_log_dir_unused",
    "drop_logged_steps_after",
    "plot_reward_curve",
    "read_metrics",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "reward_curve.png"

# Metrics shown on the console line, with their format.
_CONSOLE_KEYS = (
    ("train/reward_mean", "reward {:.3f}"),
    ("val/accuracy", "val acc {:.3f}"),
    ("update/loss", "loss {:+.4f}"),
    ("update/kl", "kl {:.4f}"),
    ("update/clip_fraction", "clip {:.3f}"),
    ("update/entropy", "ent {:.3f}"),
    ("update/tokens_per_second", "{:.0f} tok/s"),
    ("time/rollout_seconds", "rollout {:.1f}s"),
    ("time/update_seconds", "update {:.1f}s"),
)


class MetricsSink(Protocol):
    """Receives one record per step."""

    def log(self, step: int, record: Dict[str, float]) -> None:
        """Write ``record`` for training step ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


def _record_of(line: str) -> Optional[Dict[str, Any]]:
    """One ``metrics.jsonl`` line as a record (None when it is not a JSON object: a line cut short, say)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _step_of(line: str) -> Optional[int]:
    """The ``step`` of one ``metrics.jsonl`` line (None when the line is not a record)."""
    step = (_record_of(line) or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def check_log_dir_unused(log_dir: Optional[str | os.PathLike[str]]) -> None:
    """Refuse a ``log_dir`` whose ``metrics.jsonl`` already holds records: they belong to another run.

    A log directory holds one run; only a run resumed from a checkpoint continues the log it finds (see
    :class:`TrainingLogger`). Appending a new run to another one's log would make one curve of two runs.

    Raises:
        ValueError: ``log_dir/metrics.jsonl`` holds records; the message names the file, its steps and the ways out.
    """
    if log_dir is None:
        return
    path = Path(log_dir) / METRICS_FILE
    if not path.is_file():
        return
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        return
    steps = [step for step in map(_step_of, lines) if step is not None]
    held = f"steps {min(steps)} to {max(steps)}" if steps else f"{len(lines)} line(s)"
    raise ValueError(
        f"log_dir {str(log_dir)!r} already holds the metrics of another run ({held} in {path}), and this run does "
        "not resume it from a checkpoint. Use a new log_dir, or delete that metrics.jsonl to replace its run; to "
        "continue that run, resume it from its checkpoint_dir (resume=True)."
    )


def drop_logged_steps_after(log_dir: str | os.PathLike[str], step: int) -> int:
    """Drop the records of the steps after ``step`` from ``log_dir/metrics.jsonl`` (written by an interrupted process
    before it stopped; the run logs those steps again); how many were dropped. The file is replaced atomically.

    A last line cut short (a process killed while writing it, a full disk) is dropped too, with a warning: the
    records appended next would otherwise continue it, making one line that no reader can parse.
    """
    path = Path(log_dir) / METRICS_FILE
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if (_step_of(line) or 0) <= step]
    if kept and not kept[-1].endswith("\n"):
        if _record_of(kept[-1]) is None:
            logger.warning("%s ends with a line cut short; it is dropped: %.80s", path, kept.pop())
        else:
            kept[-1] += "\n"
    if kept != lines:
        staging = path.with_name(f".{METRICS_FILE}.tmp")
        staging.write_text("".join(kept), encoding="utf-8")
        os.replace(staging, path)
    return len(lines) - len(kept)


class JsonlSink:
    """Appends ``{"step": n, "time": t, **record}`` lines to ``log_dir/metrics.jsonl``.

    Args:
        log_dir: The run's log directory (created when missing).
        resume_step: A resumed run continues the file, dropping its records of the steps after this one (the run
            logs them again). None: a new run, which refuses a file that already holds records
            (:func:`check_log_dir_unused`).
    """

    def __init__(self, log_dir: Path, resume_step: Optional[int] = None) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / METRICS_FILE
        if resume_step is None:
            check_log_dir_unused(log_dir)
        else:
            self._keep_through(resume_step)
        self._file = self.path.open("a", encoding="utf-8")

    def _keep_through(self, step: int) -> None:
        dropped = drop_logged_steps_after(self.path.parent, step)
        if dropped:
            logger.info(
                "Resuming at step %d: dropped %d record(s) of later steps from %s (they are logged again).",
                step,
                dropped,
                self.path,
            )

    def log(self, step: int, record: Dict[str, float]) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in record.items()}
        self._file.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ConsoleSink:
    """A rich progress bar over the training steps plus one summary line per step."""

    def __init__(self, total_steps: int, start_step: int = 0, title: str = "GRPO") -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn(f"[bold]{title}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[summary]}"),
            transient=False,
        )
        self._task = self._progress.add_task("grpo", total=max(total_steps, 1), completed=start_step, summary="")
        self._progress.start()

    def log(self, step: int, record: Dict[str, float]) -> None:
        parts = [fmt.format(record[key]) for key, fmt in _CONSOLE_KEYS if key in record and math.isfinite(record[key])]
        summary = "  ".join(parts)
        if step > 0:
            self._progress.update(self._task, completed=step, summary=summary)
        self._progress.console.log(f"step {step}: {summary}")

    def close(self) -> None:
        self._progress.stop()


class TensorBoardSink:
    """Scalars to TensorBoard under ``log_dir/tensorboard`` (needs the ``tensorboard`` extra)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError("tensorboard logging needs: pip install 'agentbolt[tensorboard]'") from exc
        self._writer = SummaryWriter(log_dir=str(log_dir / "tensorboard"))

    def log(self, step: int, record: Dict[str, float]) -> None:
        for key, value in record.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Scalars to a Weights & Biases run (needs the ``wandb`` extra)."""

    def __init__(self, project: str, config: Dict[str, Any], log_dir: Optional[Path]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError("Weights & Biases logging needs: pip install 'agentbolt[wandb]'") from exc
        self._run = wandb.init(project=project, config=config, dir=str(log_dir) if log_dir else None)

    def log(self, step: int, record: Dict[str, float]) -> None:
        self._run.log(record, step=step)

    def close(self) -> None:
        self._run.finish()


class _BackgroundWrites:
    """Runs the async writes of a sink without blocking the training loop that logs synchronously.

    Inside a running event loop each write becomes a task (kept referenced until done); outside one it runs to
    completion at once. A failing write is logged, never raised.
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._tasks: Set[asyncio.Task[Any]] = set()

    def submit(self, write: Coroutine[Any, Any, Any]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                asyncio.run(write)
            except Exception:
                logger.exception("Writing %s failed", self._what)
            return
        task = loop.create_task(write)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            logger.warning("Writing %s was cancelled before it finished", self._what)
        elif task.exception() is not None:
            logger.error("Writing %s failed: %r", self._what, task.exception())

    @property
    def pending(self) -> int:
        """Writes not finished yet."""
        return len(self._tasks)


class StoreMetricsSink:
    """Writes each step's record to the store as a :class:`~agentbolt.types.MetricsRecord` of run ``run_id`` (the
    dashboard's Training page reads them back through the store's ``/v1/agl/metrics`` route).

    Args:
        store: The algorithm's store.
        run_id: Name of the run; a resumed run logging the same steps again replaces them.
    """

    def __init__(self, store: Any, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self._writes = _BackgroundWrites(f"training metrics of run {run_id} to the store")
        self._supported = True

    def log(self, step: int, record: Dict[str, float]) -> None:
        from agentbolt.types import MetricsRecord

        if not self._supported:
            return
        metrics = MetricsRecord(run_id=self.run_id, step=step, time=time.time(), values=dict(record))
        self._writes.submit(self._write(metrics))

    async def _write(self, metrics: Any) -> None:
        try:
            await self.store.add_metrics([metrics])
        except NotImplementedError as exc:
            self._supported = False
            logger.info("Training metrics are not stored: %s", exc)

    def close(self) -> None:
        if self._writes.pending:
            logger.debug("%d metric write(s) to the store still running at close", self._writes.pending)


TRAINER_METRICS = {
    "agentbolt.trainer.steps": "counter: training steps done",
    "agentbolt.trainer.step_seconds": "histogram: duration of a training step (rollouts and update)",
    "agentbolt.trainer.reward": "histogram: mean training reward of each step",
    "agentbolt.trainer.tokens": "counter: tokens trained on (rate = training tokens per second)",
    "agentbolt.trainer.update_seconds": "histogram: duration of the policy update of a step",
}
"""The trainer's metrics (labels: ``algorithm``); see ``docs/metrics.md``."""

_STEP_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
# No negative bound: Prometheus drops a histogram's _sum when it has one, and the mean reward is _sum / _count.
_REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class TrackerMetricsSink:
    """Records each step to a metrics backend as the ``agentbolt.trainer.*`` metrics (see :data:`TRAINER_METRICS`).

    Args:
        tracker: The backend (e.g. Prometheus).
        algorithm: Value of the ``algorithm`` label.
    """

    def __init__(self, tracker: Any, algorithm: str = "grpo") -> None:
        self.tracker = tracker
        self.labels = {"algorithm": algorithm}
        tracker.register_counter("agentbolt.trainer.steps", ["algorithm"])
        tracker.register_counter("agentbolt.trainer.tokens", ["algorithm"])
        tracker.register_histogram("agentbolt.trainer.step_seconds", ["algorithm"], buckets=_STEP_BUCKETS)
        tracker.register_histogram("agentbolt.trainer.update_seconds", ["algorithm"], buckets=_STEP_BUCKETS)
        tracker.register_histogram("agentbolt.trainer.reward", ["algorithm"], buckets=_REWARD_BUCKETS)
        self._writes = _BackgroundWrites("trainer metrics")

    def log(self, step: int, record: Dict[str, float]) -> None:
        if "time/step_seconds" not in record:
            return  # a validation-only record (step 0)
        self._writes.submit(self._write(record))

    async def _write(self, record: Dict[str, float]) -> None:
        labels = self.labels
        await self.tracker.inc_counter("agentbolt.trainer.steps", labels=labels)
        await self.tracker.observe_histogram("agentbolt.trainer.step_seconds", record["time/step_seconds"], labels)
        for key, name in (("time/update_seconds", "agentbolt.trainer.update_seconds"),):
            if math.isfinite(record.get(key, math.nan)):
                await self.tracker.observe_histogram(name, record[key], labels)
        if math.isfinite(record.get("train/reward_mean", math.nan)):
            await self.tracker.observe_histogram("agentbolt.trainer.reward", record["train/reward_mean"], labels)
        tokens = record.get("update/update_tokens", 0.0)
        if math.isfinite(tokens) and tokens > 0:
            await self.tracker.inc_counter("agentbolt.trainer.tokens", tokens, labels)

    def close(self) -> None:
        pass


def _default_run_id(log_dir: Optional[Path], algorithm: str) -> str:
    """The run's name: its log directory's name, else the algorithm and the start time."""
    if log_dir is not None:
        return log_dir.resolve().name
    return f"{algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"


def read_metrics(path: Path) -> List[Dict[str, Any]]:
    """Records of a ``metrics.jsonl`` file, in order; a line that is not a record (cut short by a process killed while
    writing it, say) is skipped with a warning naming it."""
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = _record_of(line)
        if record is None:
            logger.warning("%s line %d is not a metrics record; it is skipped: %.80s", path, number, line)
            continue
        records.append(record)
    return records


def plot_reward_curve(records: List[Dict[str, Any]], path: Path, title: str = "GRPO") -> Optional[Path]:
    """Plot training reward (mean ± std) and validation accuracy per step to a PNG.

    Returns:
        The path written, or None when matplotlib is missing or there is nothing to plot.
    """
    train = [
        (r["step"], r["train/reward_mean"], r.get("train/reward_std") or 0.0)
        for r in records
        if r.get("train/reward_mean") is not None
    ]
    val = [(r["step"], r["val/accuracy"]) for r in records if r.get("val/accuracy") is not None]
    if not train and not val:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed; no reward curve written (pip install 'agentbolt[train]')")
        return None
    figure, axis = plt.subplots(figsize=(7, 4))
    if train:
        steps = [t[0] for t in train]
        means = [t[1] for t in train]
        stds = [t[2] for t in train]
        axis.plot(steps, means, marker="o", label="train reward (mean)")
        lower = [m - s for m, s in zip(means, stds, strict=True)]
        upper = [m + s for m, s in zip(means, stds, strict=True)]
        axis.fill_between(steps, lower, upper, alpha=0.2)
    if val:
        axis.plot([v[0] for v in val], [v[1] for v in val], marker="s", label="validation accuracy")
    axis.set_xlabel("training step")
    axis.set_ylabel("reward")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


class TrainingLogger:
    """Fans per-step records out to the configured sinks and writes the reward curve at the end.

    Args:
        log_dir: Directory for ``metrics.jsonl``, TensorBoard events and ``reward_curve.png`` (None: no files).
        total_steps: Steps of the run (for the progress bar).
        start_step: Step the run resumes from.
        console: Show the rich progress bar and per-step lines.
        tensorboard: Log to TensorBoard (needs ``log_dir``).
        wandb_project: Log to this Weights & Biases project.
        run_config: Configuration recorded with the W&B run.
        title: Algorithm name shown on the progress bar, in log lines and on the reward curve.
        run_id: Names the run's records in the store (default: ``run_config["run_id"]``, else the log directory's
            name, else the algorithm and the start time).
        resumed: The run resumes from its checkpoint of ``start_step``: ``log_dir/metrics.jsonl`` is continued,
            without its records of later steps (logged again). Otherwise ``metrics.jsonl`` must hold no records
            (a log directory holds one run).

    Raises:
        ValueError: ``tensorboard`` without a ``log_dir``, or a new run's ``log_dir`` already holds records.
    """

    def __init__(
        self,
        *,
        log_dir: Optional[str] = None,
        total_steps: int = 0,
        start_step: int = 0,
        console: bool = True,
        tensorboard: bool = False,
        wandb_project: Optional[str] = None,
        run_config: Optional[Dict[str, Any]] = None,
        title: str = "GRPO",
        run_id: Optional[str] = None,
        resumed: bool = False,
    ) -> None:
        self.title = title
        self.log_dir = Path(log_dir) if log_dir else None
        self.sinks: List[MetricsSink] = []
        self.history: List[Dict[str, Any]] = []
        if self.log_dir is not None:
            self.sinks.append(JsonlSink(self.log_dir, start_step if resumed else None))
            if tensorboard:
                self.sinks.append(TensorBoardSink(self.log_dir))
        elif tensorboard:
            raise ValueError("tensorboard logging needs a log_dir")
        if wandb_project:
            self.sinks.append(WandbSink(wandb_project, run_config or {}, self.log_dir))
        if console:
            self.sinks.append(ConsoleSink(total_steps, start_step, title))
        self.run_id = run_id or (run_config or {}).get("run_id") or _default_run_id(self.log_dir, title.lower())
        self._add_environment_sinks()

    def _add_environment_sinks(self) -> None:
        """The store of the algorithm running here (under a trainer) and the process's metrics backend, if any."""
        from agentbolt.algorithm.base import running_algorithm
        from agentbolt.utils.metrics import default_tracker

        algorithm = running_algorithm()
        store = getattr(algorithm, "_store", None) if algorithm is not None else None
        if store is not None:
            self.sinks.append(StoreMetricsSink(store, self.run_id))
        tracker = default_tracker()
        if tracker is not None:
            self.sinks.append(TrackerMetricsSink(tracker, self.title.lower()))

    def log(self, step: int, record: Dict[str, float]) -> None:
        """Send one step's record to every sink (a failing sink is logged, not fatal)."""
        self.history.append({"step": step, **record})
        logger.info("%s step %d: %s", self.title, step, {k: round(v, 5) for k, v in record.items()})
        for sink in self.sinks:
            try:
                sink.log(step, record)
            except Exception:  # a metrics back-end must never stop training
                logger.exception("Metrics sink %s failed", type(sink).__name__)

    def close(self) -> Optional[Path]:
        """Close the sinks and write the reward curve (from the whole JSONL history when there is one).

        Returns:
            The PNG path, if one was written.
        """
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                logger.exception("Metrics sink %s failed to close", type(sink).__name__)
        if self.log_dir is None:
            return None
        records = read_metrics(self.log_dir / METRICS_FILE) or self.history
        return plot_reward_curve(records, self.log_dir / CURVE_FILE, self.title)
