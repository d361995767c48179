"""Invalid component specs given to ``Trainer(...)`` (contract §12): the error names the wrong type."""

from __future__ import annotations

import re
from typing import Any

import pytest

import agentbolt as agl
from agentbolt.algorithm import Baseline
from agentbolt.store.memory import InMemoryLightningStore

COMPONENTS = [
    ("tracer", "Tracer"),
    ("adapter", "TraceAdapter"),
    ("algorithm", "Algorithm"),
    ("strategy", "ExecutionStrategy"),
    ("store", "LightningStore"),
    ("runner", "Runner"),
    ("llm_proxy", "LLMProxy"),
]
IDS = [name for name, _ in COMPONENTS]


@agl.rollout
def agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
    raise AssertionError("an agent given as a component spec must not be called")


class NotAComponent:
    pass


@pytest.mark.parametrize(("name", "expected"), COMPONENTS, ids=IDS)
def test_a_value_of_the_wrong_type_is_named(name: str, expected: str) -> None:
    message = f"Invalid {name} type: <class 'int'>. Expected {expected}, str, dict, or None."
    with pytest.raises(ValueError, match=re.escape(message)):
        agl.Trainer(**{name: 42})


@pytest.mark.parametrize(("name", "expected"), COMPONENTS, ids=IDS)
def test_a_class_of_the_wrong_kind_is_named(name: str, expected: str) -> None:
    with pytest.raises(ValueError, match=rf"Invalid {name} type: .*NotAComponent.*Expected {expected}"):
        agl.Trainer(**{name: NotAComponent})


@pytest.mark.parametrize(("name", "expected"), COMPONENTS, ids=IDS)
def test_a_factory_returning_the_wrong_type_is_named(name: str, expected: str) -> None:
    message = f"{name} factory returned <class 'int'>, which is not a {expected} subclass."
    with pytest.raises(TypeError, match=re.escape(message)):
        agl.Trainer(**{name: lambda: 42})


@pytest.mark.parametrize(("name", "expected"), COMPONENTS, ids=IDS)
def test_an_import_path_to_the_wrong_kind_is_named(name: str, expected: str) -> None:
    path = f"{__name__}.NotAComponent"
    with pytest.raises(TypeError, match=rf"{name} factory returned .*NotAComponent.*not a {expected} subclass"):
        agl.Trainer(**{name: path})


@pytest.mark.parametrize(("name", "spec"), [("algorithm", agent), ("runner", Baseline()), ("tracer", agent)])
def test_callable_components_of_another_kind_are_named_not_called(name: str, spec: Any) -> None:
    with pytest.raises(ValueError, match=rf"Invalid {name} type: .*{type(spec).__name__}"):
        agl.Trainer(**{name: spec})


def test_a_dict_whose_type_is_not_a_class_or_path_is_named() -> None:
    with pytest.raises(ValueError, match=r"tracer.*'type'.*42"):
        agl.Trainer(tracer={"type": 42})


def test_an_unknown_strategy_alias_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'bogus'.*'shm'.*'cs'"):
        agl.Trainer(strategy="bogus")


@pytest.mark.parametrize("hooks", [42, [agl.Hook(), "not a hook"], InMemoryLightningStore()])
def test_hooks_that_are_not_hooks_are_named(hooks: Any) -> None:
    with pytest.raises(TypeError, match=r"hooks.*(int|str|InMemoryLightningStore)"):
        agl.Trainer(hooks=hooks)
