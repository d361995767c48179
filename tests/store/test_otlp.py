"""OTLP/HTTP trace ingestion: real OpenTelemetry SDK spans exported by the SDK's OTLP exporter into the server."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any, AsyncIterator, List, Sequence, Tuple

import aiohttp
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status as OtelStatus
from opentelemetry.trace import StatusCode
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import AttemptedRollout
from agentbolt.utils.otlp import PROTOBUF_CT, LightningStoreOTLPExporter, spans_from_proto


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Tuple[LightningStoreServer, SqliteLightningStore]]:
    store = SqliteLightningStore(tmp_path / "store.db")
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="thread")
    await server.start()
    try:
        yield server, store
    finally:
        await server.stop()
        await store.close()


def _emit(exporter: Any, resource: Resource, build: Any) -> None:
    """Record spans with a real SDK tracer whose processor exports synchronously through ``exporter``."""
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    build(provider.get_tracer("test"))
    provider.shutdown()


def _build_tree(tracer: Any) -> None:
    with tracer.start_as_current_span("agent.run") as root:
        root.set_attribute("agent.name", "planner")
        with tracer.start_as_current_span("openai.chat") as child:
            child.set_attribute("gen_ai.request.model", "smollm2")
            child.set_attribute("gen_ai.usage.tokens", [3, 4])
            child.add_event("token", {"index": 1})
            child.set_status(OtelStatus(StatusCode.ERROR, "boom"))


async def _claimed(server: LightningStoreServer) -> AttemptedRollout:
    await server.enqueue_rollout({"q": 1})
    claimed = await server.dequeue_rollout()
    assert claimed is not None
    return claimed


async def test_sdk_exporter_spans_are_stored(running: Tuple[LightningStoreServer, SqliteLightningStore]) -> None:
    server, store = running
    claimed = await _claimed(server)
    resource = Resource.create(
        {
            "service.name": "agent",
            "agentlightning.rollout_id": claimed.rollout_id,
            "agentlightning.attempt_id": claimed.attempt.attempt_id,
        }
    )
    exporter = OTLPSpanExporter(endpoint=server.otlp_traces_endpoint())
    await asyncio.to_thread(_emit, exporter, resource, _build_tree)

    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == ["openai.chat", "agent.run"]  # export order: children end first
    assert [s.sequence_id for s in spans] == [1, 2]
    chat, root = spans
    assert chat.parent_id == root.span_id and root.parent_id is None
    assert chat.trace_id == root.trace_id and len(chat.trace_id) == 32 and len(chat.span_id) == 16
    assert chat.attributes["gen_ai.request.model"] == "smollm2"
    assert chat.attributes["gen_ai.usage.tokens"] == [3, 4]
    assert chat.status.status_code == "ERROR" and chat.status.description == "boom"
    assert chat.events[0].name == "token" and chat.events[0].attributes == {"index": 1}
    assert chat.resource.attributes["service.name"] == "agent"
    assert chat.start_time is not None and chat.end_time is not None and chat.end_time >= chat.start_time
    # The first span moved the attempt to running.
    assert (await store.get_latest_attempt(claimed.rollout_id)).status == "running"  # type: ignore[union-attr]
    # Sequence ids keep increasing after OTLP ingestion.
    assert await server.get_next_span_sequence_id(claimed.rollout_id, claimed.attempt.attempt_id) == 3


async def test_gzip_request_and_response(running: Tuple[LightningStoreServer, SqliteLightningStore]) -> None:
    server, store = running
    claimed = await _claimed(server)
    resource = Resource.create(
        {"agentlightning.rollout_id": claimed.rollout_id, "agentlightning.attempt_id": claimed.attempt.attempt_id}
    )
    exporter = OTLPSpanExporter(endpoint=server.otlp_traces_endpoint(), compression=Compression.Gzip)
    await asyncio.to_thread(_emit, exporter, resource, lambda tracer: tracer.start_span("gz").end())
    assert [s.name for s in await store.query_spans(claimed.rollout_id)] == ["gz"]

    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.post(
            server.otlp_traces_endpoint(),
            data=gzip.compress(ExportTraceServiceRequest().SerializeToString()),
            headers={"Content-Type": PROTOBUF_CT, "Content-Encoding": "gzip", "Accept-Encoding": "br, gzip;q=0.5"},
        ) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Encoding"] == "gzip"
        parsed = ExportTraceServiceResponse()
        parsed.ParseFromString(gzip.decompress(await response.read()))


async def test_bad_requests_are_rejected(running: Tuple[LightningStoreServer, SqliteLightningStore]) -> None:
    server, store = running
    claimed = await _claimed(server)
    url = server.otlp_traces_endpoint()
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=b"{}", headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            status = Status()
            status.ParseFromString(await response.read())
            assert status.message == "Unsupported Content-Type 'application/json', expected 'application/x-protobuf'"
        async with http.post(url, data=b"\xff\xff\xff", headers={"Content-Type": PROTOBUF_CT}) as response:
            assert response.status == 400
            status.ParseFromString(await response.read())
            assert status.message.startswith("Unable to parse OTLP traces payload")
        headers = {"Content-Type": PROTOBUF_CT, "Content-Encoding": "gzip"}
        async with http.post(url, data=b"not gzip", headers=headers) as response:
            assert response.status == 400
        async with http.post(url, data=b"", headers={"Content-Type": PROTOBUF_CT + "; charset=binary"}) as response:
            assert response.status == 200  # an empty export is valid
    assert len(await store.query_spans(claimed.rollout_id)) == 0


async def test_spans_for_unknown_rollouts_get_a_4xx(running: Tuple[LightningStoreServer, SqliteLightningStore]) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    server, store = running
    captured: List[Any] = []

    class Capture(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            captured.extend(spans)
            return SpanExportResult.SUCCESS

    resource = Resource.create({"agentlightning.rollout_id": "ro-nope", "agentlightning.attempt_id": "at-nope"})
    _emit(Capture(), resource, lambda tracer: tracer.start_span("x").end())
    # The exact payload the SDK's OTLP exporter would send.
    payload = encode_spans(captured).SerializeToString()
    async with (
        aiohttp.ClientSession() as http,
        http.post(server.otlp_traces_endpoint(), data=payload, headers={"Content-Type": PROTOBUF_CT}) as response,
    ):
        assert response.status == 404
        assert "ro-nope" in (await response.json())["detail"]
    assert (await store.statistics())["total_spans"] == 0


async def test_lightning_exporter_binds_spans_to_the_active_attempt(
    running: Tuple[LightningStoreServer, SqliteLightningStore],
) -> None:
    server, store = running
    claimed = await _claimed(server)
    exporter = LightningStoreOTLPExporter()
    default_endpoint = exporter.endpoint
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    def record(name: str) -> None:
        tracer.start_span(name).end()

    await asyncio.to_thread(record, "dropped")  # nothing bound: bypassed, not sent anywhere
    exporter.enable_store_otlp(server.otlp_traces_endpoint(), claimed.rollout_id, claimed.attempt.attempt_id)
    assert exporter.endpoint == server.otlp_traces_endpoint()
    assert (exporter.rollout_id, exporter.attempt_id) == (claimed.rollout_id, claimed.attempt.attempt_id)
    await asyncio.to_thread(record, "kept")
    exporter.disable_store_otlp()
    assert exporter.endpoint == default_endpoint and exporter.rollout_id is None
    await asyncio.to_thread(record, "dropped too")
    await asyncio.to_thread(provider.shutdown)

    spans = await store.query_spans(claimed.rollout_id)
    assert [s.name for s in spans] == ["kept"]
    assert spans[0].resource.attributes["service.name"] == "agent"
    assert spans[0].resource.attributes["agentlightning.rollout_id"] == claimed.rollout_id


async def test_spans_from_proto_ids_and_sequence_overrides() -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

    def kv(key: str, value: Any) -> KeyValue:
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        return KeyValue(key=key, value=AnyValue(string_value=value))

    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource={
                    "attributes": [kv("agentlightning.rollout_id", "ro-a"), kv("agentlightning.attempt_id", "at-a")]
                },
                schema_url="https://schema",
                scope_spans=[
                    ScopeSpans(
                        spans=[
                            ProtoSpan(name="no-seq", trace_id=b"\x01", span_id=b"\x02"),
                            ProtoSpan(
                                name="with-seq", span_id=b"\x03", attributes=[kv("agentlightning.span_sequence_id", 7)]
                            ),
                            ProtoSpan(name="bad-seq", attributes=[kv("agentlightning.span_sequence_id", "x")]),
                            ProtoSpan(name="other", attributes=[kv("agentlightning.rollout_id", "ro-b")]),
                        ]
                    )
                ],
            ),
            ResourceSpans(scope_spans=[ScopeSpans(spans=[ProtoSpan(name="unbound")])]),
        ]
    )
    issued: List[Tuple[str, str]] = []

    async def issuer(pairs: Sequence[Tuple[str, str]]) -> Sequence[int]:
        issued.extend(pairs)
        return list(range(100, 100 + len(pairs)))

    spans = await spans_from_proto(request, issuer)
    assert [s.name for s in spans] == ["no-seq", "with-seq", "bad-seq", "other"]
    assert issued == [("ro-a", "at-a"), ("ro-a", "at-a"), ("ro-b", "at-a")]
    assert [s.sequence_id for s in spans] == [100, 7, 101, 102]
    assert spans[0].trace_id == "0" * 31 + "1" and spans[0].span_id == "0" * 15 + "2"
    assert spans[2].span_id == "0" * 16
    assert spans[3].rollout_id == "ro-b"
    assert spans[0].resource.schema_url == "https://schema"
    assert spans[0].status.status_code == "UNSET" and spans[0].parent is None


async def test_client_otlp_endpoint_accepts_spans(running: Tuple[LightningStoreServer, SqliteLightningStore]) -> None:
    server, _ = running
    claimed = await _claimed(server)
    client = LightningStoreClient(server.endpoint)
    try:
        resource = Resource.create(
            {"agentlightning.rollout_id": claimed.rollout_id, "agentlightning.attempt_id": claimed.attempt.attempt_id}
        )
        exporter = OTLPSpanExporter(endpoint=client.otlp_traces_endpoint())
        await asyncio.to_thread(_emit, exporter, resource, lambda tracer: tracer.start_span("via client url").end())
        assert [s.name for s in await client.query_spans(claimed.rollout_id)] == ["via client url"]
    finally:
        await client.close()


async def test_lightning_exporter_sends_the_token_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTBOLT_API_KEY", "otlp-token")
    store = SqliteLightningStore(tmp_path / "store.db")
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="thread")
    await server.start()
    try:
        claimed = await _claimed(server)
        exporter = LightningStoreOTLPExporter()
        exporter.enable_store_otlp(server.otlp_traces_endpoint(), claimed.rollout_id, claimed.attempt.attempt_id)
        await asyncio.to_thread(_emit, exporter, Resource.create({}), lambda tracer: tracer.start_span("auth").end())
        assert [s.name for s in await store.query_spans(claimed.rollout_id)] == ["auth"]
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                server.otlp_traces_endpoint(),
                data=ExportTraceServiceRequest().SerializeToString(),
                headers={"Content-Type": PROTOBUF_CT},
            ) as response,
        ):
            assert response.status == 401  # the route is protected like the others
    finally:
        await server.stop()
        await store.close()
