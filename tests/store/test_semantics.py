"""Lifecycle semantics of every LightningStore backend (memory, threaded, SQLite, HTTP)."""

from __future__ import annotations

import asyncio
import re
import warnings

import pytest

from agentbolt.store.base import LightningStore
from agentbolt.types import (
    LLM,
    AttemptedRollout,
    EnqueueRolloutRequest,
    PaginatedResult,
    PromptTemplate,
    Rollout,
    RolloutConfig,
)

from .conftest import is_http, make_span, raises_store_error

RETRY_ON_FAILURE = RolloutConfig(max_attempts=3, retry_condition=["failed", "timeout", "unresponsive"])


async def claim(store: LightningStore, worker_id: str | None = None) -> AttemptedRollout:
    claimed = await store.dequeue_rollout(worker_id=worker_id)
    assert claimed is not None
    return claimed


async def send_span(store: LightningStore, rollout_id: str, attempt_id: str, span_id: str = "s1") -> None:
    sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
    assert await store.add_span(make_span(rollout_id, attempt_id, sequence_id, span_id)) is not None


# ---------------------------------------------------------------------------------------------------------------------
# Creation and queue


async def test_enqueue_creates_queuing_rollout_with_defaults(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout({"question": "2+2"}, mode="train", metadata={"k": "v"})
    assert re.fullmatch(r"ro-[0-9a-f]{12}", rollout.rollout_id)
    assert rollout.status == "queuing"
    assert rollout.input == {"question": "2+2"}
    assert rollout.mode == "train"
    assert rollout.config == RolloutConfig()
    assert rollout.metadata == {"k": "v"}
    assert rollout.resources_id is None
    assert rollout.end_time is None
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored == rollout
    assert not isinstance(stored, AttemptedRollout)
    assert await store.get_latest_attempt(rollout.rollout_id) is None


async def test_enqueue_resolves_latest_resources(store: LightningStore) -> None:
    first = await store.add_resources({"llm": LLM(endpoint="http://a/v1", model="m")})
    assert (await store.enqueue_rollout(1)).resources_id == first.resources_id
    second = await store.add_resources({"llm": LLM(endpoint="http://b/v1", model="m")})
    assert (await store.enqueue_rollout(2)).resources_id == second.resources_id
    assert (await store.enqueue_rollout(3, resources_id=first.resources_id)).resources_id == first.resources_id
    started = await store.start_rollout(4)
    assert started.resources_id == second.resources_id
    batch = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=5), EnqueueRolloutRequest(input=6, resources_id=first.resources_id)]
    )
    assert [r.resources_id for r in batch] == [second.resources_id, first.resources_id]


async def test_enqueue_many_keeps_order_and_dequeue_is_fifo(store: LightningStore) -> None:
    created = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=i, mode="val", config=RolloutConfig(max_attempts=2)) for i in range(5)]
    )
    assert [r.input for r in created] == list(range(5))
    assert all(r.status == "queuing" and r.config.max_attempts == 2 for r in created)
    assert await store.enqueue_many_rollouts([]) == []
    first = await claim(store)
    assert first.rollout_id == created[0].rollout_id
    rest = await store.dequeue_many_rollouts(limit=10)
    assert [r.rollout_id for r in rest] == [r.rollout_id for r in created[1:]]
    assert await store.dequeue_rollout() is None
    assert await store.dequeue_many_rollouts(limit=3) == []


async def test_dequeue_creates_preparing_attempt(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("task")
    claimed = await claim(store, worker_id="w-1")
    assert claimed.rollout_id == rollout.rollout_id
    assert claimed.status == "preparing"
    attempt = claimed.attempt
    assert re.fullmatch(r"at-[0-9a-f]{8}", attempt.attempt_id)
    assert attempt.sequence_id == 1
    assert attempt.status == "preparing"
    assert attempt.worker_id == "w-1"
    assert attempt.end_time is None
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert isinstance(stored, AttemptedRollout)
    assert stored.status == "preparing"
    assert stored.attempt == attempt


async def test_bad_worker_id_leaves_queue_intact(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("x")
    with raises_store_error(store, TypeError, "worker_id", http_status=()):
        await store.start_attempt(rollout.rollout_id, worker_id=123)  # type: ignore[arg-type]
    if not is_http(store):  # the HTTP client swallows dequeue errors by contract
        with pytest.raises(TypeError, match="worker_id"):
            await store.dequeue_rollout(worker_id=123)  # type: ignore[arg-type]
    claimed = await claim(store)
    assert claimed.rollout_id == rollout.rollout_id and claimed.attempt.sequence_id == 1
    assert await store.add_many_spans([]) == []


async def test_dequeue_many_with_limit_zero_or_negative_is_empty(store: LightningStore) -> None:
    await store.enqueue_rollout(1)
    assert await store.dequeue_many_rollouts(limit=0) == []
    assert await store.dequeue_many_rollouts(limit=-5) == []
    assert len(await store.dequeue_many_rollouts(limit=1)) == 1


async def test_start_rollout_is_not_queued(store: LightningStore) -> None:
    started = await store.start_rollout({"x": 1}, mode="test", worker_id="w-9")
    assert started.status == "preparing"
    assert started.attempt.sequence_id == 1
    assert started.attempt.status == "preparing"
    assert started.attempt.start_time == started.start_time
    assert started.metadata == {}
    assert await store.dequeue_rollout() is None
    worker = await store.get_worker_by_id("w-9")
    assert worker is not None and worker.status == "busy"
    assert worker.current_rollout_id == started.rollout_id
    assert worker.current_attempt_id == started.attempt.attempt_id


async def test_start_attempt_adds_attempts_and_rejects_unknown_rollout(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    second = await store.start_attempt(started.rollout_id, worker_id="w")
    third = await store.start_attempt(started.rollout_id)
    assert (second.attempt.sequence_id, third.attempt.sequence_id) == (2, 3)
    assert third.status == "preparing"
    attempts = await store.query_attempts(started.rollout_id)
    assert [a.sequence_id for a in attempts] == [1, 2, 3]
    assert (await store.get_latest_attempt(started.rollout_id)) == third.attempt
    with raises_store_error(store, ValueError, "not found"):
        await store.start_attempt("ro-missing")


# ---------------------------------------------------------------------------------------------------------------------
# Spans, heartbeats, sequence ids


async def test_first_span_marks_attempt_and_rollout_running(store: LightningStore) -> None:
    await store.enqueue_rollout("x")
    claimed = await claim(store)
    await send_span(store, claimed.rollout_id, claimed.attempt.attempt_id)
    attempt = await store.get_latest_attempt(claimed.rollout_id)
    assert attempt is not None and attempt.status == "running"
    assert attempt.last_heartbeat_time is not None
    rollout = await store.get_rollout_by_id(claimed.rollout_id)
    assert rollout is not None and rollout.status == "running"


async def test_span_on_queued_rollout_does_not_promote_it(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    await store.update_rollout(started.rollout_id, status="queuing")
    await send_span(store, started.rollout_id, started.attempt.attempt_id)
    rollout = await store.get_rollout_by_id(started.rollout_id)
    assert rollout is not None and rollout.status == "queuing"


async def test_duplicate_spans_are_skipped(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    span = make_span(rid, aid, 1, "span-a")
    assert await store.add_span(span) == span
    assert await store.add_span(span) is None
    added = await store.add_many_spans([make_span(rid, aid, 2, "span-b"), span, make_span(rid, aid, 3, "span-c")])
    assert [s.span_id for s in added] == ["span-b", "span-c"]
    spans = await store.query_spans(rid)
    assert [s.span_id for s in spans] == ["span-a", "span-b", "span-c"]


async def test_spans_for_unknown_rollout_or_attempt_are_rejected(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    with raises_store_error(store, ValueError, "Rollout ro-nope not found"):
        await store.add_span(make_span("ro-nope", started.attempt.attempt_id, 1, "s"))
    with raises_store_error(store, ValueError, f"Attempt at-nope not found for rollout {started.rollout_id}"):
        await store.add_span(make_span(started.rollout_id, "at-nope", 1, "s"))
    assert len(await store.query_spans(started.rollout_id)) == 0
    stats = await store.statistics()
    assert stats["total_spans"] == 0


async def test_sequence_ids_are_per_rollout_and_raised_by_spans(store: LightningStore) -> None:
    a = await store.start_rollout("a")
    b = await store.start_rollout("b")
    ra, aa = a.rollout_id, a.attempt.attempt_id
    rb, ab = b.rollout_id, b.attempt.attempt_id
    assert [await store.get_next_span_sequence_id(ra, aa) for _ in range(3)] == [1, 2, 3]
    second = await store.start_attempt(ra)
    # One counter per rollout: a new attempt does not restart it.
    assert await store.get_next_span_sequence_id(ra, second.attempt.attempt_id) == 4
    assert list(await store.get_many_span_sequence_ids([(ra, aa), (rb, ab), (ra, aa), (rb, ab)])) == [5, 1, 6, 2]
    await store.add_span(make_span(rb, ab, 10, "late"))
    assert await store.get_next_span_sequence_id(rb, ab) == 11
    await store.add_span(make_span(rb, ab, 4, "old"))
    assert await store.get_next_span_sequence_id(rb, ab) == 12


async def test_query_spans_filters_and_latest(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    rid, first = started.rollout_id, started.attempt.attempt_id
    await store.add_many_spans(
        [
            make_span(rid, first, 1, "s1", name="llm.call"),
            make_span(rid, first, 2, "s2", name="tool.search", parent_id="s1"),
        ]
    )
    second = (await store.start_attempt(rid)).attempt.attempt_id
    await store.add_many_spans([make_span(rid, second, 3, "s3", name="llm.call")])

    assert [s.span_id for s in await store.query_spans(rid)] == ["s1", "s2", "s3"]
    assert [s.span_id for s in await store.query_spans(rid, first)] == ["s1", "s2"]
    assert [s.span_id for s in await store.query_spans(rid, "latest")] == ["s3"]
    assert [s.span_id for s in await store.query_spans(rid, name="llm.call")] == ["s1", "s3"]
    assert [s.span_id for s in await store.query_spans(rid, name_contains="tool")] == ["s2"]
    assert [s.span_id for s in await store.query_spans(rid, parent_id="s1")] == ["s2"]
    either = await store.query_spans(rid, span_id="s1", name_contains="tool", filter_logic="or")
    assert [s.span_id for s in either] == ["s1", "s2"]
    both = await store.query_spans(rid, span_id="s1", name_contains="tool")
    assert len(both) == 0
    desc = await store.query_spans(rid, sort_by="sequence_id", sort_order="desc", limit=2)
    assert [s.span_id for s in desc] == ["s3", "s2"]
    assert isinstance(desc, PaginatedResult) and desc.total == 3
    page = await store.query_spans(rid, limit=1, offset=1)
    assert [s.span_id for s in page] == ["s2"] and page.total == 3
    assert len(await store.query_spans("ro-unknown")) == 0
    no_attempts = await store.enqueue_rollout("y")
    empty = await store.query_spans(no_attempts.rollout_id, "latest")
    assert len(empty) == 0 and empty.total == 0


# ---------------------------------------------------------------------------------------------------------------------
# Attempt outcomes, retries, recovery


async def test_success_finishes_rollout_and_frees_worker(store: LightningStore) -> None:
    await store.enqueue_rollout("x")
    claimed = await claim(store, worker_id="w-1")
    await send_span(store, claimed.rollout_id, claimed.attempt.attempt_id)
    attempt = await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    assert attempt.status == "succeeded" and attempt.end_time is not None
    rollout = await store.get_rollout_by_id(claimed.rollout_id)
    assert rollout is not None and rollout.status == "succeeded"
    assert rollout.end_time is not None and rollout.end_time >= rollout.start_time
    worker = await store.get_worker_by_id("w-1")
    assert worker is not None
    assert worker.status == "idle" and worker.current_rollout_id is None and worker.last_idle_time is not None


async def test_failure_without_retry_fails_rollout(store: LightningStore) -> None:
    await store.enqueue_rollout("x")
    claimed = await claim(store)
    await store.update_attempt(claimed.rollout_id, "latest", status="failed")
    rollout = await store.get_rollout_by_id(claimed.rollout_id)
    assert rollout is not None and rollout.status == "failed" and rollout.end_time is not None
    assert await store.dequeue_rollout() is None


async def test_retries_until_max_attempts(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("x", config=RETRY_ON_FAILURE)
    for sequence_id in (1, 2):
        claimed = await claim(store)
        assert claimed.attempt.sequence_id == sequence_id
        await store.update_attempt(rollout.rollout_id, "latest", status="failed")
        current = await store.get_rollout_by_id(rollout.rollout_id)
        assert current is not None and current.status == "requeuing" and current.end_time is None
    last = await claim(store)
    assert last.attempt.sequence_id == 3
    await store.update_attempt(rollout.rollout_id, "latest", status="failed")
    final = await store.get_rollout_by_id(rollout.rollout_id)
    assert final is not None and final.status == "failed"
    assert await store.dequeue_rollout() is None
    assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == ["failed"] * 3


async def test_retry_condition_limits_which_statuses_retry(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=5, retry_condition=["timeout"])
    rollout = await store.enqueue_rollout("x", config=config)
    await claim(store)
    await store.update_attempt(rollout.rollout_id, "latest", status="failed")
    current = await store.get_rollout_by_id(rollout.rollout_id)
    assert current is not None and current.status == "failed"

    other = await store.enqueue_rollout("y", config=config)
    await claim(store)
    await store.update_attempt(other.rollout_id, "latest", status="timeout")
    current = await store.get_rollout_by_id(other.rollout_id)
    assert current is not None and current.status == "requeuing"
    attempt = await store.get_latest_attempt(other.rollout_id)
    assert attempt is not None and attempt.end_time is None  # timeout does not stamp end_time


async def test_requeued_rollout_recovers_when_old_attempt_sends_span(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("x", config=RETRY_ON_FAILURE)
    claimed = await claim(store)
    await store.update_attempt(rollout.rollout_id, "latest", status="unresponsive")
    current = await store.get_rollout_by_id(rollout.rollout_id)
    assert current is not None and current.status == "requeuing"
    await send_span(store, rollout.rollout_id, claimed.attempt.attempt_id)
    recovered = await store.get_rollout_by_id(rollout.rollout_id)
    assert isinstance(recovered, AttemptedRollout)
    assert recovered.status == "running" and recovered.attempt.status == "running"
    # The stale queue entry is skipped.
    assert await store.dequeue_rollout() is None
    assert len(await store.query_attempts(rollout.rollout_id)) == 1


async def test_non_latest_attempt_update_leaves_rollout_alone(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    await store.start_attempt(started.rollout_id)
    updated = await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="failed")
    assert updated.status == "failed"
    rollout = await store.get_rollout_by_id(started.rollout_id)
    assert rollout is not None and rollout.status == "preparing"


async def test_update_attempt_fields_and_errors(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    rid = started.rollout_id
    updated = await store.update_attempt(rid, "latest", metadata={"note": 1}, last_heartbeat_time=123.0)
    assert updated.metadata == {"note": 1} and updated.last_heartbeat_time == 123.0
    assert updated.status == "preparing"
    with raises_store_error(store, ValueError, "Rollout ro-missing not found"):
        await store.update_attempt("ro-missing", "latest", status="failed")
    queued = await store.enqueue_rollout("y")
    with raises_store_error(store, ValueError, f"No attempts found for rollout {queued.rollout_id}"):
        await store.update_attempt(queued.rollout_id, "latest", status="failed")
    with raises_store_error(store, ValueError, f"Attempt at-missing not found for rollout {rid}"):
        await store.update_attempt(rid, "at-missing", status="failed")
    with raises_store_error(store, ValueError, "status"):
        await store.update_attempt(rid, "latest", status="exploded")  # type: ignore[arg-type]
    attempt = await store.get_latest_attempt(rid)
    assert attempt is not None and attempt.status == "preparing"


async def test_update_attempt_worker_assignment_syncs_worker(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    await store.update_worker("w-2", heartbeat_stats={"gpu": 0.5})
    await store.update_attempt(started.rollout_id, "latest", worker_id="w-2")
    worker = await store.get_worker_by_id("w-2")
    assert worker is not None and worker.status == "busy"
    assert worker.current_attempt_id == started.attempt.attempt_id
    assert worker.heartbeat_stats == {"gpu": 0.5}
    await store.update_attempt(started.rollout_id, "latest", status="timeout")
    worker = await store.get_worker_by_id("w-2")
    assert worker is not None and worker.status == "unknown" and worker.current_attempt_id is None
    assert worker.heartbeat_stats == {"gpu": 0.5}


# ---------------------------------------------------------------------------------------------------------------------
# update_rollout


async def test_update_rollout_writes_fields(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("x", mode="train", metadata={"a": 1})
    updated = await store.update_rollout(
        rollout.rollout_id, input="y", mode=None, metadata={"b": 2}, config=RolloutConfig(max_attempts=4)
    )
    assert updated.input == "y" and updated.mode is None and updated.metadata == {"b": 2}
    assert updated.config.max_attempts == 4 and updated.status == "queuing"
    assert await store.get_rollout_by_id(rollout.rollout_id) == updated


async def test_update_rollout_terminal_status_and_requeue(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("x")
    cancelled = await store.update_rollout(rollout.rollout_id, status="cancelled")
    assert cancelled.status == "cancelled" and cancelled.end_time is not None
    assert await store.dequeue_rollout() is None  # the queued id is dropped
    await store.update_rollout(rollout.rollout_id, status="queuing")
    await store.update_rollout(rollout.rollout_id, status="requeuing")  # already queued: not added twice
    claimed = await claim(store)
    assert claimed.rollout_id == rollout.rollout_id
    assert await store.dequeue_rollout() is None


async def test_cancelled_rollout_is_not_revived_by_attempt_updates(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    await store.update_rollout(started.rollout_id, status="cancelled")
    await store.update_attempt(started.rollout_id, "latest", status="succeeded")
    rollout = await store.get_rollout_by_id(started.rollout_id)
    assert rollout is not None and rollout.status == "cancelled"


async def test_update_rollout_rejects_unknown_rollout_and_bad_values(store: LightningStore) -> None:
    with raises_store_error(store, ValueError, "does not exist"):
        await store.update_rollout("ro-missing", status="failed")
    rollout = await store.enqueue_rollout("x")
    with raises_store_error(store, ValueError, "status"):
        await store.update_rollout(rollout.rollout_id, status="exploded")  # type: ignore[arg-type]
    assert await store.get_rollout_by_id(rollout.rollout_id) == rollout


# ---------------------------------------------------------------------------------------------------------------------
# Queries


async def test_query_rollouts_filters_sorting_pagination(store: LightningStore) -> None:
    a = await store.enqueue_rollout("a")
    b = await store.enqueue_rollout("b")
    c = await store.start_rollout("c")
    await store.update_rollout(b.rollout_id, status="succeeded")

    everything = await store.query_rollouts()
    assert isinstance(everything, PaginatedResult)
    assert [r.rollout_id for r in everything] == [a.rollout_id, b.rollout_id, c.rollout_id]
    assert everything.total == 3
    assert isinstance(everything[2], AttemptedRollout) and not isinstance(everything[0], AttemptedRollout)

    assert [r.rollout_id for r in await store.query_rollouts(status_in=["queuing", "preparing"])] == [
        a.rollout_id,
        c.rollout_id,
    ]
    assert len(await store.query_rollouts(status_in=[])) == 0
    by_ids = await store.query_rollouts(rollout_id_in=[c.rollout_id, a.rollout_id])
    assert {r.rollout_id for r in by_ids} == {a.rollout_id, c.rollout_id}
    contains = await store.query_rollouts(rollout_id_contains=b.rollout_id[3:9])
    assert [r.rollout_id for r in contains] == [b.rollout_id]
    either = await store.query_rollouts(status_in=["succeeded"], rollout_id_in=[a.rollout_id], filter_logic="or")
    assert {r.rollout_id for r in either} == {a.rollout_id, b.rollout_id}
    both = await store.query_rollouts(status_in=["succeeded"], rollout_id_in=[a.rollout_id])
    assert len(both) == 0

    by_input_desc = await store.query_rollouts(sort_by="input", sort_order="desc")
    assert [r.input for r in by_input_desc] == ["c", "b", "a"]
    page = await store.query_rollouts(sort_by="input", limit=2, offset=1)
    assert [r.input for r in page] == ["b", "c"]
    assert (page.limit, page.offset, page.total) == (2, 1, 3)


async def test_query_rollouts_deprecated_aliases(store: LightningStore) -> None:
    a = await store.enqueue_rollout("a")
    await store.start_rollout("b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await store.query_rollouts(status=["queuing"])
        assert [r.rollout_id for r in result] == [a.rollout_id]
        # The new name wins over the alias.
        result = await store.query_rollouts(status_in=["preparing"], status=["queuing"])
        assert [r.input for r in result] == ["b"]
        by_ids = await store.query_rollouts(rollout_ids=[a.rollout_id])
        assert [r.rollout_id for r in by_ids] == [a.rollout_id]
    if not is_http(store):
        assert any(issubclass(w.category, DeprecationWarning) for w in caught)


async def test_queries_reject_bad_sort_fields_and_filter_logic(store: LightningStore) -> None:
    await store.enqueue_rollout("a")
    with raises_store_error(store, ValueError, "sort"):
        await store.query_rollouts(sort_by="no_such_field")
    with raises_store_error(store, ValueError):
        await store.query_rollouts(sort_order="sideways")  # type: ignore[arg-type]
    with raises_store_error(store, ValueError):
        await store.query_workers(status_in=["idle"], filter_logic="xor")  # type: ignore[arg-type]
    with raises_store_error(store, ValueError, "sort"):
        await store.query_resources(sort_by="bogus")
    assert len(await store.query_rollouts()) == 1


async def test_query_attempts_and_unknown_rollouts(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    await store.start_attempt(started.rollout_id)
    desc = await store.query_attempts(started.rollout_id, sort_order="desc")
    assert [a.sequence_id for a in desc] == [2, 1]
    page = await store.query_attempts(started.rollout_id, limit=1, offset=1)
    assert [a.sequence_id for a in page] == [2] and page.total == 2
    assert len(await store.query_attempts("ro-unknown")) == 0
    assert await store.get_latest_attempt("ro-unknown") is None
    assert await store.get_rollout_by_id("ro-unknown") is None


# ---------------------------------------------------------------------------------------------------------------------
# Resources


async def test_resources_versioning_and_latest(store: LightningStore) -> None:
    assert await store.get_latest_resources() is None
    prompt = PromptTemplate(template="Answer {q}", engine="f-string")
    added = await store.add_resources({"prompt": prompt})
    assert re.fullmatch(r"rs-[0-9a-f]{12}", added.resources_id)
    assert added.version == 1 and added.create_time == added.update_time
    assert added.resources["prompt"] == prompt

    other = await store.add_resources({"llm": LLM(endpoint="http://x/v1", model="m")})
    assert (await store.get_latest_resources()) == other

    new_prompt = PromptTemplate(template="Solve {q}", engine="f-string")
    updated = await store.update_resources(added.resources_id, {"prompt": new_prompt})
    assert updated.version == 2
    assert updated.create_time == added.create_time and updated.update_time > added.update_time
    assert updated.resources["prompt"] == new_prompt
    latest = await store.get_latest_resources()
    assert latest is not None and latest.resources_id == added.resources_id

    created = await store.update_resources("rs-custom", {"prompt": prompt})
    assert created.version == 1 and created.resources_id == "rs-custom"
    assert (await store.get_latest_resources()) == created
    assert await store.get_resources_by_id(added.resources_id) == updated
    assert await store.get_resources_by_id("rs-unknown") is None

    assert {r.resources_id for r in await store.query_resources()} == {
        added.resources_id,
        other.resources_id,
        "rs-custom",
    }
    assert [r.resources_id for r in await store.query_resources(resources_id="rs-custom")] == ["rs-custom"]
    assert [r.resources_id for r in await store.query_resources(resources_id_contains="custom")] == ["rs-custom"]
    assert len(await store.query_resources(resources_id="rs-custom", resources_id_contains="zzz")) == 0
    by_time = await store.query_resources(sort_by="update_time", sort_order="desc", limit=1)
    assert [r.resources_id for r in by_time] == ["rs-custom"] and by_time.total == 3


# ---------------------------------------------------------------------------------------------------------------------
# Workers


async def test_update_worker_creates_and_keeps_status(store: LightningStore) -> None:
    worker = await store.update_worker("w-1", heartbeat_stats={"cpu": 0.1})
    assert worker.status == "unknown" and worker.heartbeat_stats == {"cpu": 0.1}
    assert worker.last_heartbeat_time is not None
    await store.enqueue_rollout("x")
    await claim(store, worker_id="w-1")
    again = await store.update_worker("w-1")
    assert again.status == "busy" and again.heartbeat_stats == {"cpu": 0.1}
    assert again.last_heartbeat_time is not None and again.last_heartbeat_time >= worker.last_heartbeat_time
    assert await store.get_worker_by_id("w-unknown") is None


async def test_empty_dequeue_marks_worker_idle(store: LightningStore) -> None:
    assert await store.dequeue_rollout(worker_id="w-1") is None
    worker = await store.get_worker_by_id("w-1")
    assert worker is not None and worker.status == "idle"
    assert worker.last_idle_time is not None and worker.last_dequeue_time is not None
    first_idle = worker.last_idle_time
    assert await store.dequeue_many_rollouts(limit=2, worker_id="w-1") == []
    again = await store.get_worker_by_id("w-1")
    assert again is not None and again.last_idle_time == first_idle  # already idle: only the dequeue time moves
    assert again.last_dequeue_time is not None and again.last_dequeue_time >= worker.last_dequeue_time


async def test_dequeue_many_marks_worker_busy_on_last_claim(store: LightningStore) -> None:
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(3)])
    claimed = await store.dequeue_many_rollouts(limit=2, worker_id="w-3")
    worker = await store.get_worker_by_id("w-3")
    assert worker is not None and worker.status == "busy"
    assert worker.current_rollout_id == claimed[-1].rollout_id
    assert worker.current_attempt_id == claimed[-1].attempt.attempt_id
    assert worker.last_dequeue_time is not None and worker.last_busy_time is not None


async def test_query_workers(store: LightningStore) -> None:
    await store.update_worker("alpha-1")
    await store.update_worker("beta-1")
    await store.dequeue_rollout(worker_id="alpha-2")
    assert [w.worker_id for w in await store.query_workers(status_in=["idle"])] == ["alpha-2"]
    assert [w.worker_id for w in await store.query_workers(worker_id_contains="alpha")] == ["alpha-1", "alpha-2"]
    either = await store.query_workers(status_in=["idle"], worker_id_contains="beta", filter_logic="or")
    assert {w.worker_id for w in either} == {"alpha-2", "beta-1"}
    desc = await store.query_workers(sort_by="worker_id", sort_order="desc")
    assert [w.worker_id for w in desc] == ["beta-1", "alpha-2", "alpha-1"]


# ---------------------------------------------------------------------------------------------------------------------
# Waiting and statistics


async def test_wait_for_rollouts_immediate_check(store: LightningStore) -> None:
    a = await store.enqueue_rollout("a")
    b = await store.enqueue_rollout("b")
    c = await store.enqueue_rollout("c")
    await store.update_rollout(c.rollout_id, status="succeeded")
    await store.update_rollout(a.rollout_id, status="failed")
    done = await store.wait_for_rollouts(
        rollout_ids=[c.rollout_id, "ro-unknown", b.rollout_id, a.rollout_id], timeout=0
    )
    assert [r.rollout_id for r in done] == [c.rollout_id, a.rollout_id]
    rollout = await store.get_rollout_by_id(b.rollout_id)
    assert rollout is not None and rollout.status == "queuing"  # waiting never mutates


async def test_wait_for_rollouts_wakes_when_rollout_finishes(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout("a")
    # The HTTP client refuses long blocking waits, so it polls with short timeouts.
    timeout = 0.1 if is_http(store) else 30.0

    async def finish_later() -> None:
        await asyncio.sleep(0.05)
        await store.update_rollout(rollout.rollout_id, status="succeeded")

    task = asyncio.create_task(finish_later())
    done: list[Rollout] = []
    for _ in range(300):
        done = await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=timeout)
        if done:
            break
    await task
    assert [r.status for r in done] == ["succeeded"]


async def test_statistics_counts(store: LightningStore) -> None:
    started = await store.start_rollout("x")
    await store.enqueue_rollout("y")
    await store.add_span(make_span(started.rollout_id, started.attempt.attempt_id, 1, "s"))
    await store.add_resources({"p": PromptTemplate(template="t", engine="f-string")})
    await store.update_worker("w")
    stats = await store.statistics()
    assert stats["total_rollouts"] == 2
    assert stats["total_attempts"] == 1
    assert stats["total_spans"] == 1
    assert stats["total_resources"] == 1
    assert stats["total_workers"] == 1
    assert stats["uptime"] >= 0
    assert isinstance(stats["name"], str)


async def test_add_otel_span_converts_and_allocates_sequence_ids(store: LightningStore) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    started = await store.start_rollout("x")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    tracer = TracerProvider().get_tracer("agentbolt-tests")
    with tracer.start_as_current_span("outer") as outer:
        outer.set_attribute("answer", 42)
        with tracer.start_as_current_span("inner") as inner:
            pass
    first = await store.add_otel_span(rid, aid, inner)  # type: ignore[arg-type]
    second = await store.add_otel_span(rid, aid, outer, sequence_id=7)  # type: ignore[arg-type]
    assert first is not None and second is not None
    assert first.sequence_id == 1 and first.name == "inner" and first.parent_id == second.span_id
    assert second.sequence_id == 7 and second.attributes == {"answer": 42}
    assert await store.get_next_span_sequence_id(rid, aid) == 8
    assert await store.add_otel_span(rid, aid, outer, sequence_id=9) is None  # same span id: duplicate
    assert [s.name for s in await store.query_spans(rid)] == ["inner", "outer"]
    rollout = await store.get_rollout_by_id(rid)
    assert rollout is not None and rollout.status == "running"


def test_store_package_import_is_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, agentbolt.store as s; "
        "assert s.InMemoryLightningStore and s.LightningStoreThreaded and s.CollectionBasedLightningStore; "
        "heavy = [m for m in ('fastapi', 'uvicorn', 'aiohttp', 'torch', 'transformers') if m in sys.modules]; "
        "print(heavy); "
        "print(s.LightningStoreClient.__name__, s.LightningStoreServer.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["[]", "LightningStoreClient LightningStoreServer"]


async def test_generic_store_over_memory_collections_with_snapshot_reads() -> None:
    from agentbolt.store.collection import InMemoryLightningCollections
    from agentbolt.store.collection_based import CollectionBasedLightningStore

    store = CollectionBasedLightningStore(InMemoryLightningCollections("thread"), read_snapshot=True)
    assert store.capabilities == {}
    rollout = await store.enqueue_rollout("x", config=RETRY_ON_FAILURE)
    claimed = await claim(store, worker_id="w")
    await send_span(store, rollout.rollout_id, claimed.attempt.attempt_id)
    await store.update_attempt(rollout.rollout_id, "latest", status="failed")
    retry = await claim(store)
    assert retry.attempt.sequence_id == 2
    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
    done = await store.wait_for_rollout(rollout.rollout_id, timeout=0)
    assert done is not None and done.status == "succeeded"
    stats = await store.statistics()
    assert stats["name"] == "CollectionBasedLightningStore" and stats["total_attempts"] == 2


async def test_spans_numbered_by_concurrent_calls_keep_the_order_of_their_ids(store: LightningStore) -> None:
    # A span sent again (a retry beside its first try) and the spans after it: however the calls interleave, the
    # stored sequence ids follow the spans' order, as each call issues its ids and stores its spans in one section.
    rollout = await store.start_rollout(input="x")
    rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    first, second, third = (make_span(rollout_id, attempt_id, 0, f"s{i}") for i in range(3))
    for _ in range(5):
        await asyncio.gather(
            store.add_spans_with_new_sequence_ids([first]),
            store.add_spans_with_new_sequence_ids([first, second, third]),
        )
    stored = await store.query_spans(rollout_id, sort_by="sequence_id")
    assert [span.span_id for span in stored] == ["s0", "s1", "s2"]
