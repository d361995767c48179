"""Held-out results a reader can check: per-slice scores before and after training, with 95 % intervals.

A *pass* is one validation run over the held-out tasks: for each task its slice (operation, database, question
kind...) and its scores (``accuracy`` is 1 or 0; other scores such as ``f1`` lie in [0, 1]). :func:`compare`
turns the first and last pass into one row per slice and score:

* before and after, each with a 95 % interval: the Wilson score interval for accuracies (binary), a percentile
  bootstrap over tasks for other scores;
* the change after - before, with an interval that keeps the pairing (the same tasks are answered twice): for
  accuracies Newcombe's hybrid score interval for paired proportions (:func:`paired_change_interval`), for other
  scores a paired percentile bootstrap over the tasks.

A bootstrap only resamples the values it was given: with few tasks, or when every task scored the same, it
shrinks towards a single point however little was measured. So below :data:`MIN_BOOTSTRAP_TASKS` tasks, or when
the values do not vary, the interval of a non-binary score is Hoeffding's bound instead (:func:`hoeffding_interval`),
which holds for any number of tasks and is wide when there are few (:func:`format_table` says which rows use it).

The bootstrap is seeded, so the same passes always give the same intervals.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from agentbolt.utils.stats import Z95, wilson_interval

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "MIN_BOOTSTRAP_TASKS",
    "SliceChange",
    "TaskScore",
    "change_interval",
    "compare",
    "format_table",
    "hoeffding_interval",
    "mean_interval",
    "paired_change_interval",
    "wilson_interval",
]

BOOTSTRAP_RESAMPLES = 4000
MIN_BOOTSTRAP_TASKS = 20
"""Fewer tasks than this are too few for a percentile bootstrap of a mean (it covers the true mean much less often
than 95 % of the time); their non-binary intervals are Hoeffding bounds."""


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


def _bootstrap_applies(values: Sequence[float]) -> bool:
    """Whether a percentile bootstrap says something about the mean of ``values``: enough of them, not all equal."""
    return len(values) >= MIN_BOOTSTRAP_TASKS and max(values) > min(values)


def hoeffding_interval(values: Sequence[float], low: float, high: float, z: float = Z95) -> Tuple[float, float]:
    """A two-sided interval for the mean of ``values``, which lie in [``low``, ``high``], from Hoeffding's inequality.

    Hoeffding's inequality bounds how far the mean of n independent values confined to a range of width R strays
    from its expectation: beyond t with probability at most 2 exp(-2 n t^2 / R^2). Setting that to the two-sided
    level of ``z`` (0.05 for the default 95 %) gives the half-width t = R sqrt(ln(2 / alpha) / (2 n)). The bound holds
    for any n and any distribution in the range, so it is wide when n is small (n = 1 spans the whole range),
    never empty, and always holds the observed mean.

    Returns:
        ``(low, high)`` clipped to the range; the whole range when ``values`` is empty.
    """
    if not values:
        return low, high
    alpha = math.erfc(z / math.sqrt(2))  # the two-sided level of z: 0.05 for Z95
    mean = sum(values) / len(values)
    half = (high - low) * math.sqrt(math.log(2 / alpha) / (2 * len(values)))
    return max(low, mean - half), min(high, mean + half)


def mean_interval(values: Sequence[float], binary: bool, seed: int = 0) -> Tuple[float, float]:
    """95 % interval of the mean of ``values``: Wilson when they are 0/1 (``binary``), else a percentile bootstrap,
    or :func:`hoeffding_interval` over [0, 1] when there are fewer than :data:`MIN_BOOTSTRAP_TASKS` values or they
    are all equal."""
    if binary:
        return wilson_interval(round(sum(values)), len(values))
    if not _bootstrap_applies(values):
        return hoeffding_interval(values, 0.0, 1.0)
    return _bootstrap(values, seed)


def paired_change_interval(before: Sequence[float], after: Sequence[float], z: float = Z95) -> Tuple[float, float]:
    """Newcombe's hybrid score interval (his method 10) for the change in a success rate measured twice on the same
    tasks: ``after`` minus ``before``, each a list of 0/1 outcomes in task order.

    Newcombe (1998, "Improved confidence intervals for the difference between binomial proportions based on paired
    data", Statistics in Medicine 17) builds it from the Wilson score interval of each pass's rate. The lower limit
    subtracts from the observed change the distances, combined as a square root of their squares, from the
    after-rate down to its Wilson lower limit and from the before-rate up to its Wilson upper limit; the upper limit
    adds the two other distances. The cross term subtracts twice their product times an estimate of the correlation
    between the two passes (the phi coefficient of the paired 2 x 2 table, whose numerator, when positive, is first
    reduced by n / 2 but not below 0; phi is 0 when a margin of the table is empty), since outcomes that agree
    across passes make the change less uncertain than two independent rates would be.

    Unlike a bootstrap of the paired differences, it is never a single point: one task going from wrong to right
    gives about [-0.12, 1.0], every task right both times about [-0.43, 0.43] with 5 tasks.

    Returns:
        ``(low, high)`` within [-1, 1], holding the observed change; ``(-1.0, 1.0)`` without tasks.

    Raises:
        ValueError: The passes differ in length or hold a value other than 0 and 1.
    """
    if len(before) != len(after):
        raise ValueError(f"the passes must hold the same tasks, got {len(before)} and {len(after)} outcomes")
    if any(value not in (0, 1) for value in (*before, *after)):
        raise ValueError("paired_change_interval needs 0/1 outcomes (an accuracy)")
    n = len(before)
    if n == 0:
        return -1.0, 1.0
    pairs = list(zip(before, after, strict=True))
    both, lost, gained = pairs.count((1, 1)), pairs.count((1, 0)), pairs.count((0, 1))
    neither = n - both - lost - gained
    p_before, p_after = (both + lost) / n, (both + gained) / n
    low_before, high_before = wilson_interval(both + lost, n, z)
    low_after, high_after = wilson_interval(both + gained, n, z)
    margins = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    phi = 0.0
    if margins:
        agreement: float = both * neither - lost * gained
        if agreement > n / 2:
            agreement -= n / 2
        elif agreement > 0:
            agreement = 0
        phi = agreement / math.sqrt(margins)
    change = p_after - p_before
    down_after, up_before = p_after - low_after, high_before - p_before
    up_after, down_before = high_after - p_after, p_before - low_before
    low = change - math.sqrt(max(0.0, down_after**2 - 2 * phi * down_after * up_before + up_before**2))
    high = change + math.sqrt(max(0.0, up_after**2 - 2 * phi * up_after * down_before + down_before**2))
    return max(-1.0, low), min(1.0, high)


def change_interval(
    before: Sequence[float], after: Sequence[float], binary: bool, seed: int = 0
) -> Tuple[float, float]:
    """95 % interval of the mean change ``after - before`` over the same tasks, keeping their pairing.

    Binary scores (0/1): :func:`paired_change_interval`. Other scores in [0, 1]: a percentile bootstrap of the
    per-task differences, or :func:`hoeffding_interval` over [-1, 1] when there are fewer than
    :data:`MIN_BOOTSTRAP_TASKS` tasks or every task changed by the same amount.
    """
    if binary:
        return paired_change_interval(before, after)
    differences = [y - x for x, y in zip(before, after, strict=True)]
    if not _bootstrap_applies(differences):
        return hoeffding_interval(differences, -1.0, 1.0)
    return _bootstrap(differences, seed)


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
            change_low, change_high = change_interval(a, b, binary, seed + 2)
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
    """The rows as a Markdown table (percentages), then a line naming the intervals.

    The ``n`` of a row whose score is not binary and whose slice has fewer than :data:`MIN_BOOTSTRAP_TASKS` tasks is
    marked ``*``: too few tasks for a bootstrap, its intervals are Hoeffding bounds.
    """

    def pct(value: float) -> str:
        return f"{100 * value:.1f}"

    lines = [
        "| slice | metric | n | before [95 % CI] | after [95 % CI] | change [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = f"{r.n}*" if r.metric != "accuracy" and r.n < MIN_BOOTSTRAP_TASKS else str(r.n)
        lines.append(
            f"| {r.slice} | {r.metric} | {n} | {pct(r.before)} [{pct(r.before_low)}, {pct(r.before_high)}] | "
            f"{pct(r.after)} [{pct(r.after_low)}, {pct(r.after_high)}] | "
            f"{'+' if r.change >= 0 else ''}{pct(r.change)} [{pct(r.change_low)}, {pct(r.change_high)}] |"
        )
    legend = "Intervals: accuracy, Wilson (before, after) and Newcombe's paired score interval (change)"
    if any(r.metric != "accuracy" for r in rows):
        legend += (
            f"; other scores, a percentile bootstrap over tasks, or Hoeffding's bound where it cannot apply "
            f"(* fewer than {MIN_BOOTSTRAP_TASKS} tasks, or every task scored the same)"
        )
    return "\n".join([*lines, "", legend + "."])
