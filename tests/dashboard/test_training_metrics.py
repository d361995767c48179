"""Training metrics reach the store and the metrics backend: GRPO's TrainingLogger under a running algorithm."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from agentbolt.algorithm.base import Algorithm, running_algorithm
from agentbolt.algorithm.grpo.metrics import StoreMetricsSink, TrainingLogger
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.utils.metrics import PrometheusMetricsBackend, set_default_tracker

STEP = {
    "train/reward_mean": 0.5,
    "update/loss": 0.25,
    "update/update_tokens": 120.0,
    "time/step_seconds": 3.0,
    "time/update_seconds": 1.0,
}


class _LoggingAlgorithm(Algorithm):
    """Logs like GRPO does: a validation record at step 0, then one record per step."""

    def __init__(self, log_dir: Optional[Path], records: List[Dict[str, float]]) -> None:
        self.log_dir = log_dir
        self.records = records
        self.seen: Optional[Algorithm] = None

    async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        self.seen = running_algorithm()
        logger = TrainingLogger(log_dir=str(self.log_dir) if self.log_dir else None, console=False)
        for step, record in enumerate(self.records):
            logger.log(step, record)
        await asyncio.sleep(0.05)  # let the background writes finish, as the rest of a run does
        logger.close()


async def test_records_of_a_run_started_by_a_trainer_go_to_its_store(tmp_path: Path) -> None:
    store = InMemoryLightningStore()
    algorithm = _LoggingAlgorithm(tmp_path / "my-run", [{"val/accuracy": 0.25}, STEP])
    algorithm.set_store(store)

    await algorithm._run_with_datasets(None, None)

    assert algorithm.seen is algorithm and running_algorithm() is None
    records = list(await store.query_metrics())
    assert [(r.run_id, r.step) for r in records] == [("my-run", 0), ("my-run", 1)]
    assert records[1].values["update/loss"] == 0.25


def test_a_logger_outside_a_running_algorithm_writes_no_store_records() -> None:
    logger = TrainingLogger(console=False)
    assert not any(isinstance(sink, StoreMetricsSink) for sink in logger.sinks)
    logger.close()


async def test_a_store_without_metrics_support_is_skipped_without_failing_the_run(tmp_path: Path) -> None:
    class _Refusing(InMemoryLightningStore):
        async def add_metrics(self, records):  # type: ignore[no-untyped-def, override]
            raise NotImplementedError("no metrics here")

    store = _Refusing()
    algorithm = _LoggingAlgorithm(None, [STEP, STEP])
    algorithm.set_store(store)
    await algorithm._run_with_datasets(None, None)
    assert list(await store.query_metrics()) == []


async def test_steps_are_recorded_as_trainer_metrics() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    set_default_tracker(PrometheusMetricsBackend(registry=registry))
    try:
        algorithm = _LoggingAlgorithm(None, [{"val/accuracy": 1.0}, STEP, STEP])
        algorithm.set_store(InMemoryLightningStore())
        await algorithm._run_with_datasets(None, None)
    finally:
        set_default_tracker(None)
    labels = {"algorithm": "grpo"}
    assert registry.get_sample_value("agentbolt_trainer_steps_total", labels) == 2
    assert registry.get_sample_value("agentbolt_trainer_tokens_total", labels) == 240
    assert registry.get_sample_value("agentbolt_trainer_step_seconds_sum", labels) == 6
    assert registry.get_sample_value("agentbolt_trainer_reward_sum", labels) == 1.0
