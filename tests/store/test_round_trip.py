"""What every backend gives back: any string exactly (NUL characters, private-use characters, escape look-alikes),
mappings with their keys in the order written, and non-finite floats either as they are or as the strings JSON
stores for them."""

from __future__ import annotations

import math
from typing import Any, Dict

from agentbolt.store.base import LightningStore
from agentbolt.types.wire import NON_FINITE_FLOATS

from .conftest import make_span

TRICKY = [
    "a\x00b",
    "\x00",
    "\ue000",
    "\ue000\ue001",
    "\ue000\ue002",
    "\ue000\x00\ue001",
    "\\u0000",  # a backslash and five characters, not a NUL
    "\\\x00",
    'tab\tquote"nl\n\U0001f642',
]


def tricky_mapping() -> Dict[str, Any]:
    mapping: Dict[str, Any] = {f"value {i}": text for i, text in enumerate(TRICKY)}
    mapping.update({text: i for i, text in enumerate(TRICKY)})  # as keys too
    return mapping


async def test_strings_round_trip_exactly_in_inputs_metadata_and_spans(store: LightningStore) -> None:
    rollout = await store.start_rollout(tricky_mapping(), metadata={"tricky": TRICKY})
    assert rollout.input == tricky_mapping()
    queued = await store.enqueue_rollout(TRICKY)
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, metadata={"notes": TRICKY})
    span = make_span(
        rollout.rollout_id,
        rollout.attempt.attempt_id,
        await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id),
        "s1",
        attributes={**{k: v for k, v in tricky_mapping().items()}, "list": TRICKY},
    )
    assert await store.add_span(span) is not None

    read = await store.get_rollout_by_id(rollout.rollout_id)
    assert read is not None and read.input == tricky_mapping() and read.metadata == {"tricky": TRICKY}
    read_queued = await store.get_rollout_by_id(queued.rollout_id)
    assert read_queued is not None and read_queued.input == TRICKY
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.metadata == {"notes": TRICKY}
    (stored,) = await store.query_spans(rollout.rollout_id)
    assert stored.attributes == span.attributes


LONE = "ok \udcff then \ud83d\ude00 end \ud800"  # what surrogateescape decoding gives, a split emoji, a lone half
LONE_REPAIRED = "ok \ufffd then \U0001f600 end \ufffd"


async def test_lone_surrogates_are_kept_or_repaired_never_refused(store: LightningStore) -> None:
    """No UTF-8 store can hold a lone surrogate: memory keeps it, the others store U+FFFD in its place."""

    def kept(read: Any, written: Any) -> bool:
        return read == written or read == replace_lone(written)

    def replace_lone(value: Any) -> Any:
        from agentbolt.types.wire import without_lone_surrogates

        return without_lone_surrogates(value)

    rollout = await store.start_rollout({LONE: LONE}, metadata={"note": LONE})
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, metadata={"notes": [LONE]})
    span = make_span(
        rollout.rollout_id,
        rollout.attempt.attempt_id,
        await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id),
        "s1",
        name=f"tool {LONE}",
        attributes={"tool.output": LONE, LONE: [LONE, "b"]},
    )
    assert await store.add_span(span) is not None
    assert replace_lone({LONE: LONE}) == {LONE_REPAIRED: LONE_REPAIRED}

    read = await store.get_rollout_by_id(rollout.rollout_id)
    assert read is not None and kept(read.input, {LONE: LONE}) and kept(read.metadata, {"note": LONE})
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and kept(attempt.metadata, {"notes": [LONE]})
    (stored,) = await store.query_spans(rollout.rollout_id)
    assert kept(stored.name, span.name) and kept(stored.attributes, span.attributes)


def same_float(read: Any, written: float) -> bool:
    """``read`` is ``written`` itself (kept in memory) or the string JSON stores for it."""
    value = NON_FINITE_FLOATS.get(read) if isinstance(read, str) else read
    return isinstance(value, float) and (value == written or (math.isnan(value) and math.isnan(written)))


async def test_non_finite_floats_never_make_a_stored_item_unreadable(store: LightningStore) -> None:
    """JSON has no NaN or infinity: they used to be written as null, which span attributes refuse on reading."""
    nan, inf = float("nan"), float("inf")
    rollout = await store.start_rollout({"score": nan}, metadata={"bound": -inf})
    span = make_span(
        rollout.rollout_id,
        rollout.attempt.attempt_id,
        await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id),
        "s1",
        attributes={"reward": nan, "logprobs": [-0.5, -inf], "high": inf},
        start_time=1.0,
        end_time=inf,
    )
    assert await store.add_span(span) is not None
    (stored,) = await store.query_spans(rollout.rollout_id)
    assert same_float(stored.attributes["reward"], nan) and same_float(stored.attributes["high"], inf)
    assert stored.attributes["logprobs"][0] == -0.5 and same_float(stored.attributes["logprobs"][1], -inf)
    assert stored.end_time == inf  # a float field reads the stored string back as the float
    read = await store.get_rollout_by_id(rollout.rollout_id)
    assert read is not None and same_float(read.input["score"], nan) and same_float(read.metadata["bound"], -inf)


async def test_mappings_keep_the_order_of_their_keys(store: LightningStore) -> None:
    """PostgreSQL's ``jsonb`` would sort keys (shortest first); a prompt built from ``input.items()`` must not change."""
    ordered = {"question": "q", "context": {"zeta": 1, "alpha": 2, "b": 3}, "a": [{"y": 1, "x": 2}]}
    rollout = await store.start_rollout(ordered, metadata={"zz": 1, "a": 2})
    span = make_span(
        rollout.rollout_id,
        rollout.attempt.attempt_id,
        await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id),
        "s1",
        attributes={"zeta": 1, "alpha": 2, "gen_ai.prompt.1.role": "user", "gen_ai.prompt.0.role": "system"},
    )
    await store.add_span(span)
    read = await store.get_rollout_by_id(rollout.rollout_id)
    assert read is not None
    assert list(read.input) == list(ordered) and list(read.input["context"]) == ["zeta", "alpha", "b"]
    assert list(read.input["a"][0]) == ["y", "x"] and list(read.metadata) == ["zz", "a"]
    (stored,) = await store.query_spans(rollout.rollout_id)
    assert list(stored.attributes) == list(span.attributes)


async def test_non_finite_floats_in_updates_reach_the_store(store: LightningStore) -> None:
    """Updates send plain mappings, which JSON encoders write as the invalid token NaN unless told otherwise."""
    nan, inf = float("nan"), float("inf")
    rollout = await store.start_rollout("x")
    await store.update_rollout(rollout.rollout_id, metadata={"loss": nan})
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, metadata={"bound": inf})
    (queued,) = await store.enqueue_many_rollouts([{"input": {"score": -inf}}])
    worker = await store.update_worker("w1", heartbeat_stats={"load": nan})
    read = await store.get_rollout_by_id(rollout.rollout_id)
    assert read is not None and same_float(read.metadata["loss"], nan)
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and same_float(attempt.metadata["bound"], inf)
    assert same_float(queued.input["score"], -inf)
    assert worker.heartbeat_stats is not None and same_float(worker.heartbeat_stats["load"], nan)


BIG_INTEGERS = [2**63 - 1, 2**63, -(2**63) - 1, 2**64, 2**70, -(10**30), 10**40 + 1]
"""Integers at and beyond 64 bits: Python keeps them exactly, and so must every backend."""


async def test_integers_beyond_64_bits_round_trip_exactly(store: LightningStore) -> None:
    rollout = await store.start_rollout({"ids": BIG_INTEGERS, "seed": 2**70}, metadata={"big": 10**30})
    queued = await store.enqueue_rollout(BIG_INTEGERS)
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, metadata={"step": 2**65})
    await store.update_rollout(rollout.rollout_id, metadata={"big": -(2**80)})
    span = make_span(
        rollout.rollout_id,
        rollout.attempt.attempt_id,
        await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id),
        "s1",
        attributes={"token_ids": BIG_INTEGERS, "count": 2**64},
    )
    assert await store.add_span(span) is not None

    read = await store.get_rollout_by_id(rollout.rollout_id)
    assert read is not None and read.input == {"ids": BIG_INTEGERS, "seed": 2**70}
    assert read.metadata == {"big": -(2**80)}
    assert all(type(value) is int for value in read.input["ids"])
    read_queued = await store.get_rollout_by_id(queued.rollout_id)
    assert read_queued is not None and read_queued.input == BIG_INTEGERS
    (listed,) = [r for r in await store.query_rollouts() if r.rollout_id == rollout.rollout_id]
    assert listed.input == {"ids": BIG_INTEGERS, "seed": 2**70}
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.metadata == {"step": 2**65}
    (stored,) = await store.query_spans(rollout.rollout_id)
    assert stored.attributes == {"token_ids": BIG_INTEGERS, "count": 2**64}


async def test_worker_and_metric_updates_keep_values_and_key_order(store: LightningStore) -> None:
    """Worker records are updated field by field (a heartbeat beside a status change); what they hold must come back as
    written all the same."""
    stats = {"zz": 1, "a": {"y": 2, "x": 3}, "note": "a\x00b", "big": 2**70}
    await store.update_worker("w1", heartbeat_stats={"first": True})
    worker = await store.update_worker("w1", heartbeat_stats=stats)
    assert list(worker.heartbeat_stats or {}) == list(stats)
    (read,) = [w for w in await store.query_workers() if w.worker_id == "w1"]
    assert read.heartbeat_stats == stats
    assert list(read.heartbeat_stats or {}) == list(stats) and list((read.heartbeat_stats or {})["a"]) == ["y", "x"]


class _NotJson:
    """An object of a class of one's own, which JSON cannot carry."""


async def test_a_value_json_cannot_carry_is_named_by_stores_that_write_json(
    store: LightningStore, backend: str
) -> None:
    if backend.startswith("memory") or backend == "threaded":
        return  # an in-process memory store keeps Python objects as they are
    try:
        await store.start_rollout(input={"x": _NotJson()})
    except TypeError as exc:
        assert "holds a value JSON cannot carry" in str(exc) and "_NotJson" in str(exc)
    else:
        raise AssertionError("a store writing JSON accepted an object JSON cannot carry")
    assert len(await store.query_rollouts()) == 0


async def test_what_a_store_holds_changes_only_through_the_store(store: LightningStore) -> None:
    # Every backend keeps its own copy: neither the value a caller wrote nor one it read back is the stored value,
    # so an agent that changes its task in place changes nothing for the other rollouts of the same task.
    from agentbolt.types import PromptTemplate

    task: Dict[str, Any] = {"question": "2 + 2?", "history": [{"role": "user"}]}
    metadata: Dict[str, Any] = {"tags": ["a"]}
    first = await store.enqueue_rollout(task, metadata=metadata)
    await store.enqueue_rollout(task)
    task["history"].append({"role": "caller"})
    metadata["tags"].append("caller")
    first.input["question"] = "returned by enqueue"
    claimed = await store.dequeue_rollout(worker_id="w")
    assert claimed is not None and claimed.rollout_id == first.rollout_id
    claimed.input["history"][0]["role"] = "agent"
    claimed.input["history"].append({"role": "agent"})
    claimed.metadata["tags"].append("agent")
    claimed.config.retry_condition.append("timeout")
    second = await store.dequeue_rollout(worker_id="w")
    assert second is not None
    for rollout in (await store.get_rollout_by_id(first.rollout_id), second):
        assert rollout is not None and rollout.input == {"question": "2 + 2?", "history": [{"role": "user"}]}
    stored = await store.get_rollout_by_id(first.rollout_id)
    assert stored is not None and stored.metadata == {"tags": ["a"]} and stored.config.retry_condition == []

    attempt_metadata: Dict[str, Any] = {"notes": ["n"]}
    updated = await store.update_attempt(first.rollout_id, claimed.attempt.attempt_id, metadata=attempt_metadata)
    attempt_metadata["notes"].append("caller")
    updated.metadata["notes"].append("returned")
    (attempt,) = await store.query_attempts(first.rollout_id)
    assert attempt.metadata == {"notes": ["n"]}

    span = make_span(first.rollout_id, claimed.attempt.attempt_id, 1, "s1", attributes={"ids": [1, 2]})
    await store.add_span(span)
    span.attributes["ids"].append(3)
    (read,) = await store.query_spans(first.rollout_id)
    read.attributes["ids"].append(4)
    read.status.description = "changed"
    (again,) = await store.query_spans(first.rollout_id)
    assert again.attributes["ids"] == [1, 2] and again.status.description is None

    resources = {"prompt": PromptTemplate(template="Q: {q}", engine="f-string")}
    update = await store.add_resources(resources)
    resources["prompt"].template = "caller"
    update.resources["prompt"].template = "returned"  # type: ignore[attr-defined]
    latest = await store.get_latest_resources()
    assert latest is not None and latest.resources["prompt"].template == "Q: {q}"  # type: ignore[attr-defined]

    stats: Dict[str, Any] = {"gpu": [1]}
    worker = await store.update_worker("w", heartbeat_stats=stats)
    stats["gpu"].append(2)
    assert worker.heartbeat_stats is not None
    worker.heartbeat_stats["gpu"].append(3)
    stored_worker = await store.get_worker_by_id("w")
    assert stored_worker is not None and stored_worker.heartbeat_stats == {"gpu": [1]}
