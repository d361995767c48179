"""Encoding values that hold lone surrogates: repaired where they sit, and other failures reported as TypeError."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest

from agentbolt.types.wire import encode_json_repairing, without_lone_surrogates

LONE = "\ud800"


class _Pair(NamedTuple):
    text: str
    number: int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({LONE}, {"\ufffd"}),
        (frozenset({LONE}), frozenset({"\ufffd"})),
        (_Pair(LONE, 1), _Pair("\ufffd", 1)),
        ((LONE, 1), ("\ufffd", 1)),
    ],
)
def test_lone_surrogates_are_repaired_in_sets_and_named_tuples(value: Any, expected: Any) -> None:
    repaired = without_lone_surrogates(value)
    assert repaired == expected
    assert type(repaired) is type(value)


def test_encoding_repairs_a_set_holding_a_lone_surrogate() -> None:
    assert json.loads(encode_json_repairing({"tags": {LONE}})) == {"tags": ["\ufffd"]}


def test_encoding_repairs_a_named_tuple_holding_a_lone_surrogate() -> None:
    assert json.loads(encode_json_repairing({"pair": _Pair(LONE, 1)})) == {"pair": ["\ufffd", 1]}


def test_a_value_json_cannot_carry_next_to_a_lone_surrogate_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="JSON cannot carry"):
        encode_json_repairing({"text": LONE, "thing": object()})
