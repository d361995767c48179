"""A duplicate span (contract §4.2, §4.7) is skipped with a warning: ``add_span`` returns None, HTTP answers ``null``."""

from __future__ import annotations

import logging
from typing import List

import aiohttp
import pytest
from support.servers import free_port

from agentbolt.store.base import LightningStore
from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from store.conftest import make_span


def _duplicate_warnings(caplog: pytest.LogCaptureFixture, span_id: str) -> List[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("agentbolt.store") and r.levelno == logging.WARNING and span_id in r.getMessage()
    ]


async def test_duplicate_span_returns_none_and_is_logged(
    store: LightningStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    started = await store.start_rollout("x")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    span = make_span(rid, aid, 1, "dup-span")
    assert await store.add_span(span) == span
    assert _duplicate_warnings(caplog, "dup-span") == []
    assert await store.add_span(span) is None
    (message,) = _duplicate_warnings(caplog, "dup-span")
    assert rid in message and aid in message
    assert len(await store.query_spans(rid)) == 1


async def test_duplicates_in_a_batch_are_skipped_and_logged(
    store: LightningStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    started = await store.start_rollout("x")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    first = make_span(rid, aid, 1, "batch-dup")
    await store.add_span(first)
    added = await store.add_many_spans([make_span(rid, aid, 2, "fresh"), first])
    assert [s.span_id for s in added] == ["fresh"]
    assert _duplicate_warnings(caplog, "batch-dup")


async def test_http_route_answers_null_for_a_duplicate() -> None:
    inner = InMemoryLightningStore(thread_safe=True)
    server = LightningStoreServer(inner, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        started = await inner.start_rollout("x")
        body = make_span(started.rollout_id, started.attempt.attempt_id, 1, "http-dup").model_dump_json()
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:
            statuses, texts = [], []
            for _ in range(2):
                async with session.post(f"{server.endpoint}/v1/agl/spans", data=body, headers=headers) as response:
                    statuses.append(response.status)
                    texts.append(await response.text())
        assert statuses == [201, 201]
        assert '"span_id":"http-dup"' in texts[0]
        assert texts[1] == "null"
    finally:
        await server.stop()
