"""Training metrics in the store (``add_metrics`` / ``query_metrics``, ``/v1/agl/metrics``), on every backend."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import httpx
import pytest
from support.servers import free_port

from agentbolt.store.base import LightningStore
from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import MetricsRecord


def _record(run: str, step: int, **values: float) -> MetricsRecord:
    return MetricsRecord(run_id=run, step=step, time=1000.0 + step, values=values)


async def test_metrics_are_stored_in_order_and_filtered_by_run(store: LightningStore) -> None:
    await store.add_metrics([_record("a", 0, **{"val/accuracy": 0.25}), _record("a", 1, **{"train/reward_mean": 0.5})])
    await store.add_metrics([_record("b", 1, loss=2.0)])

    everything = await store.query_metrics()
    assert [(r.run_id, r.step) for r in everything] == [("a", 0), ("a", 1), ("b", 1)]
    only_a = await store.query_metrics(run_id="a")
    assert [r.values for r in only_a] == [{"val/accuracy": 0.25}, {"train/reward_mean": 0.5}]
    page = await store.query_metrics(limit=1, offset=1)
    assert [(r.run_id, r.step) for r in page] == [("a", 1)]
    assert getattr(page, "total", None) == 3
    assert list(await store.query_metrics(run_id="nobody")) == []


async def test_a_step_written_again_replaces_the_stored_one(store: LightningStore) -> None:
    await store.add_metrics([_record("run", 3, loss=1.0)])
    await store.add_metrics([_record("run", 3, loss=0.5, kl=0.1)])

    (only,) = await store.query_metrics(run_id="run")
    assert only.values == {"loss": 0.5, "kl": 0.1}


async def test_non_finite_values_are_stored_as_none(store: LightningStore) -> None:
    await store.add_metrics([_record("run", 1, loss=math.nan, kl=math.inf, ok=1.0)])

    (only,) = await store.query_metrics()
    assert only.values == {"loss": None, "kl": None, "ok": 1.0}


async def test_writing_no_record_is_a_no_op(store: LightningStore) -> None:
    assert list(await store.add_metrics([])) == []
    assert list(await store.query_metrics()) == []


async def test_metrics_survive_a_restart_of_a_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteLightningStore(str(path))
    await store.add_metrics([_record("run", 1, loss=1.5)])
    await store.close()

    reopened = SqliteLightningStore(str(path))
    try:
        assert [r.values for r in await reopened.query_metrics()] == [{"loss": 1.5}]
    finally:
        await reopened.close()


async def test_a_store_file_written_before_metrics_existed_gains_the_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = SqliteLightningStore(str(path))
    rollout = await store.enqueue_rollout(input={"q": 1})
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE metrics")

    reopened = SqliteLightningStore(str(path))
    try:
        assert await reopened.get_rollout_by_id(rollout.rollout_id) is not None
        await reopened.add_metrics([_record("run", 1, loss=1.0)])
        assert len(await reopened.query_metrics()) == 1
    finally:
        await reopened.close()


async def test_the_http_route_rejects_malformed_records_and_keeps_stored_ones() -> None:
    inner = InMemoryLightningStore(thread_safe=True)
    server = LightningStoreServer(inner, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        await inner.add_metrics([_record("run", 1, loss=1.0)])
        async with httpx.AsyncClient(base_url=server.endpoint) as http:
            bad_step = await http.post("/v1/agl/metrics", json={"records": [{"run_id": "r", "step": -1, "time": 0}]})
            not_json = await http.post("/v1/agl/metrics", content=b"{", headers={"content-type": "application/json"})
            no_run = await http.post("/v1/agl/metrics", json={"records": [{"step": 1, "time": 0}]})
            # A NaN time was stored as null, and every later read of the run failed validation.
            nan_time = await http.post(
                "/v1/agl/metrics", json={"records": [{"run_id": "run", "step": 2, "time": "NaN"}]}
            )
            huge_step = await http.post(
                "/v1/agl/metrics", json={"records": [{"run_id": "r", "step": 2**63, "time": 0}]}
            )
            zero_limit = await http.get("/v1/agl/metrics", params={"limit": 0})
            listed = await http.get("/v1/agl/metrics")
        assert bad_step.status_code == 422 and "step" in bad_step.text
        assert not_json.status_code == 422
        assert no_run.status_code == 422 and "run_id" in no_run.text
        assert nan_time.status_code == 422 and "time" in nan_time.text
        assert huge_step.status_code == 422 and "step" in huge_step.text
        assert zero_limit.status_code == 400
        assert listed.json()["total"] == 1 and listed.json()["items"][0]["values"] == {"loss": 1.0}
    finally:
        await server.stop()


class _NoMetricsStore(InMemoryLightningStore):
    """A store that does not keep training metrics (like a backend without the table)."""

    async def add_metrics(self, records):  # type: ignore[no-untyped-def, override]
        return await LightningStore.add_metrics(self, records)

    async def query_metrics(self, *, run_id=None, limit=-1, offset=0):  # type: ignore[no-untyped-def, override]
        return await LightningStore.query_metrics(self, run_id=run_id, limit=limit, offset=offset)


async def test_a_store_without_metrics_answers_501_naming_it() -> None:
    server = LightningStoreServer(_NoMetricsStore(thread_safe=True), host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint) as http:
            answer = await http.get("/v1/agl/metrics")
        assert answer.status_code == 501
        assert "does not keep training metrics" in answer.json()["detail"]
    finally:
        await server.stop()


def test_a_record_needs_a_run_and_a_non_negative_step() -> None:
    with pytest.raises(ValueError, match="run_id"):
        MetricsRecord(run_id="", step=1, time=0.0)
    with pytest.raises(ValueError, match="step"):
        MetricsRecord(run_id="r", step=-1, time=0.0)
    with pytest.raises(ValueError, match="time"):
        MetricsRecord(run_id="r", step=1, time=float("nan"))
