"""Fast algorithms for dry runs: :class:`Baseline` enqueues every task and logs what comes back."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, List, Literal, Optional, Sequence, Tuple

from agentbolt.store.base import is_finished
from agentbolt.types import Attempt, Dataset, Rollout, RolloutMode, Span

from .base import Algorithm
from .progress import PROGRESS_LOGGER_NAME, RolloutProgress
from .utils import with_llm_proxy, with_store

if TYPE_CHECKING:
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore

__all__ = ["FastAlgorithm", "Baseline", "PROGRESS_LOGGER_NAME"]

logger = logging.getLogger(__name__)


SpanVerbosity = Literal["keys", "key_values", "none"]


class FastAlgorithm(Algorithm):
    """Marker base class of algorithms cheap enough for :meth:`Trainer.dev` dry runs (they log each rollout)."""

    @property
    def reports_progress(self) -> bool:
        """Fast algorithms log each finished rollout themselves."""
        return True


def _format_time(timestamp: Optional[float]) -> str:
    return datetime.fromtimestamp(timestamp).isoformat() if timestamp is not None else "unknown"


def format_span(span: Span, verbosity: SpanVerbosity) -> str:
    """One log line describing a span: ids, sequence number, name, timing and attributes (per ``verbosity``)."""
    elapsed = (
        f"{span.end_time - span.start_time:.2f}"
        if span.start_time is not None and span.end_time is not None
        else "unknown"
    )
    line = (
        f"[Rollout {span.rollout_id} | Attempt {span.attempt_id} | Span {span.span_id}] #{span.sequence_id} "
        f"({span.name}) From {_format_time(span.start_time)}, to {_format_time(span.end_time)}, {elapsed} seconds. "
    )
    if verbosity == "key_values":
        return line + f"Attributes: {span.attributes}"
    return line + f"Attribute keys: {list(span.attributes.keys())}"


class Baseline(FastAlgorithm):
    """Enqueue every train and validation task, wait for the rollouts and log everything about them.

    For each finished rollout it logs the status, every attempt, every span (per ``span_verbosity``) and, when the
    trainer set an adapter, the adapted data (e.g. triplets). Useful to check an agent end to end before training.
    A short progress line per finished rollout (count, status, reward, mean reward) and a summary go to the
    :data:`~agentbolt.algorithm.progress.PROGRESS_LOGGER_NAME` logger.

    Args:
        n_epochs: Passes over the datasets.
        train_split: Kept for compatibility; must be in (0, 1).
        polling_interval: Seconds between store polls (queue length and rollout status).
        max_queue_length: Enqueue only while at most this many rollouts are waiting.
        span_verbosity: ``"keys"`` logs attribute names, ``"key_values"`` names and values, ``"none"`` no spans.

    Raises:
        ValueError: If ``train_split`` is not strictly between 0 and 1, or other arguments are out of range.
    """

    def __init__(
        self,
        *,
        n_epochs: int = 1,
        train_split: float = 0.5,
        polling_interval: float = 5.0,
        max_queue_length: int = 4,
        span_verbosity: SpanVerbosity = "keys",
    ) -> None:
        if not 0 < train_split < 1:
            raise ValueError(f"train_split must be between 0 and 1 (exclusive), got {train_split}.")
        if n_epochs < 1:
            raise ValueError(f"n_epochs must be >= 1, got {n_epochs}.")
        if polling_interval <= 0:
            raise ValueError(f"polling_interval must be > 0, got {polling_interval}.")
        if max_queue_length < 0:
            raise ValueError(f"max_queue_length must be >= 0, got {max_queue_length}.")
        if span_verbosity not in ("keys", "key_values", "none"):
            raise ValueError(f"span_verbosity must be 'keys', 'key_values' or 'none', got {span_verbosity!r}.")
        self.n_epochs = n_epochs
        self.train_split = train_split
        self.polling_interval = polling_interval
        self.max_queue_length = max_queue_length
        self.span_verbosity: SpanVerbosity = span_verbosity
        self._finished_rollouts = 0
        self._progress = RolloutProgress()

    @with_llm_proxy()
    @with_store
    async def run(  # type: ignore[override]
        self,
        store: LightningStore,
        llm_proxy: Optional[LLMProxy],
        train_dataset: Optional[Dataset[Any]] = None,
        val_dataset: Optional[Dataset[Any]] = None,
    ) -> None:
        """Run every task of both datasets ``n_epochs`` times and log the results.

        Args:
            train_dataset: Tasks enqueued in ``train`` mode.
            val_dataset: Tasks enqueued in ``val`` mode (after the training tasks).
        """
        samples: List[Tuple[Any, RolloutMode]] = []
        for dataset, mode in ((train_dataset, "train"), (val_dataset, "val")):
            if dataset is not None:
                samples.extend((dataset[i], mode) for i in range(len(dataset)))  # type: ignore[misc]
        if not samples:
            logger.error("Baseline needs a train or validation dataset; both are empty or missing.")
            return

        resources_id: Optional[str] = None
        initial_resources = self.get_initial_resources()
        if initial_resources is not None:
            update = await store.update_resources("default", initial_resources)
            resources_id = update.resources_id
            logger.info("Initial resources set: %s", initial_resources)
        elif await store.get_latest_resources() is None:
            logger.warning(
                "No initial resources, and the store holds none: runners find no resources for these rollouts and "
                "leave them unfinished. Give the Trainer initial_resources (an empty dict if the agent needs none)."
            )

        self._finished_rollouts = 0
        self._progress = RolloutProgress(total=len(samples) * self.n_epochs)
        for epoch in range(self.n_epochs):
            logger.info("Proceeding epoch %d/%d.", epoch + 1, self.n_epochs)
            harvesters: List[asyncio.Task[None]] = []
            for sample, mode in samples:
                while len(await store.query_rollouts(status_in=["queuing", "requeuing"])) > self.max_queue_length:
                    await asyncio.sleep(self.polling_interval)
                rollout = await store.enqueue_rollout(input=sample, mode=mode, resources_id=resources_id)
                logger.info("Enqueued rollout %s in %s mode with sample: %s", rollout.rollout_id, mode, sample)
                harvesters.append(asyncio.create_task(self._harvest(store, rollout.rollout_id)))
            logger.info("Waiting for %d harvest tasks to complete...", len(harvesters))
            await asyncio.gather(*harvesters)
        self._progress.summary()

    async def _harvest(self, store: LightningStore, rollout_id: str) -> None:
        """Follow one rollout until it finishes, then log its attempts, spans and adapted data."""
        started = time.monotonic()
        status: Optional[str] = None
        while True:
            rollout = await store.get_rollout_by_id(rollout_id)
            if rollout is None:
                logger.error("[Rollout %s] Disappeared from the store.", rollout_id)
                return
            if status is None:
                logger.info("[Rollout %s] Status is initialized to %s.", rollout_id, rollout.status)
            elif rollout.status != status:
                logger.info("[Rollout %s] Status changed to %s.", rollout_id, rollout.status)
            status = rollout.status
            if is_finished(rollout):
                break
            await asyncio.sleep(self.polling_interval)

        if rollout.end_time is not None:
            duration = rollout.end_time - rollout.start_time
        else:
            duration = time.monotonic() - started
        logger.info("[Rollout %s] Finished with status %s in %.2f seconds.", rollout_id, status, duration)
        await self._log_rollout(store, rollout)
        self._finished_rollouts += 1
        logger.info("Finished %d rollouts.", self._finished_rollouts)
        await self._progress.report(store, rollout, duration)

    async def _log_rollout(self, store: LightningStore, rollout: Rollout) -> None:
        attempts: Sequence[Attempt] = await store.query_attempts(rollout.rollout_id)
        spans: Sequence[Span] = await store.query_spans(rollout.rollout_id) if self.span_verbosity != "none" else []
        for attempt in attempts:
            logger.info(
                "[Rollout %s | Attempt %s] ID: %s. Status: %s. Worker: %s",
                rollout.rollout_id,
                attempt.sequence_id,
                attempt.attempt_id,
                attempt.status,
                attempt.worker_id,
            )
            for span in spans:
                if span.attempt_id == attempt.attempt_id:
                    logger.info("%s", format_span(span, self.span_verbosity))

        try:
            adapter = self.get_adapter()
        except ValueError:
            return
        try:
            latest_spans = await store.query_spans(rollout.rollout_id, attempt_id="latest")
            adapted = adapter.adapt(latest_spans)
        except Exception:
            logger.exception("[Rollout %s] The adapter failed on this rollout's spans.", rollout.rollout_id)
            return
        logger.info("[Rollout %s] Adapted data: %s", rollout.rollout_id, adapted)
