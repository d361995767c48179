"""LoRA adapters loaded and unloaded over HTTP while requests run: failed and concurrent loads, and unloading an
adapter that a waiting request names."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import httpx
import pytest
from support.models import serving

from agentbolt.serving.server import InferenceServer

from .test_engine import _make_adapter

MESSAGES = [{"role": "user", "content": "hi"}]
GREEDY = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter directory with ``fits`` (for the tiny model) and ``misfit`` (for a wider model)."""
    from agentbolt.models.tiny import create_tiny_model

    root = tmp_path_factory.mktemp("adapters")
    _make_adapter(tiny_model_dir, root / "fits", seed=2)
    wider = create_tiny_model(tmp_path_factory.mktemp("tiny-llama-64"), seed=1, hidden_size=64)
    _make_adapter(wider, root / "misfit", seed=3)
    return root


@pytest.fixture
def server(tiny_model_dir: Path, adapters: Path) -> Iterator[InferenceServer]:
    # One sequence at a time: a request for another adapter waits while one runs.
    with serving(tiny_model_dir, max_batch_size=1, server_options={"adapter_dirs": [adapters]}) as running:
        yield running


@pytest.fixture
def http(server: InferenceServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def _tokens(http: httpx.Client, **fields: Any) -> List[int]:
    response = http.post("/chat/completions", json={**GREEDY, **fields})
    assert response.status_code == 200, response.text
    return list(response.json()["choices"][0]["token_ids"])


def _load(http: httpx.Client, name: str, path: str) -> httpx.Response:
    return http.post("/load_lora_adapter", json={"lora_name": name, "lora_path": path})


def test_an_adapter_that_does_not_fit_the_model_leaves_it_serving(http: httpx.Client) -> None:
    base = _tokens(http)
    refused = _load(http, "misfit", "misfit")
    assert refused.status_code == 400 and "size mismatch" in refused.json()["error"]["message"]
    assert [card["id"] for card in http.get("/models").json()["data"]] == ["tiny"]
    assert _tokens(http) == base
    assert _load(http, "fits", "fits").status_code == 200
    tuned = _tokens(http, model="fits")
    assert tuned != base
    assert _load(http, "misfit", "misfit").status_code == 400  # beside a loaded adapter too
    assert _tokens(http, model="fits") == tuned and _tokens(http) == base


def test_concurrent_loads_of_one_name_load_it_once(http: httpx.Client) -> None:
    base = _tokens(http)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _load(http, "fits", "fits"), range(4)))
    assert sorted(answer.status_code for answer in answers) == [200, 400, 400, 400]
    assert all("already loaded" in a.json()["error"]["message"] for a in answers if a.status_code == 400)
    tuned = _tokens(http, model="fits")
    assert http.post("/unload_lora_adapter", json={"lora_name": "fits"}).status_code == 200
    assert _tokens(http) == base
    assert _load(http, "fits", "fits").status_code == 200  # the same adapter, loaded again, computes the same
    assert _tokens(http, model="fits") == tuned


def test_a_request_waiting_for_an_adapter_that_is_unloaded_gets_404(
    server: InferenceServer, http: httpx.Client
) -> None:
    assert _load(http, "first", "fits").status_code == 200
    assert _load(http, "second", "fits").status_code == 200
    engine = server.engine
    waiting: Dict[str, httpx.Response] = {}
    long = {**GREEDY, "model": "second", "max_tokens": 2000, "stream": True}
    with http.stream("POST", "/chat/completions", json=long) as running:
        assert running.status_code == 200
        events = running.iter_lines()  # kept open: a closed iterator closes the connection
        next(events)  # "second" is decoding and fills the batch

        def ask_first() -> None:
            waiting["first"] = http.post("/chat/completions", json={**GREEDY, "model": "first"})

        asker = threading.Thread(target=ask_first)
        asker.start()
        deadline = time.monotonic() + 30
        while engine.stats()["waiting"] == 0:
            assert time.monotonic() < deadline, "the request for 'first' never queued"
            time.sleep(0.01)
        unloaded = http.post("/unload_lora_adapter", json={"lora_name": "first"})
        assert unloaded.status_code == 200, unloaded.text
        asker.join(30)
    error = waiting["first"].json()["error"]
    assert waiting["first"].status_code == 404, error
    assert (error["code"], error["param"]) == ("model_not_found", "model") and "unloaded" in error["message"]
    assert _tokens(http, model="second") and _tokens(http)
