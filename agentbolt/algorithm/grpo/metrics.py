"""Where GRPO's per-step metrics go: console, JSONL, TensorBoard, Weights & Biases, and a reward-curve PNG.

Each training step produces one flat ``{name: float}`` record. :class:`TrainingLogger` fans a record out to every
configured sink; optional back-ends (rich, TensorBoard, wandb, matplotlib) are imported only when used.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol

__all__ = ["MetricsSink", "TrainingLogger", "plot_reward_curve", "read_metrics"]

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


class JsonlSink:
    """Appends ``{"step": n, "time": t, **record}`` lines to ``log_dir/metrics.jsonl``."""

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")

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


def read_metrics(path: Path) -> List[Dict[str, Any]]:
    """Records of a ``metrics.jsonl`` file, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


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
    ) -> None:
        self.title = title
        self.log_dir = Path(log_dir) if log_dir else None
        self.sinks: List[MetricsSink] = []
        self.history: List[Dict[str, Any]] = []
        if self.log_dir is not None:
            self.sinks.append(JsonlSink(self.log_dir))
            if tensorboard:
                self.sinks.append(TensorBoardSink(self.log_dir))
        elif tensorboard:
            raise ValueError("tensorboard logging needs a log_dir")
        if wandb_project:
            self.sinks.append(WandbSink(wandb_project, run_config or {}, self.log_dir))
        if console:
            self.sinks.append(ConsoleSink(total_steps, start_step, title))

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
