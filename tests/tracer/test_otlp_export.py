"""OtelTracer over a store that accepts OTLP: spans travel over OTLP/HTTP, bound to their rollout by resource ids."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Tuple

import httpx
import pytest
from support.servers import free_port

from agentbolt.emitter import emit_message
from agentbolt.semconv import LightningResourceAttributes
from agentbolt.store.base import LightningStore
from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer, OtelTracer
from agentbolt.types import Span
from agentbolt.utils.otlp import LightningStoreOTLPExporter

ROLLOUT_KEY = LightningResourceAttributes.ROLLOUT_ID.value
ATTEMPT_KEY = LightningResourceAttributes.ATTEMPT_ID.value


@pytest.fixture
async def inner() -> AsyncIterator[InMemoryLightningStore]:
    yield InMemoryLightningStore(thread_safe=True)


@pytest.fixture
async def server(inner: InMemoryLightningStore) -> AsyncIterator[LightningStoreServer]:
    server = LightningStoreServer(inner, host="127.0.0.1", port=free_port(), api_key="s3cret")
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(server: LightningStoreServer) -> AsyncIterator[LightningStoreClient]:
    client = LightningStoreClient(server.endpoint, api_key="s3cret")
    yield client
    await client.close()


async def run_agent(tracer: OtelTracer, store: LightningStore) -> Tuple[str, str]:
    """A rollout whose spans nest (root > child > grandchild) and carry attributes of several types."""
    rollout = await store.start_rollout(input={"task": "otlp"})
    rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    async with tracer.trace_context(rollout_id=rollout_id, attempt_id=attempt_id) as otel:
        with otel.start_as_current_span("root", attributes={"kind": "root", "n": 3, "ratio": 0.5}):
            with otel.start_as_current_span("child", attributes={"tags": ["a", "b"], "ok": True}):
                otel.start_span("grandchild", attributes={"step": 1}).end()
            emit_message("hello")
    return rollout_id, attempt_id


def shape(spans: List[Span]) -> List[Dict[str, Any]]:
    """What must not depend on the path a span took: name, attributes, parent, order."""
    names = {span.span_id: span.name for span in spans}
    ordered = sorted(spans, key=lambda span: span.sequence_id)
    return [
        {
            "name": span.name,
            "attributes": span.attributes,
            "parent": names.get(span.parent_id) if span.parent_id else None,
            "status": span.status.status_code,
        }
        for span in ordered
    ]


async def test_spans_arrive_over_otlp_bound_by_resource_ids(
    inner: InMemoryLightningStore, client: LightningStoreClient
) -> None:
    tracer = OtelTracer()
    tracer.init_worker(0, client)
    rollout_id, attempt_id = await run_agent(tracer, client)

    stored = await inner.query_spans(rollout_id, sort_by="sequence_id")
    assert [span.name for span in stored] == ["grandchild", "child", "agentlightning.message", "root"]
    for span in stored:
        assert span.rollout_id == rollout_id and span.attempt_id == attempt_id
        # Only spans that came over OTLP carry the binding in their resource.
        assert span.resource.attributes[ROLLOUT_KEY] == rollout_id
        assert span.resource.attributes[ATTEMPT_KEY] == attempt_id
    sequence_ids = [span.sequence_id for span in stored]
    assert sequence_ids == sorted(set(sequence_ids))
    by_name = {span.name: span for span in stored}
    assert by_name["child"].parent_id == by_name["root"].span_id
    assert by_name["grandchild"].parent_id == by_name["child"].span_id
    assert len({span.trace_id for span in stored}) == 1
    processor = tracer._lightning_span_processor
    assert processor is not None and processor.disable_store_submission
    assert [span.name for span in tracer.get_last_trace()] == [span.name for span in stored]


async def test_otlp_path_stores_the_same_spans_as_the_direct_path(
    inner: InMemoryLightningStore, client: LightningStoreClient
) -> None:
    tracer = OtelTracer()
    tracer.init_worker(0, client)
    otlp_rollout, _ = await run_agent(tracer, client)
    over_otlp = await inner.query_spans(otlp_rollout)

    # The same agent against a store without OTLP support: spans are written directly.
    tracer.init_worker(0, inner)
    direct_rollout, _ = await run_agent(tracer, inner)
    processor = tracer._lightning_span_processor
    assert processor is not None and not processor.disable_store_submission
    direct = await inner.query_spans(direct_rollout)
    assert ROLLOUT_KEY not in direct[0].resource.attributes

    assert shape(list(over_otlp)) == shape(list(direct))


async def test_store_without_exporter_is_a_runtime_error(client: LightningStoreClient) -> None:
    tracer = OtelTracer()
    tracer.init_worker(0, client)
    processor = tracer._lightning_span_processor
    assert processor is not None
    processor.otlp_exporter = None
    rollout = await client.start_rollout(input={})
    with pytest.raises(RuntimeError, match="no LightningStoreOTLPExporter"):
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            pass


async def test_exporter_sends_the_stores_bearer_token(
    server: LightningStoreServer, inner: InMemoryLightningStore
) -> None:
    rollout = await inner.start_rollout(input={})
    exporter = LightningStoreOTLPExporter()
    exporter.enable_store_otlp(
        server.otlp_traces_endpoint(), rollout.rollout_id, rollout.attempt.attempt_id, api_key="wrong"
    )
    tracer = OtelTracer()
    tracer.init_worker(0, inner)
    otel = tracer.get_otel_tracer()
    span = otel.start_span("refused")
    span.end()
    from opentelemetry.sdk.trace.export import SpanExportResult

    assert await asyncio.to_thread(exporter.export, [span]) is SpanExportResult.FAILURE  # type: ignore[list-item]
    exporter.enable_store_otlp(
        server.otlp_traces_endpoint(), rollout.rollout_id, rollout.attempt.attempt_id, api_key="s3cret"
    )
    assert await asyncio.to_thread(exporter.export, [span]) is SpanExportResult.SUCCESS  # type: ignore[list-item]
    assert [s.name for s in await inner.query_spans(rollout.rollout_id)] == ["refused"]


async def test_exporter_reads_the_token_from_the_environment(
    server: LightningStoreServer, inner: InMemoryLightningStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTBOLT_API_KEY", "s3cret")
    client = LightningStoreClient(server.endpoint)  # the client reads the same variable
    try:
        tracer = OtelTracer()
        tracer.init_worker(0, client)
        rollout_id, _ = await run_agent(tracer, client)
        assert len(await inner.query_spans(rollout_id)) == 4
    finally:
        await client.close()


async def test_agentops_tracer_uses_the_same_processor_and_exports_over_otlp(
    inner: InMemoryLightningStore, client: LightningStoreClient
) -> None:
    from agentbolt.tracer.otel import LightningSpanProcessor

    tracer = AgentOpsTracer(instrument_managed=False)
    tracer.init_worker(0, client)
    assert isinstance(tracer._lightning_span_processor, LightningSpanProcessor)
    rollout = await client.start_rollout(input={})
    async with tracer.trace_context("agent", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        emit_message("inside")
    stored = await inner.query_spans(rollout.rollout_id, sort_by="sequence_id")
    assert [span.name for span in stored] == ["agentlightning.message", "agent"]
    assert all(span.resource.attributes[ROLLOUT_KEY] == rollout.rollout_id for span in stored)


def start_store_process(db: Path, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "agentbolt", "store", "--port", str(port), "--path", str(db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/agl/health", timeout=0.5).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("store server did not start")


async def test_store_killed_and_restarted_mid_rollout_loses_no_span(tmp_path: Path) -> None:
    db, port = tmp_path / "store.db", free_port()
    process = await asyncio.to_thread(start_store_process, db, port)
    # Fail fast instead of the client's own retries: the span writer behind the exporter is what is exercised.
    client = LightningStoreClient(f"http://127.0.0.1:{port}", retry_delays=(), health_retry_delays=())
    try:
        rollout = await client.start_rollout(input={"task": "restart"})
        tracer = OtelTracer(write_timeout=1.0)
        tracer.init_worker(0, client)
        processor = tracer._lightning_span_processor
        assert processor is not None
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            emit_message("before")
            assert await processor.flush_async(30)
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait, 20)
            for i in range(5):
                emit_message(f"during-{i}")
            await asyncio.sleep(1.5)  # the exporter fails while nothing listens
            assert processor.pending_count >= 1
            process = await asyncio.to_thread(start_store_process, db, port)
            emit_message("after")
        assert await processor.flush_async(60)
        assert processor.pending_count == 0 and processor.given_up_count == 0

        spans = await client.query_spans(rollout.rollout_id, sort_by="sequence_id")
        bodies = [span.attributes["agentlightning.message.body"] for span in spans]
        assert bodies == ["before", *(f"during-{i}" for i in range(5)), "after"]
        sequence_ids = [span.sequence_id for span in spans]
        assert sequence_ids == sorted(set(sequence_ids))
        assert all(span.resource.attributes[ROLLOUT_KEY] == rollout.rollout_id for span in spans)
    finally:
        await client.close()
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 20)


async def test_store_paused_mid_rollout_stores_each_span_once(tmp_path: Path) -> None:
    db, port = tmp_path / "store.db", free_port()
    process = await asyncio.to_thread(start_store_process, db, port)
    client = LightningStoreClient(f"http://127.0.0.1:{port}", retry_delays=(), health_retry_delays=())
    try:
        rollout = await client.start_rollout(input={"task": "pause"})
        tracer = OtelTracer(write_timeout=1.0)
        tracer.init_worker(0, client)
        processor = tracer._lightning_span_processor
        assert processor is not None
        # Exports time out quickly, so the paused store's backlog fills with exports that are sent again.
        processor.otlp_exporter = LightningStoreOTLPExporter(timeout=0.5)
        async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
            emit_message("before")
            assert await processor.flush_async(30)
            process.send_signal(signal.SIGSTOP)
            try:
                for i in range(3):
                    emit_message(f"during-{i}")
                await asyncio.sleep(3.0)
                assert processor.pending_count >= 1
            finally:
                process.send_signal(signal.SIGCONT)
            emit_message("after")
        assert await processor.flush_async(60)
        assert processor.pending_count == 0 and processor.given_up_count == 0

        spans = await client.query_spans(rollout.rollout_id, sort_by="sequence_id")
        bodies = [span.attributes["agentlightning.message.body"] for span in spans]
        assert bodies == ["before", *(f"during-{i}" for i in range(3)), "after"]
    finally:
        await client.close()
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 20)
