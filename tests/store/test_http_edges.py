"""The store's HTTP API at its edges: content types, ids that look like path steps, and metrics labels that clients
cannot multiply.

Every test runs a real LightningStoreServer on a free 127.0.0.1 port and talks to it with raw HTTP requests or the
LightningStoreClient.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM

from .test_http import PREFIX, Served, populate, serve, snapshot


@pytest.fixture
async def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with serve(SqliteLightningStore(tmp_path / "store.db")) as running:
        yield running


ENQUEUE = PREFIX + "/queues/rollouts/enqueue"
ENQUEUE_BODY = b'{"rollouts": [{"input": "from a page"}]}'


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
async def test_bodies_declared_as_text_or_forms_are_refused(served: Served, content_type: str) -> None:
    await populate(served.store)
    before = await snapshot(served.store)
    for path in (ENQUEUE, PREFIX + "/resources", PREFIX + "/rollouts/search"):
        status, answer = await served.request("POST", path, data=ENQUEUE_BODY, headers={"content-type": content_type})
        assert status == 415, (path, answer)
        assert "Content-Type" in answer["detail"] and "application/json" in answer["detail"]
        assert answer["error_type"] and answer["error_kind"] == "ValueError"
    assert await snapshot(served.store) == before


async def test_json_bodies_are_read_with_or_without_a_content_type(served: Served) -> None:
    for headers in (
        {"content-type": "application/json"},
        {"content-type": "Application/JSON; charset=utf-8"},
        {"content-type": "application/vnd.api+json"},
    ):
        status, created = await served.request("POST", ENQUEUE, data=ENQUEUE_BODY, headers=headers)
        assert status == 201 and created[0]["input"] == "from a page", headers
    async with served.http.post(served.base + ENQUEUE, data=ENQUEUE_BODY, skip_auto_headers=["Content-Type"]) as r:
        assert r.status == 201 and "content-type" not in r.request_info.headers
    # An optional body left empty needs no content type of its own.
    status, claimed = await served.request(
        "POST", PREFIX + "/queues/rollouts/dequeue", headers={"content-type": "text/plain"}
    )
    assert status == 200 and len(claimed) == 1


async def test_dot_ids_are_addressable_over_http(served: Served) -> None:
    client = served.client
    for worker_id in (".", ".."):
        worker = await client.update_worker(worker_id, {"gpu": 1})
        assert worker.worker_id == worker_id
        read = await client.get_worker_by_id(worker_id)
        assert read is not None and read.worker_id == worker_id
    for resources_id in (".", ".."):
        snapshot_ = await client.update_resources(resources_id, {"llm": LLM(endpoint="http://x", model="m")})
        assert snapshot_.resources_id == resources_id
        assert await client.get_resources_by_id(resources_id) == snapshot_
    assert sorted(w.worker_id for w in await served.store.query_workers()) == [".", ".."]


async def test_metrics_path_labels_are_bounded_by_the_routes(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from agentbolt.utils.metrics import PrometheusMetricsBackend

    registry = CollectorRegistry()  # the global one may hold another test server's series
    tracker = PrometheusMetricsBackend(registry=registry)
    async with serve(InMemoryLightningStore(thread_safe=True), tracker=tracker) as running:
        made_up = [uuid.uuid4().hex for _ in range(5)]
        for word in made_up:
            await running.request("GET", f"{PREFIX}/{word}")
            await running.request("POST", f"/v1/{word}/x", json={})
            await running.request("GET", f"/page-{word}")
        await running.client.update_worker("host/gpu0", {})
        rollout = await running.client.enqueue_rollout(1)
        await running.client.get_rollout_by_id(rollout.rollout_id)
        status, _ = await running.request("GET", "/v1/prometheus/")
        assert status == 200

    text = generate_latest(registry).decode()
    assert not [word for word in made_up if word in text]
    assert 'path="{unmatched}"' in text and 'path="{dashboard_page}"' in text
    assert 'path="/v1/agl/rollouts/{rollout_id}"' in text
    assert 'path="/v1/agl/workers/{worker_id}"' in text and "gpu0" not in text
    assert 'path="/v1/agl/queues/rollouts/enqueue"' in text and 'path="/v1/prometheus/"' in text


async def test_metrics_method_labels_are_bounded(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from agentbolt.utils.metrics import PrometheusMetricsBackend

    registry = CollectorRegistry()
    tracker = PrometheusMetricsBackend(registry=registry)
    unusual = ["PROPFIND", "MKCOL", "PURGE", "LOCK", "SEARCH"]
    async with serve(InMemoryLightningStore(thread_safe=True), tracker=tracker) as running:
        for method in unusual:
            status, _ = await running.request(method, f"{PREFIX}/health")
            assert status == 405
        await running.request("GET", f"{PREFIX}/health")

    text = generate_latest(registry).decode()
    assert not [method for method in unusual if f'method="{method}"' in text]
    assert f'agl_http_total{{method="OTHER",path="{PREFIX}/health",status="405"}} 5.0' in text
    assert 'method="GET"' in text
