"""``query_spans_of_attempts`` (extension): the spans of many attempts in one call, per attempt as ``query_spans``
gives them, on every backend (in process, through ``LightningStoreThreaded`` and over HTTP)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from agentbolt.store.base import LightningStore
from agentbolt.types import EnqueueRolloutRequest

from .conftest import make_span, make_store


async def _two_rollouts(store: LightningStore) -> Tuple[str, List[str], str, str]:
    """Rollout A with two attempts, rollout B with one; spans named ``reward`` and ``work`` out of sequence order."""
    first = await store.start_rollout(input="a", worker_id="w")
    a = first.rollout_id
    a1 = first.attempt.attempt_id
    a2 = (await store.start_attempt(a, worker_id="w")).attempt.attempt_id
    second = await store.start_rollout(input="b", worker_id="w")
    b, b1 = second.rollout_id, second.attempt.attempt_id
    await store.add_many_spans(
        [
            make_span(a, a1, 1, "a1-reward", name="reward"),
            make_span(a, a2, 3, "a2-late-reward", name="reward"),
            make_span(a, a2, 2, "a2-work", name="work"),
            make_span(a, a2, 1, "a2-early-reward", name="reward"),
            make_span(b, b1, 1, "b1-work", name="work"),
        ]
    )
    return a, [a1, a2], b, b1


async def test_each_pair_gets_what_query_spans_gives_it_in_input_order(store: LightningStore) -> None:
    a, (a1, a2), b, b1 = await _two_rollouts(store)
    pairs = [(a, a2), (b, b1), ("no-such-rollout", "no-such-attempt"), (a, a1), (a, a2)]
    for name in ("reward", None):
        answer = await store.query_spans_of_attempts(pairs, name=name)
        assert [list(spans) for spans in answer] == [
            list(await store.query_spans(rollout_id, attempt_id, name=name)) for rollout_id, attempt_id in pairs
        ]
    by_reward = await store.query_spans_of_attempts(pairs, name="reward")
    assert [[span.span_id for span in spans] for spans in by_reward] == [
        ["a2-early-reward", "a2-late-reward"],  # by sequence id, of that attempt only
        [],
        [],
        ["a1-reward"],
        ["a2-early-reward", "a2-late-reward"],
    ]


async def test_no_pairs_is_an_empty_answer(store: LightningStore) -> None:
    assert list(await store.query_spans_of_attempts([], name="reward")) == []


async def test_more_attempts_than_one_read_takes_are_all_answered(inproc_backend: str, tmp_path: Path) -> None:
    async with make_store(inproc_backend, tmp_path) as store:
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(1_050)])
        claimed = await store.dequeue_many_rollouts(limit=1_050, worker_id="w")
        await store.add_many_spans(
            [
                make_span(c.rollout_id, c.attempt.attempt_id, 1, f"{i:016x}", name="reward")
                for i, c in enumerate(claimed)
            ]
        )
        pairs = [(c.rollout_id, c.attempt.attempt_id) for c in reversed(claimed)]
        answer = await store.query_spans_of_attempts(pairs, name="reward")
    assert [[(s.rollout_id, s.attempt_id) for s in spans] for spans in answer] == [[pair] for pair in pairs]
