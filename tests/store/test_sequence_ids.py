"""Span sequence ids of a rollout the store does not know: answered, never kept.

Only a stored rollout has a sequence counter. Asking for an unknown rollout's ids (the gateway does, for a request
bound to a rollout id nobody created) answers as for a new rollout and stores nothing, so such calls leave no
counter behind; the spans those ids are for are refused when they arrive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.store.threading import LightningStoreThreaded

from .conftest import make_span, make_store, raises_store_error

GHOST = ("ro-ghost", "at-ghost")


def counters(store: LightningStore) -> Any:
    """The sequence counters of an in-process store."""
    inner = store.store if isinstance(store, LightningStoreThreaded) else store
    return inner.collections.span_sequence_ids  # type: ignore[attr-defined]


async def test_an_unknown_rollout_gets_sequence_ids_as_a_new_rollout_each_time(store: LightningStore) -> None:
    known = await store.start_rollout("x")
    pair = (known.rollout_id, known.attempt.attempt_id)
    assert await store.get_next_span_sequence_id(*GHOST) == 1
    assert await store.get_next_span_sequence_id(*GHOST) == 1
    # within one call the ids of a rollout are consecutive, an unknown one's as a new rollout's would be
    assert list(await store.get_many_span_sequence_ids([GHOST, pair, GHOST, pair])) == [1, 1, 2, 2]
    assert await store.get_next_span_sequence_id(*GHOST) == 1
    assert await store.get_next_span_sequence_id(*pair) == 3  # known rollouts count as before


async def test_sequence_ids_of_an_unknown_rollout_leave_no_counter(inproc_backend: str, tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    async with make_store(inproc_backend, tmp_path) as store:
        known = await store.start_rollout("x")
        rid, aid = known.rollout_id, known.attempt.attempt_id
        with TracerProvider().get_tracer("agentbolt-tests").start_as_current_span("call") as otel_span:
            pass
        await store.get_next_span_sequence_id(*GHOST)
        await store.get_many_span_sequence_ids([GHOST, (rid, aid), GHOST])
        with raises_store_error(store, ValueError, "Rollout ro-ghost not found"):
            await store.add_otel_span(*GHOST, otel_span)  # type: ignore[arg-type]
        with raises_store_error(store, ValueError, "Rollout ro-ghost not found"):
            await store.add_spans_with_new_sequence_ids([make_span(*GHOST, 0, "s1")])
        with raises_store_error(store, ValueError, "Rollout ro-ghost not found"):
            await store.add_span(make_span(*GHOST, 5, "s2"))
        assert not await counters(store).has("ro-ghost")
        assert await counters(store).size() == 1
        assert await counters(store).get(rid) == 1


@pytest.mark.parametrize("operation", ["set", "inc", "chmax"])
async def test_a_counter_is_written_only_for_a_stored_rollout(
    inproc_backend: str, tmp_path: Path, operation: str
) -> None:
    """The collections' rule itself: writing the counter of an unknown id answers as for a missing key, stores nothing."""
    async with make_store(inproc_backend, tmp_path) as store:
        known = await store.start_rollout("x")
        write = getattr(counters(store), operation)
        assert await write("ro-ghost", 3) in (None, 3)
        assert await write(known.rollout_id, 3) in (None, 3)
        assert not await counters(store).has("ro-ghost")
        assert await counters(store).get(known.rollout_id) == 3
