"""Pure lifecycle rules shared by every store: attempt -> rollout status, and health verdicts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Dict, List, Literal, Optional, Sequence, Tuple

from agentbolt.types import Attempt, AttemptedRollout, AttemptStatus, Rollout, RolloutConfig, RolloutStatus

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = [
    "LATENCY_BUCKETS",
    "UpdateRolloutStatus",
    "UpdateAttemptStatus",
    "rollout_status_from_attempt",
    "scan_unhealthy_rollouts",
    "wait_for_finished_rollouts",
]

MAX_SHORT_WAIT_SECONDS = 0.1
"""Longest ``wait_for_rollouts`` timeout a ``LightningStoreClient`` accepts unless created with ``long_waits=True``;
:func:`wait_for_finished_rollouts` waits in slices of it, so the same loop serves local and remote stores."""

UpdateRolloutStatus = RolloutStatus
"""Statuses accepted by ``update_rollout``."""

UpdateAttemptStatus = AttemptStatus
"""Statuses accepted by ``update_attempt``."""

UnhealthyAttemptStatus = Literal["timeout", "unresponsive"]

LATENCY_BUCKETS: List[float] = [
    # microseconds
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4,
    # milliseconds
    1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2, 1.5e-2, 2e-2, 3e-2, 5e-2, 7e-2, 0.1, 0.2, 0.3, 0.5, 0.7,
    # seconds
    1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0,
]  # fmt: skip
"""Histogram buckets (seconds) for store latencies: 44 bounds from 1 µs to 300 s."""

_RETRYABLE: Tuple[AttemptStatus, ...] = ("failed", "timeout", "unresponsive")


async def rollout_status_from_attempt(attempt: Attempt, config: RolloutConfig) -> RolloutStatus:
    """The status a rollout takes when its latest attempt has ``attempt.status``.

    ``preparing``/``running``/``succeeded`` carry over. ``failed``/``timeout``/``unresponsive`` become ``requeuing``
    when the status is in ``config.retry_condition`` and attempts remain (``sequence_id < max_attempts``), else
    ``failed``.

    Raises:
        ValueError: For an unknown attempt status.
    """
    status = attempt.status
    if status in ("preparing", "running", "succeeded"):
        return status
    if status in _RETRYABLE:
        if status in config.retry_condition and attempt.sequence_id < config.max_attempts:
            return "requeuing"
        return "failed"
    raise ValueError(f"Invalid attempt status {status!r}")


async def scan_unhealthy_rollouts(
    rollouts: List[AttemptedRollout],
) -> Dict[Tuple[str, str], UnhealthyAttemptStatus]:
    """Health verdicts for the latest attempts of ``rollouts``, judged at ``time.time()``.

    A rollout whose attempt exceeded ``config.timeout_seconds`` since it started gets ``timeout``; otherwise one
    silent (no heartbeat since ``unresponsive_seconds``, or none at all since the attempt started) gets
    ``unresponsive``. Healthy rollouts are absent from the result.
    """
    now = time.time()
    verdicts: Dict[Tuple[str, str], UnhealthyAttemptStatus] = {}
    for rollout in rollouts:
        attempt = getattr(rollout, "attempt", None)
        if attempt is None:
            continue
        config = rollout.config
        key = (rollout.rollout_id, attempt.attempt_id)
        if config.timeout_seconds is not None and now - attempt.start_time > config.timeout_seconds:
            verdicts[key] = "timeout"
        elif config.unresponsive_seconds is not None:
            last_sign_of_life = (
                attempt.last_heartbeat_time if attempt.last_heartbeat_time is not None else attempt.start_time
            )
            if now - last_sign_of_life > config.unresponsive_seconds:
                verdicts[key] = "unresponsive"
    return verdicts


async def wait_for_finished_rollouts(
    store: LightningStore, rollout_ids: Sequence[str], *, timeout: Optional[float]
) -> Dict[str, Rollout]:
    """Wait until every rollout in ``rollout_ids`` finished or ``timeout`` seconds passed (``None``: no limit).

    Returns the finished rollouts by id; those missing did not finish in time. Waits in slices of
    :data:`MAX_SHORT_WAIT_SECONDS`, so any store works, a remote client included.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    finished: Dict[str, Rollout] = {}
    pending = list(dict.fromkeys(rollout_ids))
    while pending:
        remaining = (
            MAX_SHORT_WAIT_SECONDS if deadline is None else min(MAX_SHORT_WAIT_SECONDS, deadline - time.monotonic())
        )
        if remaining <= 0:
            break
        for rollout in await store.wait_for_rollouts(rollout_ids=pending, timeout=remaining):
            finished[rollout.rollout_id] = rollout
        pending = [rollout_id for rollout_id in pending if rollout_id not in finished]
    return finished
