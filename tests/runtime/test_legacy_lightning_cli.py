"""lightning_cli refuses what is not a class, and classes whose options would collide, with one clear error."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from agentbolt import lightning_cli


class Model:
    """A component with one option."""

    def __init__(self, size: int = 1) -> None:
        self.size = size


class model:  # a second class whose lower-cased name is the same as Model's
    """Another component named like :class:`Model`."""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth


def _factory(size: int = 1) -> Model:
    return Model(size)


@pytest.fixture(autouse=True)
def _no_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["prog"])


@pytest.mark.parametrize("item", [_factory, Model(), "Model"], ids=["function", "instance", "string"])
def test_lightning_cli_takes_only_classes(item: Any) -> None:
    with pytest.raises(TypeError, match="lightning_cli expects classes, got"):
        lightning_cli(item)


@pytest.mark.parametrize("classes", [(Model, Model), (Model, model)], ids=["same class twice", "same lower name"])
def test_lightning_cli_refuses_classes_sharing_an_option_prefix(classes: tuple[type, ...]) -> None:
    with pytest.raises(ValueError, match=r"share the option prefix --model\."):
        lightning_cli(*classes)


def test_lightning_cli_still_builds_distinct_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["prog", "--model.size", "3"])
    assert lightning_cli(Model).size == 3
