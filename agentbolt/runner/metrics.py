"""A runner's metrics: the rollouts it ran, by outcome and mode, and how long the agent took.

Recorded to the process's metrics backend (``AGENTBOLT_METRICS``, see :func:`agentbolt.utils.metrics.default_tracker`)
when one is configured; names in :data:`RUNNER_METRICS` and ``docs/metrics.md``.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["RUNNER_METRICS", "RunnerMetrics", "runner_metrics"]

RUNNER_METRICS = {
    "agentbolt.runner.rollouts": "counter (status=succeeded|failed, mode): rollouts a runner finished",
    "agentbolt.runner.rollout_duration": "histogram (status, mode): seconds the agent ran on one rollout",
}

_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class RunnerMetrics:
    """Registers the runner metrics on ``tracker`` and records finished rollouts."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        tracker.register_counter("agentbolt.runner.rollouts", ["status", "mode"])
        tracker.register_histogram("agentbolt.runner.rollout_duration", ["status", "mode"], buckets=_DURATION_BUCKETS)

    async def record(self, status: str, mode: Optional[str], seconds: float) -> None:
        """Record one finished rollout."""
        labels = {"status": status, "mode": mode or "none"}
        await self.tracker.inc_counter("agentbolt.runner.rollouts", labels=labels)
        await self.tracker.observe_histogram("agentbolt.runner.rollout_duration", seconds, labels)


def runner_metrics() -> Optional[RunnerMetrics]:
    """Runner metrics on the process's default backend, or None when there is none."""
    from agentbolt.utils.metrics import default_tracker

    tracker = default_tracker()
    return RunnerMetrics(tracker) if tracker is not None else None
