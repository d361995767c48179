"""The store's HTTP API: routes, search forms, validation, errors, auth, CORS, limits, and the client's behaviour.

Every test runs a real LightningStoreServer on a free 127.0.0.1 port over a real SQLite file (or the in-memory
store) and talks to it with raw HTTP requests or the LightningStoreClient.
"""

from __future__ import annotations

import asyncio
import gc
import json
import pickle
import re
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List

import aiohttp
import pytest
from support.servers import free_port

from agentbolt.store.client_server import (
    API_KEY_ENV_VAR,
    LightningStoreClient,
    LightningStoreHTTPError,
    LightningStoreServer,
)
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, AttemptedRollout, Rollout

from .conftest import make_span

PREFIX = "/v1/agl"


class Served:
    """A running server, its store, a client and a raw HTTP session."""

    def __init__(self, server: LightningStoreServer, store: Any, client: LightningStoreClient, http: Any) -> None:
        self.server = server
        self.store = store
        self.client = client
        self.http: aiohttp.ClientSession = http
        self.base = server.endpoint

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.http.request(method, self.base + path, **kwargs) as response:
            body = await response.read()
            content_type = response.headers.get("content-type", "")
            return response.status, (await response.json() if "json" in content_type and body else body)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(SqliteLightningStore(tmp_path / "store.db")) as running:
        yield running


class serve:
    """Async context manager running a server (asyncio launch mode) around ``store``."""

    def __init__(self, store: Any, **server_kwargs: Any) -> None:
        self.store = store
        self.server_kwargs = server_kwargs
        self.client_kwargs: Dict[str, Any] = {"retry_delays": (), "health_retry_delays": ()}
        if "api_key" in server_kwargs:
            self.client_kwargs["api_key"] = server_kwargs["api_key"]

    async def __aenter__(self) -> Served:
        self.server = LightningStoreServer(
            self.store, "127.0.0.1", free_port(), launch_mode="asyncio", **self.server_kwargs
        )
        await self.server.start()
        self.client = LightningStoreClient(self.server.endpoint, **self.client_kwargs)
        self.http = aiohttp.ClientSession()
        return Served(self.server, self.store, self.client, self.http)

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.close()
        await self.client.close()
        await self.server.stop()
        close = getattr(self.store, "close", None)
        if close is not None:
            await close()


async def snapshot(store: Any) -> Dict[str, Any]:
    """Everything stored, for before/after comparisons."""
    rollouts = await store.query_rollouts()
    spans = {r.rollout_id: [s.model_dump() for s in await store.query_spans(r.rollout_id)] for r in rollouts}
    attempts = {r.rollout_id: [a.model_dump() for a in await store.query_attempts(r.rollout_id)] for r in rollouts}
    stats = dict(await store.statistics())
    stats.pop("uptime", None)
    return {
        "rollouts": [r.model_dump() for r in rollouts],
        "attempts": attempts,
        "spans": spans,
        "resources": [r.model_dump() for r in await store.query_resources()],
        "workers": [w.model_dump() for w in await store.query_workers()],
        "stats": stats,
    }


async def populate(store: Any) -> AttemptedRollout:
    """One running rollout with two spans, a queued rollout, resources and a worker."""
    await store.add_resources({"llm": LLM(endpoint="http://llm/v1", model="m")})
    await store.enqueue_rollout({"task": 1})
    await store.enqueue_rollout({"task": 2})
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None
    for i, span_id in enumerate(["s1", "s2"], start=1):
        await store.add_span(make_span(claimed.rollout_id, claimed.attempt.attempt_id, i, span_id))
    await store.update_worker("w1", {"cpu": 0.5})
    return claimed


# ---------------------------------------------------------------------------------------------------------------------
# Routes


async def test_health_and_openapi(served: Served) -> None:
    health = {"status": "ok", "server_id": served.server.server_id}
    assert await served.request("GET", PREFIX + "/health") == (200, health)
    assert await served.request("GET", "/health") == (200, health)
    status, schema = await served.request("GET", "/openapi.json")
    assert status == 200
    assert schema["info"]["title"] == "LightningStore Server"
    for path in (
        "/rollouts/search",
        "/queues/rollouts/enqueue",
        "/spans/batch",
        "/spans/next/batch",
        "/waits/rollouts",
    ):
        assert PREFIX + path in schema["paths"]
    body = schema["paths"][PREFIX + "/spans/batch"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/AddManySpansRequest"}
    # Every reference in the document resolves to a component.
    refs = set(re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"', json.dumps(schema)))
    assert {"Span", "AddManySpansRequest", "NamedResourcesBody"} <= refs <= set(schema["components"]["schemas"])


async def test_rollout_routes_round_trip(served: Served) -> None:
    status, created = await served.request(
        "POST", PREFIX + "/queues/rollouts/enqueue", json={"rollouts": [{"input": {"q": 1}, "mode": "train"}]}
    )
    assert status == 201 and created[0]["status"] == "queuing" and created[0]["mode"] == "train"
    status, many = await served.request(
        "POST", PREFIX + "/queues/rollouts/enqueue", json={"rollouts": [{"input": 2}, {"input": 3}]}
    )
    assert status == 201 and [r["input"] for r in many] == [2, 3]
    assert await served.request("POST", PREFIX + "/queues/rollouts/enqueue", json={"rollouts": []}) == (201, [])

    status, claimed = await served.request("POST", PREFIX + "/queues/rollouts/dequeue")
    assert status == 200 and claimed[0]["rollout_id"] == created[0]["rollout_id"]
    assert claimed[0]["attempt"]["sequence_id"] == 1
    status, claimed = await served.request("POST", PREFIX + "/queues/rollouts/dequeue", json={"limit": 5})
    assert [r["input"] for r in claimed] == [2, 3]
    assert await served.request("POST", PREFIX + "/queues/rollouts/dequeue", json={"limit": 0}) == (200, [])

    status, started = await served.request("POST", PREFIX + "/rollouts", json={"input": "x", "worker_id": "w9"})
    assert status == 201 and started["status"] == "preparing" and started["attempt"]["worker_id"] == "w9"
    rollout_id = started["rollout_id"]
    status, second = await served.request("POST", f"{PREFIX}/rollouts/{rollout_id}/attempts")
    assert status == 201 and second["attempt"]["sequence_id"] == 2

    status, latest = await served.request("GET", f"{PREFIX}/rollouts/{rollout_id}/attempts/latest")
    assert status == 200 and latest["attempt_id"] == second["attempt"]["attempt_id"]
    status, updated = await served.request(
        "POST", f"{PREFIX}/rollouts/{rollout_id}/attempts/latest", json={"status": "succeeded"}
    )
    assert status == 200 and updated["status"] == "succeeded"
    status, rollout = await served.request("GET", f"{PREFIX}/rollouts/{rollout_id}")
    assert status == 200 and rollout["status"] == "succeeded" and rollout["attempt"]["status"] == "succeeded"
    assert await served.request("GET", f"{PREFIX}/rollouts/ro-unknown") == (200, None)

    status, updated = await served.request(
        "POST", f"{PREFIX}/rollouts/{rollout_id}", json={"metadata": {"tag": "a"}, "mode": None}
    )
    assert status == 200 and updated["metadata"] == {"tag": "a"} and updated["mode"] is None
    assert updated["input"] == "x"  # absent fields are left alone

    status, waited = await served.request(
        "POST", PREFIX + "/waits/rollouts", json={"rollout_ids": [rollout_id, "ro-unknown"], "timeout": 0}
    )
    assert status == 200 and [r["rollout_id"] for r in waited] == [rollout_id]


async def test_search_forms_get_and_post_agree(served: Served) -> None:
    rollout = await populate(served.store)
    cases = [
        ("/rollouts", {"status_in": ["queuing", "preparing"], "sort_by": "rollout_id", "limit": "1", "offset": "1"}),
        ("/rollouts", {"rollout_id_contains": "ro-", "filter_logic": "or"}),
        ("/workers", {"status_in": ["busy"], "worker_id_contains": "w"}),
    ]
    for path, params in cases:
        query = [(k, v) for k, values in params.items() for v in (values if isinstance(values, list) else [values])]
        status_get, got = await served.request("GET", PREFIX + path, params=query)
        body = {k: (int(v) if k in ("limit", "offset") else v) for k, v in params.items()}
        status_post, posted = await served.request("POST", PREFIX + path + "/search", json=body)
        assert status_get == status_post == 200, (got, posted)
        assert got == posted
    status, page = await served.request(
        "GET", PREFIX + "/rollouts", params=[("status_in", "queuing"), ("status_in", "running"), ("limit", "1")]
    )
    assert page["total"] == 2 and len(page["items"]) == 1 and page["limit"] == 1

    status_get, spans_get = await served.request(
        "GET", PREFIX + "/spans", params={"rollout_id": rollout.rollout_id, "name_contains": "llm", "limit": "1"}
    )
    status_post, spans_post = await served.request(
        "POST", PREFIX + "/spans/search", json={"rollout_id": rollout.rollout_id, "name_contains": "llm", "limit": 1}
    )
    assert status_get == status_post == 200 and spans_get == spans_post
    assert spans_get["total"] == 2 and spans_get["items"][0]["span_id"] == "s1"

    status_get, attempts_get = await served.request("GET", f"{PREFIX}/rollouts/{rollout.rollout_id}/attempts")
    status_post, attempts_post = await served.request("POST", f"{PREFIX}/rollouts/{rollout.rollout_id}/attempts/search")
    assert status_get == status_post == 200 and attempts_get == attempts_post and attempts_get["total"] == 1

    status, resources = await served.request("GET", PREFIX + "/resources", params={"resources_id_contains": "rs-"})
    assert status == 200 and resources["total"] == 1


async def test_literal_routes_win_over_ids(served: Served) -> None:
    rollout_id = (await populate(served.store)).rollout_id
    before = await snapshot(served.store)
    status, found = await served.request("POST", PREFIX + "/rollouts/search", json={})
    assert status == 200 and found["total"] == 2
    status, found = await served.request("POST", f"{PREFIX}/rollouts/{rollout_id}/attempts/search", json={})
    assert status == 200 and found["total"] == 1
    status, latest = await served.request("GET", f"{PREFIX}/rollouts/{rollout_id}/attempts/latest")
    assert status == 200 and latest["sequence_id"] == 1
    status, latest = await served.request("GET", PREFIX + "/resources/latest")
    assert status == 200 and latest["resources"]["llm"]["model"] == "m"
    status, found = await served.request("POST", PREFIX + "/workers/search", json={})
    assert status == 200 and found["items"][0]["worker_id"] == "w1"
    status, found = await served.request("POST", PREFIX + "/spans/search", json={"rollout_id": rollout_id})
    assert status == 200 and found["total"] == 2
    status, next_id = await served.request(
        "POST", PREFIX + "/spans/next", json={"rollout_id": rollout_id, "attempt_id": latest["resources_id"]}
    )
    assert status == 200 and next_id == {"sequence_id": 3}
    after = await snapshot(served.store)
    assert after == before  # no route above was mistaken for an update


async def test_batch_extensions(served: Served) -> None:
    claimed = await populate(served.store)
    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
    ids = await served.client.get_many_span_sequence_ids([(rid, aid), (rid, aid), (rid, aid)])
    assert list(ids) == [3, 4, 5]
    spans = [make_span(rid, aid, seq, f"b{seq}") for seq in ids]
    duplicate = make_span(rid, aid, 6, "s1")  # same span id as an existing span
    inserted = await served.client.add_many_spans([spans[0], duplicate, spans[1], spans[2]])
    assert [s.span_id for s in inserted] == ["b3", "b4", "b5"]
    assert [s.span_id for s in await served.store.query_spans(rid)] == ["s1", "s2", "b3", "b4", "b5"]
    assert await served.client.add_many_spans([]) == []
    assert await served.client.get_many_span_sequence_ids([]) == []


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: clear 4xx, stored data untouched


PAGINATION_ERRORS = [
    ({"sort_by": "nope"}, "Invalid sort_by: nope, allowed fields are: "),
    ({"sort_order": "up"}, "Invalid sort_order"),
    ({"limit": 0}, "Limit must be greater than 0 or -1 for no limit"),
    ({"limit": -5}, "Limit must be greater than 0 or -1 for no limit"),
    ({"offset": -1}, "Offset must be greater than or equal to 0"),
    ({"filter_logic": "xor"}, "Invalid filter_logic"),
]


@pytest.mark.parametrize(("options", "message"), PAGINATION_ERRORS)
async def test_pagination_validation(served: Served, options: Dict[str, Any], message: str) -> None:
    claimed = await populate(served.store)
    before = await snapshot(served.store)
    rid = claimed.rollout_id
    targets = [("/rollouts", {}), ("/workers", {}), ("/spans", {"rollout_id": rid})]
    if "filter_logic" not in options:
        targets += [(f"/rollouts/{rid}/attempts", {}), ("/resources", {})]
    for path, base in targets:
        body = {**base, **options}
        if path != "/resources":
            status, answer = await served.request("POST", PREFIX + path + "/search", json=body)
            assert status == 400, (path, answer)
            assert answer["detail"].startswith(message)
        status, answer = await served.request("GET", PREFIX + path, params={k: str(v) for k, v in body.items()})
        assert status == 400, (path, answer)
        assert answer["detail"].startswith(message)
    assert await snapshot(served.store) == before


async def test_sort_by_error_lists_model_fields(served: Served) -> None:
    status, answer = await served.request("POST", PREFIX + "/rollouts/search", json={"sort_by": "bogus"})
    assert status == 400
    assert answer["detail"] == "Invalid sort_by: bogus, allowed fields are: " + ", ".join(Rollout.model_fields)


async def test_null_fields_are_rejected(served: Served) -> None:
    claimed = await populate(served.store)
    rid = claimed.rollout_id
    before = await snapshot(served.store)
    cases = [
        (f"/rollouts/{rid}", {"status": None}, "status"),
        (f"/rollouts/{rid}", {"config": None, "metadata": {"x": 1}}, "config"),
        (f"/rollouts/{rid}/attempts/latest", {"status": None}, "status"),
        (f"/rollouts/{rid}/attempts/latest", {"worker_id": None}, "worker_id"),
        (f"/rollouts/{rid}/attempts/latest", {"last_heartbeat_time": None}, "last_heartbeat_time"),
        ("/workers/w1", {"heartbeat_stats": None}, "heartbeat_stats"),
    ]
    for path, body, field in cases:
        status, answer = await served.request("POST", PREFIX + path, json=body)
        assert status == 400, (path, answer)
        assert answer["detail"] == f"{field} is invalid; it cannot be a null value."
    assert await snapshot(served.store) == before


BAD_REQUESTS = [
    # (method, path, kwargs, expected status)
    ("POST", "/queues/rollouts/enqueue", {"data": b"{not json", "headers": {"content-type": "application/json"}}, 422),
    ("POST", "/queues/rollouts/enqueue", {"json": {}}, 422),
    ("POST", "/queues/rollouts/enqueue", {"json": {"rollouts": "many"}}, 422),
    ("POST", "/queues/rollouts/enqueue", {"json": {"rollouts": [{"input": 1, "mode": "bogus"}]}}, 422),
    ("POST", "/queues/rollouts/enqueue", {"json": {"rollouts": [{"input": 1, "config": {"max_attempts": 0}}]}}, 422),
    ("POST", "/queues/rollouts/dequeue", {"json": {"limit": "three"}}, 422),
    ("POST", "/rollouts", {"json": {"mode": "train"}}, 422),
    ("POST", "/rollouts/{rid}", {"json": {"status": "exploded"}}, 422),
    ("POST", "/rollouts/{rid}", {"json": {"stauts": "cancelled"}}, 422),  # misspelt: not silently ignored
    ("POST", "/rollouts/{rid}/attempts/latest", {"json": {"worker": "w"}}, 422),
    ("POST", "/rollouts/{rid}/attempts/latest", {"json": {"last_heartbeat_time": "yesterday"}}, 422),
    ("POST", "/resources", {"json": {"llm": {"resource_type": "llm"}}}, 422),
    ("POST", "/resources", {"json": ["not", "a", "mapping"]}, 422),
    ("POST", "/spans", {"json": {"rollout_id": "x"}}, 422),
    ("POST", "/spans/batch", {"json": {"spans": [{"rollout_id": "x"}]}}, 422),
    ("POST", "/spans/batch", {"data": b"[[[", "headers": {"content-type": "application/json"}}, 422),
    ("POST", "/spans/next", {"json": {"rollout_id": "x"}}, 422),
    ("POST", "/waits/rollouts", {"json": {"rollout_ids": "ro-1"}}, 422),
    ("POST", "/workers/search", {"json": {"status_in": ["sleepy"]}}, 422),
    ("GET", "/rollouts", {"params": {"limit": "many"}}, 422),
    ("GET", "/spans", {}, 422),
    # unknown ids and invalid operations
    ("POST", "/rollouts/ro-missing/attempts", {}, 404),
    ("POST", "/rollouts/ro-missing", {"json": {"status": "failed"}}, 404),
    ("POST", "/rollouts/ro-missing/attempts/latest", {"json": {"status": "failed"}}, 404),
    ("POST", "/rollouts/{rid}/attempts/at-missing", {"json": {"status": "failed"}}, 404),
    ("POST", "/spans", {"json": "SPAN:ro-missing"}, 404),
    ("POST", "/spans/batch", {"json": "BATCH:ro-missing"}, 404),
    # values the store cannot handle: non-comparable sort keys, numbers beyond the database's range
    ("POST", "/rollouts/search", {"json": {"sort_by": "input"}}, 400),
    ("GET", "/rollouts", {"params": {"limit": str(10**30)}}, 400),
    ("POST", "/spans", {"json": "SPAN:huge-sequence"}, 422),
    ("POST", "/rollouts/search", {"json": {"sort_by": "metadata"}}, 400),
    ("GET", "/resources", {"params": {"sort_by": "resources"}}, 400),
    # NaN and negative time limits, which the watchdog could never apply (or would apply at once)
    ("POST", "/waits/rollouts", {"json": {"rollout_ids": ["{rid}"], "timeout": "NaN"}}, 400),
    ("POST", "/rollouts", {"json": {"input": 1, "config": {"timeout_seconds": "NaN"}}}, 400),
    ("POST", "/rollouts/{rid}", {"json": {"config": {"unresponsive_seconds": -5}}}, 400),
    ("POST", "/rollouts/{rid}/attempts/latest", {"json": {"last_heartbeat_time": "NaN"}}, 400),
    # JSON nested so deep that the answers holding it could not be read back
    (
        "POST",
        "/rollouts",
        {"data": b'{"input": ' + b"[" * 195 + b"]" * 195 + b"}", "headers": {"content-type": "application/json"}},
        422,
    ),
    ("GET", "/spans/next", {}, 405),  # a POST-only route
    # ids that would name a route
    ("POST", "/resources/search", {"json": {}}, 400),
    ("POST", "/resources/latest", {"json": {}}, 400),
    ("POST", "/queues/rollouts/dequeue", {"json": {"worker_id": "search"}}, 400),
    # other OTLP signals
    ("POST", "/v1/metrics", {"data": b""}, 501),
    ("POST", "/v1/logs", {"data": b""}, 501),
]


async def test_bad_requests_get_clear_errors_and_leave_data_intact(served: Served) -> None:
    claimed = await populate(served.store)
    rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
    before = await snapshot(served.store)
    for method, path, kwargs, expected in BAD_REQUESTS:
        kwargs = dict(kwargs)
        if kwargs.get("json") == "SPAN:ro-missing":
            kwargs["json"] = make_span("ro-missing", aid, 1, "zz").model_dump(mode="json")
        elif kwargs.get("json") == "SPAN:huge-sequence":  # the next id would not fit in 64 bits
            kwargs["json"] = {**make_span(rid, aid, 1, "zz").model_dump(mode="json"), "sequence_id": 2**63 - 1}
        elif isinstance(kwargs.get("json"), dict) and kwargs["json"].get("rollout_ids") == ["{rid}"]:
            kwargs["json"] = {**kwargs["json"], "rollout_ids": [rid]}
        elif kwargs.get("json") == "BATCH:ro-missing":
            kwargs["json"] = {"spans": [make_span("ro-missing", aid, 1, "zz").model_dump(mode="json")]}
        url = path.replace("{rid}", rid) if path.startswith("/v1/") else PREFIX + path.replace("{rid}", rid)
        status, answer = await served.request(method, url, **kwargs)
        assert status == expected, (method, path, status, answer)
        assert isinstance(answer, dict) and answer["detail"], (method, path, answer)
        assert answer["error_type"] and "error_kind" in answer, (method, path, answer)
    assert await snapshot(served.store) == before


async def test_request_size_limit(tmp_path: Path) -> None:
    async with serve(SqliteLightningStore(tmp_path / "s.db"), max_request_bytes=4096) as running:
        before = await snapshot(running.store)
        big = {"rollouts": [{"input": "x" * 5000}]}
        status, answer = await running.request("POST", PREFIX + "/queues/rollouts/enqueue", json=big)
        assert status == 413 and "too large" in answer["detail"] and answer["error_type"] == "RequestTooLarge"

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        status, answer = await running.request(
            "POST", PREFIX + "/queues/rollouts/enqueue", data=chunked(), headers={"content-type": "application/json"}
        )
        assert status == 413
        assert await snapshot(running.store) == before

        async def small_chunked() -> AsyncIterator[bytes]:
            yield b'{"rollouts": [{"input": '
            yield b'"ok"}]}'

        status, created = await running.request(
            "POST",
            PREFIX + "/queues/rollouts/enqueue",
            data=small_chunked(),
            headers={"content-type": "application/json"},
        )
        assert status == 201 and created[0]["input"] == "ok"


# ---------------------------------------------------------------------------------------------------------------------
# Auth and CORS


async def test_bearer_token(tmp_path: Path) -> None:
    async with serve(SqliteLightningStore(tmp_path / "s.db"), api_key="s3cret") as running:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, answer = await running.request("GET", PREFIX + "/statistics", headers=headers)
            assert status == 401 and "API key" in answer["detail"] and answer["error_type"] == "Unauthorized"
        status, _ = await running.request(
            "POST", PREFIX + "/queues/rollouts/enqueue", json={"rollouts": [{"input": 1}]}
        )
        assert status == 401
        assert (await running.request("GET", PREFIX + "/health"))[0] == 200
        status, stats = await running.request("GET", PREFIX + "/statistics", headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and stats["total_rollouts"] == 0

        # The configured client authenticates; one without the token gets a 401 it cannot mistake for "not found".
        assert (await running.client.enqueue_rollout(1)).status == "queuing"
        anonymous = LightningStoreClient(running.base, retry_delays=(), health_retry_delays=(), api_key="")
        try:
            with pytest.raises(LightningStoreHTTPError) as info:
                await anonymous.get_rollout_by_id("ro-x")
            assert info.value.status == 401
            with pytest.raises(LightningStoreHTTPError):
                await anonymous.dequeue_rollout()
        finally:
            await anonymous.close()
        assert (await running.store.statistics())["total_rollouts"] == 1


async def test_token_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV_VAR, "from-env")
    async with serve(SqliteLightningStore(tmp_path / "s.db")) as running:
        assert (await running.request("GET", PREFIX + "/statistics"))[0] == 401
        assert (await running.client.statistics())["total_rollouts"] == 0  # the client read the variable too


async def test_cors(tmp_path: Path) -> None:
    async with serve(SqliteLightningStore(tmp_path / "s.db"), cors_allow_origins=["http://ui.test", " "]) as running:
        async with running.http.options(
            running.base + PREFIX + "/rollouts/search",
            headers={"Origin": "http://ui.test", "Access-Control-Request-Method": "POST"},
        ) as response:
            assert response.status == 200
            assert response.headers["access-control-allow-origin"] == "http://ui.test"
            assert response.headers["access-control-allow-credentials"] == "true"
        async with running.http.get(running.base + PREFIX + "/health", headers={"Origin": "http://ui.test"}) as resp:
            assert resp.headers["access-control-allow-origin"] == "http://ui.test"
        async with running.http.get(running.base + PREFIX + "/health", headers={"Origin": "http://evil.test"}) as resp:
            assert "access-control-allow-origin" not in resp.headers
    async with serve(SqliteLightningStore(tmp_path / "t.db")) as running:
        status, _ = await running.request("GET", PREFIX + "/health", headers={"Origin": "http://ui.test"})
        assert status == 200
        async with running.http.get(running.base + PREFIX + "/health", headers={"Origin": "http://ui.test"}) as resp:
            assert "access-control-allow-origin" not in resp.headers


# ---------------------------------------------------------------------------------------------------------------------
# Client behaviour


async def test_client_surfaces_server_message(served: Served) -> None:
    with pytest.raises(ValueError, match="Rollout ro-missing not found") as info:
        await served.client.update_attempt("ro-missing", "latest", status="failed")
    assert isinstance(info.value, aiohttp.ClientResponseError)
    assert info.value.status == 404
    assert info.value.message == "Rollout ro-missing not found"
    with pytest.raises(LightningStoreHTTPError) as info:
        await served.client.query_rollouts(limit=0)
    assert info.value.status == 400 and "Limit must be greater than 0" in info.value.message
    assert await served.client.get_rollout_by_id("ro-missing") is None


async def test_client_retries_until_a_late_server_is_up(tmp_path: Path) -> None:
    port = free_port()
    store = SqliteLightningStore(tmp_path / "s.db")
    server = LightningStoreServer(store, "127.0.0.1", port, launch_mode="asyncio")
    client = LightningStoreClient(
        f"http://127.0.0.1:{port}", retry_delays=(0.2, 0.2, 0.2), health_retry_delays=(0.2,) * 15
    )
    try:
        request = asyncio.ensure_future(client.enqueue_rollout({"late": True}))
        await asyncio.sleep(0.3)
        assert not request.done()  # still retrying: nothing listens yet
        await server.start()
        rollout = await asyncio.wait_for(request, timeout=30)
        assert rollout.input == {"late": True}
        assert [r.rollout_id for r in await store.query_rollouts()] == [rollout.rollout_id]
    finally:
        await client.close()
        await server.stop()
        await store.close()


async def test_a_stopped_and_dropped_server_leaves_its_store_free_to_be_collected() -> None:
    # FastAPI caches route endpoints process-wide: endpoints holding their server kept every server and its store.
    store = InMemoryLightningStore()
    port = free_port()
    server = LightningStoreServer(store, "127.0.0.1", port, launch_mode="asyncio")
    await server.start()
    try:
        client = LightningStoreClient(f"http://127.0.0.1:{port}")
        try:
            rollout = await client.enqueue_rollout({"served": True})
            assert (await store.get_rollout_by_id(rollout.rollout_id)) is not None
        finally:
            await client.close()
    finally:
        await server.stop()
    dropped = weakref.ref(store)
    del server, store
    gc.collect()
    assert dropped() is None


async def test_client_gives_up_when_no_server_answers() -> None:
    client = LightningStoreClient(f"http://127.0.0.1:{free_port()}", retry_delays=(0.01,), health_retry_delays=(0.01,))
    try:
        with pytest.raises(aiohttp.ClientConnectorError):
            await client.statistics()
        assert await client.dequeue_rollout() is None  # dequeue never raises on transport errors
        assert await client.get_latest_resources() is None
    finally:
        await client.close()


async def test_client_refuses_long_waits_like_the_reference(served: Served) -> None:
    rollout = await served.client.start_rollout({"x": 1})
    with pytest.raises(ValueError, match="too long"):
        await served.client.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=0.5)
    assert await served.client.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=0.1) == []
    await served.client.update_attempt(rollout.rollout_id, "latest", status="succeeded")
    (done,) = await served.client.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=0)
    assert done.status == "succeeded"


async def test_client_long_wait_spans_server_slices(served: Served) -> None:
    client = LightningStoreClient(served.base, retry_delays=(), health_retry_delays=(), long_waits=True)
    client.wait_slice_seconds = 0.1
    try:
        rollout = await client.start_rollout({"x": 1})

        async def finish_later() -> None:
            await asyncio.sleep(0.5)
            await client.update_attempt(rollout.rollout_id, "latest", status="succeeded")

        finisher = asyncio.ensure_future(finish_later())
        done = await client.wait_for_rollouts(rollout_ids=[rollout.rollout_id, "ro-missing"], timeout=20)
        await finisher
        assert [r.rollout_id for r in done] == [rollout.rollout_id]
        assert done[0].status == "succeeded"
        # A deadline shorter than the work returns what finished so far.
        other = await client.start_rollout({"x": 2})
        assert await client.wait_for_rollouts(rollout_ids=[other.rollout_id], timeout=0.3) == []
    finally:
        await client.close()


async def test_client_and_server_pickle(served: Served) -> None:
    await served.client.enqueue_rollout("before")
    client: LightningStoreClient = pickle.loads(pickle.dumps(served.client))
    try:
        assert (await client.statistics())["total_rollouts"] == 1
    finally:
        await client.close()
    copy: LightningStoreServer = pickle.loads(pickle.dumps(served.server))
    assert copy.store is None and copy.app is None
    assert copy.endpoint == served.server.endpoint
    # Without the wrapped store, the copy reaches the original server over HTTP.
    rollout = await copy.enqueue_rollout("through the copy")
    assert (await served.store.get_rollout_by_id(rollout.rollout_id)) is not None
    with pytest.raises(RuntimeError, match="unpickled"):
        await copy.start()
    await copy.stop()  # closes the copy's client only
    assert served.server.is_running()
    other: LightningStoreServer = pickle.loads(pickle.dumps(served.server))
    assert other._cors_origins == copy._cors_origins == [] and other._cors_origins is not copy._cors_origins


async def test_server_delegates_in_process_and_reports_endpoints(served: Served) -> None:
    rollout = await served.server.enqueue_rollout({"direct": True})
    assert (await served.client.get_rollout_by_id(rollout.rollout_id)) == rollout
    assert served.server.otlp_traces_endpoint() == served.server.endpoint + "/v1/traces"
    assert served.client.otlp_traces_endpoint() == served.server.endpoint + "/v1/traces"
    assert all(served.server.capabilities.values()) and all(served.client.capabilities.values())


async def test_server_constructor_checks() -> None:
    class NotAsyncSafe(InMemoryLightningStore):
        @property
        def capabilities(self) -> Any:
            return {"async_safe": False}

    with pytest.raises(ValueError, match="not async-safe"):
        LightningStoreServer(NotAsyncSafe(), "127.0.0.1", free_port())
    with pytest.raises(ValueError, match=r"^The store does not support zero-copy\."):
        LightningStoreServer(InMemoryLightningStore(), "127.0.0.1", free_port(), launch_mode="mp")
    from agentbolt.utils.server_launcher import PythonServerLauncherArgs

    with pytest.raises(ValueError, match="launcher_args"):
        LightningStoreServer(InMemoryLightningStore(), port=1234, launcher_args=PythonServerLauncherArgs(port=1))


async def test_thread_mode_serves_a_non_thread_safe_store() -> None:
    store = InMemoryLightningStore()  # asyncio locks only: the server serializes access from its thread
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="thread")
    await server.start()
    client = LightningStoreClient(server.endpoint, retry_delays=(), health_retry_delays=())
    try:
        created = await asyncio.gather(*(client.enqueue_rollout(i) for i in range(20)))
        direct = await asyncio.gather(*(server.enqueue_rollout(100 + i) for i in range(20)))
        claimed = await client.dequeue_many_rollouts(limit=100)
        assert len(claimed) == 40
        assert {r.rollout_id for r in claimed} == {r.rollout_id for r in [*created, *direct]}
    finally:
        await client.close()
        await server.stop()
    assert not server.is_running()


async def test_port_in_use_is_a_clear_error(served: Served) -> None:
    port = int(served.server.endpoint.rsplit(":", 1)[1])
    other = LightningStoreServer(InMemoryLightningStore(), "127.0.0.1", port, launch_mode="asyncio")
    with pytest.raises(RuntimeError, match="did not start up within") as info:
        await other.start()
    assert isinstance(info.value.__cause__, OSError)
    assert (await served.client.statistics())["name"] == "SqliteLightningStore"


async def test_client_retries_server_errors(tmp_path: Path) -> None:
    class FlakyStatistics(InMemoryLightningStore):
        """Fails its first ``statistics`` call with an unexpected error (a stand-in for a transient server bug)."""

        failures = 1

        async def statistics(self) -> Any:
            if self.failures:
                self.failures -= 1
                raise ZeroDivisionError("transient")
            return await super().statistics()

    async with serve(FlakyStatistics()) as running:
        status, answer = await running.request("GET", PREFIX + "/statistics")
        assert status == 500 and answer == {
            "detail": "transient",
            "error_type": "ZeroDivisionError",
            "error_kind": "ZeroDivisionError",
        }
        running.store.failures = 1
        client = LightningStoreClient(running.base, retry_delays=(0.01,), health_retry_delays=(0.01,))
        try:
            assert (await client.statistics())["name"] == "FlakyStatistics"  # the retry succeeded
            running.store.failures = 2
            with pytest.raises(LightningStoreHTTPError) as info:
                await client.statistics()
            assert info.value.status == 500 and info.value.message == "transient"
        finally:
            await client.close()


async def test_http_metrics_and_prometheus_endpoint(tmp_path: Path) -> None:
    from agentbolt.utils.metrics import PrometheusMetricsBackend

    async with serve(SqliteLightningStore(tmp_path / "s.db"), tracker=PrometheusMetricsBackend()) as running:
        rollout = await running.client.enqueue_rollout(1)
        await running.client.get_rollout_by_id(rollout.rollout_id)
        status, text = await running.request("GET", "/v1/prometheus/")
        assert status == 200
        text = text.decode() if isinstance(text, bytes) else text
        assert 'path="/v1/agl/rollouts/{rollout_id}"' in text
        assert 'path="/v1/agl/queues/rollouts/enqueue"' in text and "agl_http_total" in text
        status, text = await running.request("GET", "/v1/prometheus")  # without the slash: redirected
        assert status == 200 and "agl_http_total" in (text.decode() if isinstance(text, bytes) else text)


async def test_a_session_whose_event_loop_is_gone_is_closed(served: Served) -> None:
    """close() from another loop closes the connector of a session whose loop has finished, awaiting aiohttp's
    close (a coroutine in recent aiohttp) instead of leaving it never awaited."""
    client = LightningStoreClient(served.server.endpoint, retry_delays=(), health_retry_delays=())
    loops: list[asyncio.AbstractEventLoop] = []

    def on_its_own_loop() -> Dict[str, Any]:
        loop = asyncio.new_event_loop()
        loops.append(loop)  # held, so that the client's session of this loop stays known to it
        try:
            return dict(loop.run_until_complete(client.statistics()))
        finally:
            loop.close()

    assert "total_rollouts" in await asyncio.to_thread(on_its_own_loop)
    connector = client._sessions[loops[0]].connector
    assert connector is not None and not connector.closed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await client.close()
        gc.collect()
    assert connector.closed
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_sessions_of_finished_event_loops_are_closed_not_dropped(served: Served) -> None:
    """A client used under ``asyncio.run`` several times (a loop each, not kept by the caller) closes the sessions of
    the finished loops at its next call from another loop: none is left for the collector to find open."""
    client = LightningStoreClient(served.server.endpoint, retry_delays=(), health_retry_delays=())

    def under_asyncio_run() -> int:
        return len(asyncio.run(client.query_rollouts()))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert await asyncio.to_thread(under_asyncio_run) == 0
        old_connectors = [session.connector for session in client._sessions.values()]
        gc.collect()
        assert len(await client.query_rollouts()) == 0  # from this loop: the finished loops' sessions are released
        assert list(client._sessions) == [asyncio.get_running_loop()]
        assert all(connector is not None and connector.closed for connector in old_connectors)
        await client.close()
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message) or "never awaited" in str(w.message)]


async def test_values_json_cannot_carry_are_answered_with_replacement_characters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An in-memory store keeps strings with lone surrogates written in its process; readers over HTTP still get them."""
    store = InMemoryLightningStore()
    async with serve(store) as served:
        rollout = await store.start_rollout({"path": "out\udcff.txt"})
        span = make_span(rollout.rollout_id, rollout.attempt.attempt_id, 1, "s1")
        await store.add_span(span.model_copy(update={"attributes": {"tool.output": "half \ud83d"}}))

        spans = await served.client.query_spans(rollout.rollout_id)
        assert [s.attributes["tool.output"] for s in spans] == ["half \ufffd"]
        read = await served.client.get_rollout_by_id(rollout.rollout_id)
        assert read is not None and read.input == {"path": "out\ufffd.txt"}
        assert "lone surrogates" in caplog.text
        # What the store holds is unchanged.
        assert (await store.query_spans(rollout.rollout_id))[0].attributes["tool.output"] == "half \ud83d"


async def test_ids_holding_a_slash_are_addressable(served: Served) -> None:
    client = served.client
    claimed = await client.start_rollout(input="x", worker_id="host/gpu0")
    worker = await client.get_worker_by_id("host/gpu0")
    assert worker is not None and worker.current_rollout_id == claimed.rollout_id
    assert (await client.update_worker("host/gpu0", {"gpu": 1})).heartbeat_stats == {"gpu": 1}
    snapshot = await client.update_resources("a/b", {"llm": LLM(endpoint="http://x", model="m")})
    assert (await client.get_resources_by_id("a/b")) == snapshot


async def test_ids_that_name_a_route_are_refused_everywhere(served: Served) -> None:
    for store in (served.store, served.client):
        with pytest.raises(ValueError, match="word of the store's routes"):
            await store.update_resources("latest", {"llm": LLM(endpoint="http://x", model="m")})
        with pytest.raises(ValueError, match="word of the store's routes"):
            await store.update_worker("search", {})
        with pytest.raises(ValueError, match="word of the store's routes"):
            await store.start_rollout(input=1, worker_id="search")
    assert await served.client.get_worker_by_id("search") is None
    assert await served.client.get_resources_by_id("latest") is None


async def test_wait_arguments_are_checked_by_store_and_client(served: Served) -> None:
    rollout = await served.client.start_rollout(input="x")
    for store in (served.store, served.client):
        with pytest.raises(TypeError, match="wrap it in a list"):
            await store.wait_for_rollouts(rollout_ids=rollout.rollout_id, timeout=0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be None or a number"):
            await store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=float("nan"))


async def test_a_client_that_goes_away_ends_its_wait(served: Served) -> None:
    rollout = await served.client.start_rollout(input="x")
    url = served.base + PREFIX + "/waits/rollouts"
    for _ in range(5):
        with pytest.raises(asyncio.TimeoutError):
            await served.http.post(
                url, json={"rollout_ids": [rollout.rollout_id]}, timeout=aiohttp.ClientTimeout(total=0.3)
            )
    for _ in range(50):  # the server notices each disconnection and cancels that wait
        if not served.store._waiters:
            break
        await asyncio.sleep(0.1)
    assert not served.store._waiters


async def test_values_nested_near_the_parser_limit_are_refused_or_read_back(served: Served) -> None:
    depth = 185
    deep: Any = 1
    for _ in range(depth):
        deep = [deep]
    enqueued = await served.client.enqueue_rollout(input=deep)
    assert (await served.client.query_rollouts()).items[0].input == deep
    assert (await served.client.dequeue_rollout(worker_id="w")).rollout_id == enqueued.rollout_id  # type: ignore[union-attr]
    for _ in range(10):
        deep = [deep]
    with pytest.raises(LightningStoreHTTPError, match="nested more than"):
        await served.client.enqueue_rollout(input=deep)


async def test_a_thread_opening_its_session_while_another_collects_stale_ones_fails_neither(served: Served) -> None:
    """The client is shared by threads with event loops of their own: one of them opening its session while another
    walks the sessions (to close those of finished loops) used to fail the walk with "dictionary changed size
    during iteration", so the call raised, or a read answered a wrong "not found"."""
    client = LightningStoreClient(served.server.endpoint, retry_delays=(), health_retry_delays=())
    answers: List[int] = []

    def other_thread() -> None:
        answers.append(len(asyncio.run(client.query_rollouts())))

    other = threading.Thread(target=other_thread)

    class WalkedLoop:
        """A stand-in for a loop the walk asks about: while it is asked, the other thread opens its session."""

        def is_closed(self) -> bool:
            if not other.is_alive() and other.ident is None:
                other.start()
                deadline = time.monotonic() + 0.5
                while len(client._sessions) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
            return False

    class ClosedSession:
        closed = True

    client._sessions[WalkedLoop()] = ClosedSession()  # type: ignore[index,assignment]
    try:
        assert len(await client.query_rollouts()) == 0
        await asyncio.to_thread(other.join, 10)
        assert answers == [0]
    finally:
        await client.close()
