"""Training metric values are JSON numbers: the Training page's ``/v1/agl/metrics`` route takes no string or boolean
for one, and reading never turns one into a number.

A real store server on 127.0.0.1 serves a real SQLite store file; requests are real HTTP requests.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Tuple

import httpx
import orjson
import pytest
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import MetricsRecord


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Tuple[httpx.AsyncClient, Path]]:
    path = tmp_path / "store.db"
    server = LightningStoreServer(SqliteLightningStore(path), host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl") as http:
            yield http, path
    finally:
        await server.stop()


def _record(step: int, values: Dict[str, Any], **fields: Any) -> Dict[str, Any]:
    return {"run_id": "run", "step": step, "time": 1000.0 + step, "values": values, **fields}


def _locations(answer: httpx.Response) -> List[List[Any]]:
    return [error["loc"] for error in answer.json()["detail"]]


@pytest.mark.parametrize("value", ["1.5", "NaN", "", True, False, [1.0], {"mean": 1.0}])
async def test_a_value_that_is_not_a_number_is_refused_naming_the_metric(served: Any, value: Any) -> None:
    http, _ = served
    body = {"records": [_record(1, {"loss": 0.5}), _record(2, {"ok": 1.0, "train/reward": value})]}
    answer = await http.post("/metrics", json=body)

    assert answer.status_code == 422, answer.text
    assert _locations(answer) == [["body", "records", 1, "values", "train/reward"]]
    assert (await http.get("/metrics")).json()["total"] == 0  # nothing of the request was stored


async def test_a_time_that_is_not_a_number_is_refused(served: Any) -> None:
    http, _ = served
    for value in ("1000.5", True):
        answer = await http.post("/metrics", json={"records": [_record(1, {"loss": 0.5}, time=value)]})
        assert answer.status_code == 422, answer.text
        assert _locations(answer) == [["body", "records", 0, "time"]]


async def test_integers_floats_and_null_are_stored_and_read_back_as_numbers(served: Any) -> None:
    http, _ = served
    values = {"count": 3, "loss": 0.25, "big": 2**60, "negative": -1e-9, "missing": None}
    answer = await http.post("/metrics", json={"records": [_record(1, values)]})
    assert answer.status_code == 201, answer.text

    listed = await http.get("/metrics", params={"run_id": "run"})
    assert listed.status_code == 200
    (item,) = listed.json()["items"]
    assert item["values"] == {"count": 3.0, "loss": 0.25, "big": float(2**60), "negative": -1e-9, "missing": None}
    assert all(isinstance(v, float) for v in item["values"].values() if v is not None)


async def test_a_stored_string_is_not_read_as_a_number(served: Any) -> None:
    """A record written into the file by another program, with a string for a value: the read refuses it, naming
    the metric, instead of answering 1.5."""
    http, path = served
    assert (await http.post("/metrics", json={"records": [_record(1, {"loss": 0.5})]})).status_code == 201
    with sqlite3.connect(path) as conn:
        (data,) = conn.execute("SELECT data FROM metrics").fetchone()
        tampered = orjson.loads(data)
        tampered["values"]["loss"] = "1.5"
        conn.execute("UPDATE metrics SET data = ?", (orjson.dumps(tampered).decode(),))
    conn.close()

    answer = await http.get("/metrics")
    assert answer.status_code >= 400
    assert "1.5" not in answer.text.replace("'1.5'", "").replace('"1.5"', "")  # never a number 1.5
    assert "loss" in answer.text


def test_records_read_from_json_keep_numbers_strict() -> None:
    assert MetricsRecord.model_validate_json(orjson.dumps(_record(1, {"a": 1, "b": 0.5, "c": None}))).values == {
        "a": 1.0,
        "b": 0.5,
        "c": None,
    }
    for value in ("1.5", True):
        with pytest.raises(ValueError, match=r"values\.a"):
            MetricsRecord.model_validate_json(orjson.dumps(_record(1, {"a": value})))
        with pytest.raises(ValueError, match=r"values\.a"):
            MetricsRecord(run_id="run", step=1, time=0.0, values={"a": value})
