"""``collection_paused``: the cyclic collector is off inside the block and back as it was after it."""

from __future__ import annotations

import gc

import pytest

from agentbolt.utils.collector import collection_paused


def test_pauses_and_resumes_even_when_the_block_raises() -> None:
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("decoding failed")
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_cycles_built_inside_are_collected_after() -> None:
    with collection_paused():
        cycle: list = []
        cycle.append(cycle)
        del cycle
    assert gc.collect() >= 1
