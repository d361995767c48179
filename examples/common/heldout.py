"""Held-out results a reader can check: per-slice scores before and after training, with 95 % intervals.

A *pass* is one validation run over the held-out tasks: for each task its slice (operation, database, question
kind...) and its scores (``accuracy`` is 1 or 0; other scores such as ``f1`` lie in [0, 1]). :func:`compare`
turns the first and last pass into one row per slice and score:

* before and after, each with a 95 % interval: the Wilson score interval for accuracies (binary), a percentile
  bootstrap over tasks for other scores;
* the change after - before, with a paired percentile bootstrap interval over the tasks (the same tasks are
  answered twice, so resampling pairs keeps that pairing).

The bootstrap is seeded, so the same passes always give the same intervals.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from agentbolt.utils.stats import wilson_interval

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "SliceChange",
    "TaskScore",
    "compare",
    "format_table",
    "mean_interval",
    "wilson_interval",
]

BOOTSTRAP_RESAMPLES = 4000


@dataclass(frozen=True)
class TaskScore:
    """One held-out task's scores in one pass.

    Attributes:
        task_id: The task's id (pairs the passes).
        slice: The slice it belongs to.
        scores: Score name -> value in [0, 1] (``accuracy`` is 0 or 1).
    """

    task_id: str
    slice: str
    scores: Mapping[str, float]


@dataclass(frozen=True)
class SliceChange:
    """One slice and score, before and after training.

    Attributes:
        slice: Slice name, or ``"all"``.
        metric: Score name.
        n: Tasks in the slice (answered in both passes).
        before, after: Mean score of each pass.
        before_low, before_high, after_low, after_high: Their 95 % intervals.
        change: ``after - before``.
        change_low, change_high: The paired 95 % interval of the change.
    """

    slice: str
    metric: str
    n: int
    before: float
    before_low: float
    before_high: float
    after: float
    after_low: float
    after_high: float
    change: float
    change_low: float
    change_high: float

    def as_dict(self) -> Dict[str, Any]:
        """The row as a JSON-able dict (values rounded to 4 decimals)."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    position = q * (len(sorted_values) - 1)
    low, high = math.floor(position), math.ceil(position)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _bootstrap(values: Sequence[float], seed: int) -> Tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of ``values``."""
    if not values:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(BOOTSTRAP_RESAMPLES))
    return _percentile(means, 0.025), _percentile(means, 0.975)


def mean_interval(values: Sequence[float], binary: bool, seed: int = 0) -> Tuple[float, float]:
    """95 % interval of the mean of ``values``: Wilson when they are 0/1 (``binary``), else a bootstrap."""
    if binary:
        return wilson_interval(round(sum(values)), len(values))
    return _bootstrap(values, seed)


def compare(
    before: Sequence[TaskScore], after: Sequence[TaskScore], metrics: Sequence[str] = ("accuracy",), seed: int = 0
) -> List[SliceChange]:
    """Per-slice (sorted by name, then ``"all"``) and per-metric rows comparing two passes over the same tasks.

    Raises:
        ValueError: The passes are empty or do not hold the same tasks.
    """
    first = {score.task_id: score for score in before}
    last = {score.task_id: score for score in after}
    if not first or set(first) != set(last):
        missing = sorted(set(first) ^ set(last))[:5]
        raise ValueError(f"the passes must hold the same, non-empty set of tasks (differing: {missing})")
    slices = sorted({score.slice for score in before})
    rows: List[SliceChange] = []
    for name in [*slices, "all"]:
        ids = sorted(task_id for task_id, score in first.items() if name in ("all", score.slice))
        for metric in metrics:
            a = [float(first[i].scores[metric]) for i in ids]
            b = [float(last[i].scores[metric]) for i in ids]
            binary = metric == "accuracy"
            before_low, before_high = mean_interval(a, binary, seed)
            after_low, after_high = mean_interval(b, binary, seed + 1)
            change_low, change_high = _bootstrap([y - x for x, y in zip(a, b, strict=True)], seed + 2)
            rows.append(
                SliceChange(
                    slice=name,
                    metric=metric,
                    n=len(ids),
                    before=sum(a) / len(a),
                    before_low=before_low,
                    before_high=before_high,
                    after=sum(b) / len(b),
                    after_low=after_low,
                    after_high=after_high,
                    change=(sum(b) - sum(a)) / len(a),
                    change_low=change_low,
                    change_high=change_high,
                )
            )
    return rows


def format_table(rows: Sequence[SliceChange]) -> str:
    """The rows as a Markdown table (percentages)."""

    def pct(value: float) -> str:
        return f"{100 * value:.1f}"

    lines = [
        "| slice | metric | n | before [95 % CI] | after [95 % CI] | change [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.slice} | {r.metric} | {r.n} | {pct(r.before)} [{pct(r.before_low)}, {pct(r.before_high)}] | "
            f"{pct(r.after)} [{pct(r.after_low)}, {pct(r.after_high)}] | "
            f"{'+' if r.change >= 0 else ''}{pct(r.change)} [{pct(r.change_low)}, {pct(r.change_high)}] |"
        )
    return "\n".join(lines)
