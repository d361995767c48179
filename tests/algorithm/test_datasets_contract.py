"""Datasets given to algorithms (contract §12, §13): an algorithm without a parameter for a given dataset raises."""

from __future__ import annotations

import warnings
from typing import Any, List, Optional

import pytest

import agentbolt as agl
from agentbolt.store.memory import InMemoryLightningStore

RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 0}


@agl.rollout
def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
    return 1.0


def _fit(algorithm: Any, train: Any = None, val: Any = None) -> None:
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=InMemoryLightningStore(),
        strategy={"type": "shm", "graceful_delay": 0.1, "poll_interval": 0.02},
        runner=RUNNER,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(agent, train, val_dataset=val)


def test_functional_algorithm_without_a_dataset_parameter_raises_when_that_dataset_is_given() -> None:
    seen: List[Any] = []

    @agl.algo
    def train_only(train_dataset: Any) -> None:
        seen.append(train_dataset)

    @agl.algo
    def no_datasets() -> None:
        seen.append("ran")

    train_only.run(train_dataset=[1])
    train_only.run()
    no_datasets.run()
    assert seen == [[1], None, "ran"]
    with pytest.raises(TypeError, match="val_dataset"):
        train_only.run(train_dataset=[1], val_dataset=[2])
    with pytest.raises(TypeError, match="train_dataset"):
        no_datasets.run(train_dataset=[1])


def test_trainer_surfaces_the_error_of_a_functional_algorithm_given_an_unexpected_dataset() -> None:
    @agl.algo
    def no_val(train_dataset: Any) -> None: ...

    with pytest.raises(TypeError, match="val_dataset"):
        _fit(no_val, [1], val=[2])


class TrainOnly(agl.Algorithm):
    def __init__(self) -> None:
        self.seen: List[Any] = []

    def run(self, train_dataset: Optional[Any] = None) -> None:  # type: ignore[override]
        self.seen.append(train_dataset)


class NoDatasets(agl.Algorithm):
    def __init__(self) -> None:
        self.runs = 0

    async def run(self) -> None:  # type: ignore[override]
        self.runs += 1


class AnyKeywords(agl.Algorithm):
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}

    def run(self, **kwargs: Any) -> None:  # type: ignore[override]
        self.kwargs = kwargs


def test_algorithm_without_a_dataset_parameter_runs_when_that_dataset_is_not_given() -> None:
    train_only = TrainOnly()
    _fit(train_only, [1, 2])
    assert train_only.seen == [[1, 2]]
    no_datasets = NoDatasets()
    _fit(no_datasets)
    assert no_datasets.runs == 1
    any_keywords = AnyKeywords()
    _fit(any_keywords, [1], val=[2])
    assert any_keywords.kwargs == {"train_dataset": [1], "val_dataset": [2]}


@pytest.mark.parametrize(
    ("algorithm", "train", "val", "missing"),
    [(TrainOnly(), [1], [2], "val_dataset"), (NoDatasets(), [1], None, "train_dataset")],
)
def test_algorithm_without_a_dataset_parameter_raises_when_that_dataset_is_given(
    algorithm: agl.Algorithm, train: Any, val: Any, missing: str
) -> None:
    with pytest.raises(TypeError, match=f"{type(algorithm).__name__}.*{missing}"):
        _fit(algorithm, train, val)
