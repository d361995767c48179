"""``estimate_model_size`` (contract §4.3): recursive ``sys.getsizeof`` over model fields, mappings, lists, tuples and
sets, plus the container itself."""

from __future__ import annotations

import sys
import types
from typing import Any, Dict, List, Optional

import pytest
from pydantic import BaseModel, ConfigDict

from agentbolt.store.memory import estimate_model_size
from store.conftest import make_span


class Inner(BaseModel):
    text: str
    numbers: List[int]


class Outer(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    inner: Inner
    table: Dict[str, Inner]
    missing: Optional[str] = None


@pytest.mark.parametrize("value", ["", "text" * 50, 7, 2**100, 1.5, None, True, b"bytes" * 10, object()])
def test_a_leaf_is_its_getsizeof(value: Any) -> None:
    assert estimate_model_size(value) == sys.getsizeof(value)


@pytest.mark.parametrize("container", [list, tuple, set, frozenset])
def test_a_sequence_or_set_is_itself_plus_each_item(container: Any) -> None:
    items = container(["alpha", "beta" * 20, 12345])
    assert estimate_model_size(items) == sys.getsizeof(items) + sum(sys.getsizeof(item) for item in items)


def test_repeated_items_count_once_per_occurrence() -> None:
    word = "shared-" * 10
    items = [word, word, word]
    assert estimate_model_size(items) == sys.getsizeof(items) + 3 * sys.getsizeof(word)


@pytest.mark.parametrize("wrap", [dict, types.MappingProxyType])
def test_a_mapping_is_itself_plus_its_values(wrap: Any) -> None:
    mapping = wrap({"k1": "v" * 30, "k2": [1, 2]})
    expected = sys.getsizeof(mapping) + sys.getsizeof("v" * 30) + estimate_model_size([1, 2])
    assert estimate_model_size(mapping) == expected


def _inner_size(inner: Inner) -> int:
    numbers = sys.getsizeof(inner.numbers) + sum(sys.getsizeof(n) for n in inner.numbers)
    return sys.getsizeof(inner) + sys.getsizeof(inner.text) + numbers


def test_a_model_is_itself_plus_its_fields_recursively() -> None:
    inner = Inner(text="hello", numbers=[1, 2, 3])
    assert estimate_model_size(inner) == _inner_size(inner)
    outer = Outer(name="n", inner=inner, table={"a": inner, "b": Inner(text="x", numbers=[])}, note="extra" * 100)
    table = sys.getsizeof(outer.table) + sum(_inner_size(value) for value in outer.table.values())
    expected = sys.getsizeof(outer) + sys.getsizeof("n") + _inner_size(outer.inner) + table + sys.getsizeof(None)
    assert estimate_model_size(outer) == expected  # the extra (undeclared) value is not a model field


def test_a_span_is_sized_through_its_fields() -> None:
    span = make_span("ro-1", "at-1", 1, "s1", attributes={"prompt": "x" * 5_000})
    expected = sys.getsizeof(span) + sum(estimate_model_size(getattr(span, name)) for name in type(span).model_fields)
    assert estimate_model_size(span) == expected
    assert estimate_model_size(span) > 5_000


def test_a_cycle_terminates_counting_the_back_reference_as_nothing() -> None:
    cyclic: List[Any] = ["leaf"]
    cyclic.append(cyclic)
    assert estimate_model_size(cyclic) == sys.getsizeof(cyclic) + sys.getsizeof("leaf")
