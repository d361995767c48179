"""The building blocks of examples/minimal: traces, metrics, the gateway in front of two backends, an engine's
lifecycle. Each runs as a user would run it, against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from support.fake_openai import FakeOpenAIServer
from support.models import serving
from support.servers import STORE_HEALTH_PATH, free_port, start_store_process, wait_healthy

import agentbolt as agl
from examples.minimal import engine_lifecycle, llm_proxy, write_metrics, write_traces

OPENAI_CHAT_SPAN = "openai.chat.completion"


def _names(spans: list) -> list:
    return [span.name for span in spans]


def test_otel_tracer_writes_nested_spans_and_the_reward_to_an_in_memory_store() -> None:
    spans = asyncio.run(write_traces.write_traces("otel", "memory"))
    by_name = {span.name: span for span in spans}
    assert by_name["agentlightning.operation"].parent_id == by_name["plan"].span_id
    assert agl.find_final_reward(spans) == 1.0
    assert [span.sequence_id for span in spans] == sorted({span.sequence_id for span in spans})


def test_default_tracer_sends_an_openai_call_over_otlp_to_a_store_server() -> None:
    # The hosted model is a stand-in: the fake OpenAI server of tests/support, answering "Echo: <question>".
    with FakeOpenAIServer() as fake:
        spans = asyncio.run(write_traces.write_traces("agentops", "server", llm_base_url=fake.base_url, model="m"))
    names = _names(spans)
    root = next(span for span in spans if span.parent_id is None)
    assert root.name == spans[0].rollout_id  # the default tracer's root span is named after the rollout
    assert any(name.startswith("openai.chat") for name in names), names
    assert all(span.resource.attributes.get("agentlightning.rollout_id") == root.rollout_id for span in spans)
    assert agl.find_final_reward(spans) == 0.0  # the stand-in echoes the question: no "Paris" in the answer


def test_spans_reach_an_agentbolt_store_process_through_its_url(tmp_path: Path) -> None:
    port = free_port()
    process = start_store_process(tmp_path / "store.db", port)
    try:
        wait_healthy(f"http://127.0.0.1:{port}{STORE_HEALTH_PATH}", process, timeout=180)
        spans = asyncio.run(write_traces.write_traces("otel", f"http://127.0.0.1:{port}"))
    finally:
        process.terminate()
        process.wait(30)
    assert {"plan", "agentlightning.operation", "agentlightning.annotation"} <= set(_names(spans))


def test_a_store_that_is_neither_memory_server_nor_url_is_refused() -> None:
    with pytest.raises(SystemExit, match="--store must be"):
        asyncio.run(write_traces.write_traces("otel", "sqlite.db"))


def test_metrics_go_to_the_console_and_to_prometheus_at_once(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("prometheus_client")
    with caplog.at_level(logging.INFO, logger="agentbolt.utils.metrics"):
        scraped = write_metrics.serve_and_record(free_port(), events=30)
    counters = [line for line in scraped.splitlines() if line.startswith("example_requests_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counters) == 30
    assert 'example_latency_seconds_count{route="/v1/models"} 10.0' in scraped
    assert 'le="0.05"' in scraped  # the example's own buckets
    assert any("example.requests" in record.getMessage() for record in caplog.records)


def test_gateway_in_front_of_a_local_engine_records_token_ids(tiny_model_dir: Path) -> None:
    with serving(tiny_model_dir) as server:
        backend = llm_proxy.local_backend(server.base_url, llm_proxy.served_model(server.base_url))
        call = asyncio.run(llm_proxy.call_through_gateway(backend, "hello", max_tokens=4))
    assert call.span.attributes["prompt_token_ids"] and call.span.attributes["response_token_ids"]
    assert call.span.rollout_id == call.rollout_id
    assert "token ids" in llm_proxy.summary(call)


def test_gateway_in_front_of_a_hosted_api_uses_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hosted API is a stand-in (tests/support/fake_openai.py); base URL and key come from the environment.
    with FakeOpenAIServer() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-stand-in")
        call = asyncio.run(llm_proxy.call_through_gateway(llm_proxy.hosted_backend("gpt-4o-mini"), "hello"))
        forwarded = fake.config.requests[-1]
    assert call.reply == "Echo: hello"
    assert forwarded["model"] == "gpt-4o-mini" and "return_token_ids" not in forwarded
    assert "prompt_token_ids" not in call.span.attributes or not call.span.attributes["prompt_token_ids"]


def test_hosted_backend_without_a_key_says_which_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(SystemExit, match="OPENAI_API_KEY"):
        llm_proxy.hosted_backend("gpt-4o-mini")


def test_engine_lifecycle_starts_serves_and_stops_the_server_process(tiny_model_dir: Path) -> None:
    report = engine_lifecycle.run("transformers", str(tiny_model_dir), "float32")
    assert isinstance(report.reply, str)
    assert report.process_gone and report.exit_code is not None


def test_the_script_prints_the_stored_spans(capsys: pytest.CaptureFixture[str]) -> None:
    write_traces.main(["--tracer", "agentops"])
    out = capsys.readouterr().out
    assert "agentlightning.operation" in out and "4 spans stored for rollout ro-" in out
