"""Progress lines of a run: one per finished rollout (status, reward, running mean) and a summary.

They go to the ``agentbolt.progress`` logger. ``Baseline`` writes them for the rollouts it follows;
:class:`FinishedRolloutFollower` writes them for any algorithm by watching the store (what ``Trainer.fit`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, List, Optional, Set

from agentbolt.store.base import FINISHED_STATUSES

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore
    from agentbolt.types import Rollout

__all__ = ["PROGRESS_LOGGER_NAME", "RolloutProgress", "FinishedRolloutFollower"]

logger = logging.getLogger(__name__)

PROGRESS_LOGGER_NAME = "agentbolt.progress"
"""Logger of the short progress lines (one per finished rollout, and a summary); :meth:`agentbolt.Trainer.dev`
and :meth:`agentbolt.Trainer.fit` show them on the console when logging is not configured."""
progress_logger = logging.getLogger(PROGRESS_LOGGER_NAME)


class RolloutProgress:
    """Counts finished rollouts and their rewards, and logs a line for each and a summary.

    Args:
        total: Rollouts expected, shown as ``Rollout 3/10``; unknown (``None``) shows ``Rollout 3``.
    """

    def __init__(self, total: Optional[int] = None) -> None:
        self.total = total
        self.statuses: List[str] = []
        self.rewards: List[float] = []

    async def report(self, store: LightningStore, rollout: Rollout, duration: Optional[float] = None) -> None:
        """Log one line for a finished ``rollout``: its status, duration and final reward (read from its spans)."""
        from agentbolt.utils.reward_spans import training_reward

        try:
            reward = training_reward(
                await store.query_spans(rollout.rollout_id, attempt_id="latest"), rollout.rollout_id
            )
        except Exception:
            logger.exception("[Rollout %s] Could not read its reward.", rollout.rollout_id)
            reward = None
        self.statuses.append(rollout.status)
        if reward is not None:
            self.rewards.append(reward)
            outcome = f"reward {reward:g} (mean {sum(self.rewards) / len(self.rewards):.3f})"
        else:
            outcome = "no reward"
        if duration is None and rollout.end_time is not None:
            duration = rollout.end_time - rollout.start_time
        count = f"{len(self.statuses)}/{self.total}" if self.total is not None else str(len(self.statuses))
        took = f" in {duration:.1f} s" if duration is not None else ""
        progress_logger.info(
            "Rollout %s %s (%s) %s%s: %s.",
            count,
            rollout.rollout_id,
            rollout.mode or "-",
            rollout.status,
            took,
            outcome,
        )

    def summary(self) -> None:
        """Log the counts of each status and the mean reward."""
        counts = ", ".join(f"{self.statuses.count(s)} {s}" for s in sorted(set(self.statuses)))
        if self.rewards:
            rewards = f"mean reward {sum(self.rewards) / len(self.rewards):.3f} over {len(self.rewards)} rewarded"
        else:
            rewards = "no rewards"
        progress_logger.info("Done: %d rollouts (%s); %s.", len(self.statuses), counts or "none", rewards)


class FinishedRolloutFollower:
    """Reports every rollout that finishes in a store, by polling it, for algorithms that report none themselves.

    Each poll reads the most recently finished rollouts (at most ``window``): when more than that finish between
    two polls, some get no line (the summary counts only the reported ones).

    Args:
        store: The store to watch.
        progress: Where the lines go.
        interval: Seconds between polls.
        window: Most recently finished rollouts read per poll.
    """

    def __init__(
        self, store: LightningStore, progress: RolloutProgress, interval: float = 1.0, window: int = 512
    ) -> None:
        self.store = store
        self.progress = progress
        self.interval = interval
        self.window = window
        self._seen: Set[str] = set()

    async def _newly_finished(self) -> List[Rollout]:
        try:
            finished = await self.store.query_rollouts(
                status_in=list(FINISHED_STATUSES), sort_by="end_time", sort_order="desc", limit=self.window
            )
        except Exception:
            logger.debug("Could not poll the store for finished rollouts", exc_info=True)
            return []
        new = [rollout for rollout in reversed(finished) if rollout.rollout_id not in self._seen]
        self._seen.update(rollout.rollout_id for rollout in new)
        return new

    async def start(self) -> None:
        """Take note of the rollouts finished so far: they get no line."""
        await self._newly_finished()

    async def follow(self, stop: asyncio.Event) -> None:
        """Report each newly finished rollout until ``stop`` is set, then the last ones and the summary."""
        while True:
            stopping = stop.is_set()
            for rollout in await self._newly_finished():
                await self.progress.report(self.store, rollout)
            if stopping:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
        self.progress.summary()
