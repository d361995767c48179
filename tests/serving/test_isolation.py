"""Per-request isolation and bounded work: a failing request fails alone, abandoned work stops, limits refuse."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Union

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.models import serving

from agentbolt.serving.params import (
    EngineError,
    EngineOverloadedError,
    GenerationFailedError,
    GenerationOutput,
    SamplingParams,
)
from agentbolt.serving.server import InferenceServer, ServingLimits
from agentbolt.serving.transformers_engine import TransformersEngine


def _wait_for(condition: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[TransformersEngine]:
    engine = TransformersEngine(tiny_model_dir, dtype="float32", max_batch_size=8, served_name="tiny")
    engine.start()
    yield engine
    engine.stop()


def test_a_poison_request_fails_alone_while_the_running_batch_keeps_decoding(engine: TransformersEngine) -> None:
    prompt = engine.encode("hello there")
    good = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    poison = SamplingParams(max_tokens=300, temperature=0.7, n=2, seed=2**70)
    with pytest.raises(EngineError, match="seed"):  # the door refuses it...
        engine.check_request(prompt, poison)
    # ...so, standing in for a parameter the door would miss, this one skips the door's check and reaches the
    # batch step, where seeding its generator raises (what failed every running request before).
    object.__setattr__(poison, "validate", lambda: None)
    alone = engine.generate_sync(prompt, good, timeout=300)

    results: Dict[str, Union[GenerationOutput, BaseException]] = {}

    def run(name: str, params: SamplingParams) -> None:
        try:
            results[name] = engine.generate_sync(prompt, params, timeout=300)
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=(f"good{i}", good)) for i in range(3)]
    for thread in threads:
        thread.start()
    _wait_for(lambda: engine.stats()["running"] == 3)
    with engine.weights_update():  # between two steps: the poison joins a batch that is decoding
        assert engine.stats()["running"] == 3
        poisoner = threading.Thread(target=run, args=("poison", poison))
        poisoner.start()
        _wait_for(lambda: engine.stats()["waiting"] == 1)
    for thread in [*threads, poisoner]:
        thread.join(300)

    failure = results["poison"]
    assert isinstance(failure, GenerationFailedError), failure
    assert "generation failed" in str(failure)
    for index in range(3):
        output = results[f"good{index}"]
        assert isinstance(output, GenerationOutput), output
        assert output.choices[0].finish_reason == "length"
        assert output.choices[0].token_ids == alone.choices[0].token_ids  # unaffected by the poison
    _wait_for(lambda: engine.stats()["queued_tokens"] == 0)


def test_queued_tokens_are_bounded_and_given_back(tiny_model_dir: Path) -> None:
    engine = TransformersEngine(tiny_model_dir, dtype="float32", max_queued_tokens=400, served_name="tiny")
    engine.start()
    try:
        prompt = engine.encode("abc")
        big = SamplingParams(max_tokens=500)
        with pytest.raises(EngineError, match="more than the 400 the engine queues"):
            engine.generate_sync(prompt, big)
        with engine.weights_update():  # hold the scheduler so the first request stays queued
            holder = threading.Thread(
                target=engine.generate_sync, args=(prompt, SamplingParams(max_tokens=300, ignore_eos=True))
            )
            holder.start()
            _wait_for(lambda: engine.stats()["waiting"] == 1)
            assert engine.queued_tokens == len(prompt) + 300
            with pytest.raises(EngineOverloadedError, match="busy"):
                engine.generate_sync(prompt, SamplingParams(max_tokens=200))
        holder.join(120)
        _wait_for(lambda: engine.queued_tokens == 0)
        assert engine.generate_sync(prompt, SamplingParams(max_tokens=200)).choices[0].token_ids
    finally:
        engine.stop()


def test_lone_surrogates_are_refused_before_tokenizing(engine: TransformersEngine) -> None:
    with pytest.raises(EngineError, match="lone surrogate"):
        engine.encode("a\ud800b")
    with pytest.raises(EngineError, match="lone surrogate"):
        engine.encode_chat([{"role": "user", "content": "a\udc00b"}])


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        (SamplingParams(seed=2**63 - 1, n=2), "seed"),
        (SamplingParams(seed=-(2**63) - 1), "seed"),
        (SamplingParams(seed=True), "seed"),  # type: ignore[arg-type]
        (SamplingParams(temperature="1"), "temperature"),  # type: ignore[arg-type]
        (SamplingParams(max_tokens=2.5), "max_tokens"),  # type: ignore[arg-type]
        (SamplingParams(stop_token_ids=[-1]), "stop_token_ids"),
        (SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"),
        (SamplingParams(top_p=float("nan")), "top_p"),
    ],
)
def test_the_engine_door_checks_every_sampling_parameter(
    engine: TransformersEngine, params: SamplingParams, fragment: str
) -> None:
    with pytest.raises(EngineError, match=fragment):
        engine.check_request(engine.encode("x"), params)


@pytest.fixture(scope="module")
def limited(tiny_model_dir: Path) -> Iterator[InferenceServer]:
    limits = ServingLimits(max_prompts_per_request=4, max_sequences_per_request=8, max_request_bytes=4096)
    with serving(
        tiny_model_dir, max_batch_size=8, max_queued_tokens=10_000, server_options={"limits": limits}
    ) as server:
        yield server


def _post(server: InferenceServer, route: str, body: Any, timeout: Any = 120) -> httpx.Response:
    return httpx.post(f"{server.base_url}/{route}", json=body, timeout=timeout)


@pytest.mark.parametrize(
    ("route", "body", "status", "fragments"),
    [
        ("completions", {"prompt": ["a"] * 5, "max_tokens": 1}, 400, ["5 prompts", "limit of 4", "--max-prompts"]),
        ("completions", {"prompt": ["a"] * 1000, "n": 128}, 400, ["1000 prompts", "--max-prompts-per-request"]),
        ("completions", {"prompt": ["a", "b"], "n": 5}, 400, ["10 sequences", "limit of 8", "--max-sequences"]),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 9}, 400, ["9 sequences"]),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "n": 8},
            400,
            ["tokens of work", "10000", "--max-queued-tokens"],
        ),
        ("completions", {"prompt": "a" * 5000}, 413, ["larger than the limit of 4096 bytes"]),
    ],
)
def test_work_limits_are_400s_naming_the_limit_and_its_flag(
    limited: InferenceServer, route: str, body: Dict[str, Any], status: int, fragments: list
) -> None:
    response = _post(limited, route, body)
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert all(fragment in message for fragment in fragments), message
    assert limited.engine.queued_tokens == 0


def test_a_disconnected_heavy_request_stops_generating(limited: InferenceServer) -> None:
    engine = limited.engine
    before = engine.stats()["generated_tokens"]
    heavy = {"prompt": ["a", "b"], "n": 4, "max_tokens": 1200, "ignore_eos": True}
    # The client gives up and closes the connection. The tiny model can finish the whole request in under a second
    # on a fast CPU (0.9 s on an AVX-512 VM), so the client waits a quarter of that.
    with pytest.raises(httpx.ReadTimeout):
        _post(limited, "completions", heavy, timeout=httpx.Timeout(120, read=0.25))
    _wait_for(lambda: engine.stats()["running"] == 0 and engine.stats()["waiting"] == 0)
    generated = engine.stats()["generated_tokens"] - before
    assert generated < 8 * 1200  # it stopped long before its budget
    assert engine.queued_tokens == 0
    after = _post(limited, "chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["role"] == "assistant"


def test_a_stream_whose_client_leaves_while_it_is_queued_gives_its_tokens_back_at_once(tiny_model_dir: Path) -> None:
    """A streaming request waiting for a batch slot whose client goes away is dropped then, not when a slot frees:
    it used to keep its place and its queued tokens, so clients that time out and retry filled the queue with dead
    requests and live ones got 429s."""
    busy = {"prompt": "a", "max_tokens": 2000, "ignore_eos": True}
    with serving(tiny_model_dir, max_batch_size=1, max_queued_tokens=100_000) as server:
        engine = server.engine
        threads = [threading.Thread(target=_post, args=(server, "completions", busy)) for _ in range(2)]
        for thread in threads:
            thread.start()
        _wait_for(lambda: engine.stats()["running"] == 1 and engine.stats()["waiting"] == 1)
        held_by_busy = engine.queued_tokens
        with (
            pytest.raises(httpx.ReadTimeout),  # no first chunk: it waits behind the two busy requests
            httpx.stream(
                "POST",
                f"{server.base_url}/completions",
                json={**busy, "stream": True},
                timeout=httpx.Timeout(120, read=0.2),
            ) as response,
        ):
            response.read()
        _wait_for(lambda: engine.queued_tokens <= held_by_busy or not all(t.is_alive() for t in threads), timeout=30)
        assert all(t.is_alive() for t in threads), "a busy request ended before the stream's tokens were given back"
        for thread in threads:
            thread.join()
        assert engine.queued_tokens == 0
