"""add_spans_with_new_sequence_ids: the store issues the ids and stores the spans, over HTTP in one request."""

from __future__ import annotations

from pathlib import Path

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore

from .conftest import make_span
from .test_http import PREFIX, serve, snapshot


async def test_in_process_store_issues_ids_in_order() -> None:
    store = InMemoryLightningStore()
    rollout = await store.start_rollout(input={"task": "t"})
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
    first = await store.get_next_span_sequence_id(rid, aid)
    spans = [make_span(rid, aid, 0, f"{i:016x}") for i in range(1, 4)]
    stored = await store.add_spans_with_new_sequence_ids(spans)
    assert [span.sequence_id for span in stored] == [first + 1, first + 2, first + 3]
    assert await store.add_spans_with_new_sequence_ids([]) == []


async def test_one_request_issues_ids_and_skips_spans_already_stored(tmp_path: Path) -> None:
    async with serve(SqliteLightningStore(tmp_path / "store.db")) as served:
        rollout = await served.client.start_rollout(input={"task": "t"})
        rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
        spans = [make_span(rid, aid, 0, f"{i:016x}", name=f"s{i}") for i in range(1, 4)]
        stored = await served.client.add_spans_with_new_sequence_ids(spans)
        assert [(span.name, span.sequence_id) for span in stored] == [("s1", 1), ("s2", 2), ("s3", 3)]
        # Resending (as after a lost answer) stores nothing twice; a new span gets the next free id.
        again = await served.client.add_spans_with_new_sequence_ids([*spans, make_span(rid, aid, 0, "f" * 16)])
        assert [span.span_id for span in again] == ["f" * 16]
        listed = await served.store.query_spans(rid, sort_by="sequence_id")
        assert [span.span_id for span in listed] == [*(f"{i:016x}" for i in range(1, 4)), "f" * 16]
        assert listed[-1].sequence_id > 3


async def test_invalid_body_is_rejected_and_leaves_the_store_intact(tmp_path: Path) -> None:
    async with serve(SqliteLightningStore(tmp_path / "store.db")) as served:
        await served.client.start_rollout(input={"task": "t"})
        before = await snapshot(served.store)
        status, body = await served.request("POST", PREFIX + "/spans/batch/sequenced", json={"spans": [{"name": 1}]})
        assert status == 422 and "spans" in str(body)
        assert await snapshot(served.store) == before
