"""The default tracer records real OpenAI SDK calls (against the local fake API) into a real in-memory store."""

from __future__ import annotations

import contextlib
import gc
import json
import threading
from typing import Any, AsyncIterator, Dict, Iterator, List, Optional, Sequence, Tuple

import openai
import pytest
from support.fake_openai import FakeOpenAIServer, tokenize

from agentbolt.adapter import TracerTraceToTriplet, TraceToMessages
from agentbolt.emitter import emit_reward, find_final_reward
from agentbolt.instrumentation.openai import SPAN_NAME, TEXT_COMPLETION_SPAN_NAME, is_openai_instrumented
from agentbolt.store.base import LightningStore
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer, get_active_tracer
from agentbolt.types import AttemptedRollout, Span

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        yield running


Traced = Tuple[AgentOpsTracer, LightningStore, AttemptedRollout]


@contextlib.asynccontextmanager
async def traced_rollout(store: Optional[LightningStore] = None) -> AsyncIterator[Traced]:
    """A started rollout in ``store`` (by default a new in-memory store), with an AgentOps tracer instrumenting the
    OpenAI SDK meanwhile."""
    store = store if store is not None else InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "test"})
    tracer = AgentOpsTracer()
    with tracer.lifespan(store):
        yield tracer, store, rollout
    assert not is_openai_instrumented()


@pytest.fixture
async def traced(server: FakeOpenAIServer) -> AsyncIterator[Traced]:
    server.config.token_ids = True
    server.config.fail_next = 0
    async with traced_rollout() as running:
        yield running


async def run_traced(tracer: AgentOpsTracer, store: LightningStore, rollout: AttemptedRollout, body: Any) -> List[Span]:
    async with tracer.trace_context(
        rollout.rollout_id, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id
    ):
        result = body()
        if hasattr(result, "__await__"):
            await result
    return list(await store.query_spans(rollout.rollout_id))


def llm_spans(spans: Sequence[Span]) -> List[Span]:
    return [span for span in spans if span.name == SPAN_NAME]


def prompt_ids(messages: List[Dict[str, str]]) -> List[int]:
    return tokenize("".join(f"<{m['role']}>{m['content']}" for m in messages))


async def test_sync_completion_is_recorded_with_token_ids(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]

    def call() -> None:
        client.chat.completions.create(model="fake-model", messages=messages, temperature=0.5, max_tokens=16)

    spans = await run_traced(tracer, store, rollout, call)
    (span,) = llm_spans(spans)
    attrs = span.attributes
    assert attrs["gen_ai.system"] == "openai"
    assert attrs["gen_ai.request.model"] == "fake-model"
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.request.max_tokens"] == 16
    assert attrs["gen_ai.prompt.0.role"] == "system"
    assert attrs["gen_ai.prompt.1.content"] == "hello"
    assert attrs["gen_ai.completion.0.role"] == "assistant"
    assert attrs["gen_ai.completion.0.content"] == "Echo: hello"
    assert attrs["gen_ai.completion.0.finish_reason"] == "stop"
    assert str(attrs["gen_ai.response.id"]).startswith("chatcmpl-")
    assert attrs["gen_ai.response.model"] == "fake-model"
    assert list(attrs["prompt_token_ids"]) == prompt_ids(messages)
    assert list(attrs["response_token_ids"]) == tokenize("Echo: hello")
    assert attrs["gen_ai.usage.input_tokens"] == len(prompt_ids(messages))
    assert attrs["gen_ai.usage.output_tokens"] == len("Echo: hello")
    assert span.status.status_code == "OK"
    assert span.rollout_id == rollout.rollout_id and span.attempt_id == rollout.attempt.attempt_id


async def test_async_completion_with_logprobs(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")

    async def call() -> None:
        await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "abc"}], logprobs=True
        )

    spans = await run_traced(tracer, store, rollout, call)
    (span,) = llm_spans(spans)
    logprobs = json.loads(str(span.attributes["logprobs.content"]))
    assert [entry["token"] for entry in logprobs] == list("Echo: abc")
    assert list(span.attributes["response_logprobs"]) == pytest.approx([entry["logprob"] for entry in logprobs])


async def test_streaming_completion_accumulates_content_and_ids(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    received: List[str] = []

    def call() -> None:
        stream = client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "stream this please"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.choices:
                received.append(chunk.choices[0].delta.content or "")

    spans = await run_traced(tracer, store, rollout, call)
    assert "".join(received) == "Echo: stream this please"
    (span,) = llm_spans(spans)
    attrs = span.attributes
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.completion.0.content"] == "Echo: stream this please"
    assert attrs["gen_ai.completion.0.finish_reason"] == "stop"
    assert list(attrs["response_token_ids"]) == tokenize("Echo: stream this please")
    assert list(attrs["prompt_token_ids"]) == prompt_ids([{"role": "user", "content": "stream this please"}])
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0


async def test_async_streaming_tool_call(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")

    async def call() -> None:
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "weather"}], tools=TOOLS, stream=True
        )
        async with stream:
            async for _ in stream:
                pass

    spans = await run_traced(tracer, store, rollout, call)
    (span,) = llm_spans(spans)
    attrs = span.attributes
    assert attrs["gen_ai.request.functions.0.name"] == "search"
    assert attrs["gen_ai.request.functions.0.description"] == "Search the web"
    assert json.loads(str(attrs["gen_ai.request.functions.0.parameters"]))["type"] == "object"
    assert attrs["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert attrs["gen_ai.completion.0.tool_calls.0.name"] == "search"
    assert json.loads(str(attrs["gen_ai.completion.0.tool_calls.0.arguments"])) == {"query": "weather"}
    assert str(attrs["gen_ai.completion.0.tool_calls.0.id"]).startswith("call_")
    assert list(attrs["response_token_ids"]) == tokenize(json.dumps({"query": "weather"}))


async def test_tool_call_round_trip_records_tool_messages(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")

    def call() -> None:
        messages: List[Any] = [{"role": "user", "content": "find cats"}]
        first = client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        tool_call = first.choices[0].message.tool_calls[0]
        messages.append(first.choices[0].message)
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "cats found"})
        client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)

    spans = await run_traced(tracer, store, rollout, call)
    first, second = llm_spans(spans)
    call_id = first.attributes["gen_ai.completion.0.tool_calls.0.id"]
    assert second.attributes["gen_ai.prompt.1.role"] == "assistant"
    assert second.attributes["gen_ai.prompt.1.tool_calls.0.id"] == call_id
    assert second.attributes["gen_ai.prompt.1.tool_calls.0.name"] == "search"
    assert second.attributes["gen_ai.prompt.2.role"] == "tool"
    assert second.attributes["gen_ai.prompt.2.tool_call_id"] == call_id
    assert second.attributes["gen_ai.completion.0.content"] == "Echo: find cats"


async def test_failed_call_is_recorded_as_error(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    server.config.fail_next = 1
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)

    def call() -> None:
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}])

    spans = await run_traced(tracer, store, rollout, call)
    (span,) = llm_spans(spans)
    assert span.status.status_code == "ERROR"
    assert span.attributes["error.type"] == "InternalServerError"
    assert any(event.name == "exception" for event in span.events)


async def test_spans_have_increasing_sequence_ids_and_feed_the_adapter(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")

    async def call() -> None:
        assert get_active_tracer() is tracer
        for question in ("one", "two"):
            await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": question}])
        emit_reward(1.0)

    spans = await run_traced(tracer, store, rollout, call)
    assert get_active_tracer() is None
    sequence_ids = [span.sequence_id for span in spans]
    assert sequence_ids == sorted(sequence_ids) and len(set(sequence_ids)) == len(spans)
    names = [span.name for span in sorted(spans, key=lambda s: s.sequence_id)]
    assert names == [SPAN_NAME, SPAN_NAME, "agentlightning.annotation", rollout.rollout_id]
    root = spans[-1]
    assert all(span.parent_id == root.span_id for span in spans[:-1])
    assert find_final_reward(spans) == 1.0
    triplets = TracerTraceToTriplet().adapt(spans)
    assert [t.response["token_ids"] for t in triplets] == [tokenize("Echo: one"), tokenize("Echo: two")]
    assert triplets[-1].reward == 1.0


async def test_calls_outside_a_trace_context_are_not_stored(traced: Any, server: FakeOpenAIServer) -> None:
    _, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "untraced"}])
    assert list(await store.query_spans(rollout.rollout_id)) == []


def test_uninstrumented_sdk_is_untouched(server: FakeOpenAIServer) -> None:
    from openai._base_client import AsyncAPIClient, SyncAPIClient
    from openai.resources.chat.completions import Completions

    from agentbolt.instrumentation import instrument_all, uninstrument_all

    originals = (SyncAPIClient.request, AsyncAPIClient.request)
    create = Completions.create
    instrument_all()
    instrument_all()  # idempotent
    assert SyncAPIClient.request is not originals[0] and AsyncAPIClient.request is not originals[1]
    assert Completions.create is create  # the resource methods stay the SDK's own
    uninstrument_all()
    assert (SyncAPIClient.request, AsyncAPIClient.request) == originals


async def test_long_conversation_keeps_every_message(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(101)]

    def call() -> None:
        client.chat.completions.create(model="fake-model", messages=messages)

    spans = await run_traced(tracer, store, rollout, call)
    (span,) = llm_spans(spans)
    assert span.attributes["gen_ai.prompt.100.content"] == "message 100"
    assert len(span.attributes["prompt_token_ids"]) == len(prompt_ids(messages))


async def test_sdk_helpers_stream_parse_and_raw_response(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    messages = [{"role": "user", "content": "helpers"}]
    texts: List[str] = []

    def call() -> None:
        with client.chat.completions.stream(model="fake-model", messages=messages) as stream:
            for _ in stream:
                pass
            texts.append(stream.get_final_completion().choices[0].message.content or "")
        texts.append(client.chat.completions.parse(model="fake-model", messages=messages).choices[0].message.content)
        raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=messages)
        texts.append(raw.parse().choices[0].message.content or "")

    spans = llm_spans(await run_traced(tracer, store, rollout, call))
    assert texts == ["Echo: helpers"] * 3
    assert len(spans) == 3
    assert [span.attributes["gen_ai.request.stream"] for span in spans] == [True, False, False]
    assert spans[0].attributes["gen_ai.completion.0.content"] == "Echo: helpers"
    assert spans[1].attributes["gen_ai.completion.0.content"] == "Echo: helpers"
    assert spans[2].attributes["gen_ai.prompt.0.content"] == "helpers"
    assert spans[2].attributes["gen_ai.completion.0.content"] == "Echo: helpers"


async def test_raw_response_records_response_usage_and_token_ids(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    messages = [{"role": "user", "content": "find cats"}]
    parsed: List[Any] = []

    def call() -> None:
        raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=messages, tools=TOOLS)
        assert raw.headers["content-type"].startswith("application/json")
        parsed.append(raw.parse())
        parsed.append(raw.parse())

    (span,) = llm_spans(await run_traced(tracer, store, rollout, call))
    assert parsed[0] is parsed[1]  # the caller's parse() is the SDK's own, cached as usual
    call_id = parsed[0].choices[0].message.tool_calls[0].id
    attrs = span.attributes
    assert attrs["gen_ai.response.id"] == parsed[0].id
    assert attrs["gen_ai.completion.0.tool_calls.0.id"] == call_id
    assert attrs["gen_ai.completion.0.tool_calls.0.name"] == "search"
    assert attrs["gen_ai.completion.0.finish_reason"] == "tool_calls"
    assert list(attrs["prompt_token_ids"]) == prompt_ids(messages)
    assert list(attrs["response_token_ids"]) == tokenize(json.dumps({"query": "find cats"}))
    assert attrs["gen_ai.usage.input_tokens"] == len(prompt_ids(messages))
    [triplet] = TracerTraceToTriplet().adapt(await store.query_spans(rollout.rollout_id))
    assert triplet.prompt["token_ids"] == prompt_ids(messages)
    assert triplet.response["token_ids"] == tokenize(json.dumps({"query": "find cats"}))


async def test_async_raw_response_and_raw_stream_are_recorded(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
    streamed: List[str] = []

    async def call() -> None:
        raw = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "plain"}]
        )
        assert raw.parse().choices[0].message.content == "Echo: plain"
        raw_stream = await client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": "streamed"}], stream=True
        )
        async for chunk in raw_stream.parse():
            if chunk.choices:
                streamed.append(chunk.choices[0].delta.content or "")

    spans = llm_spans(await run_traced(tracer, store, rollout, call))
    assert "".join(streamed) == "Echo: streamed"
    assert [span.attributes["gen_ai.completion.0.content"] for span in spans] == ["Echo: plain", "Echo: streamed"]
    assert [list(span.attributes["response_token_ids"]) for span in spans] == [
        tokenize("Echo: plain"),
        tokenize("Echo: streamed"),
    ]
    assert spans[1].attributes["gen_ai.request.stream"] is True


async def test_stream_closed_early_still_ends_the_span(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")

    def call() -> None:
        stream = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "a b c d e"}], stream=True
        )
        next(stream)
        next(stream)
        stream.close()

    (span,) = llm_spans(await run_traced(tracer, store, rollout, call))
    assert span.attributes["gen_ai.completion.0.content"] == "Echo:"
    assert span.end_time is not None


async def test_messages_given_as_a_generator_are_sent_and_recorded(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    replies: List[str] = []

    def call() -> None:
        messages = (m for m in [{"role": "user", "content": "from a generator"}])
        replies.append(client.chat.completions.create(model="fake-model", messages=messages).choices[0].message.content)

    (span,) = llm_spans(await run_traced(tracer, store, rollout, call))
    assert replies == ["Echo: from a generator"]
    assert span.attributes["gen_ai.prompt.0.content"] == "from a generator"


def _tls_context(client: Any) -> Any:
    return client._client._transport._pool._ssl_context


async def test_instrumented_clients_share_one_tls_context(traced: Any, server: FakeOpenAIServer) -> None:
    # Building a TLS context parses the CA bundle; clients created per rollout reuse one while instrumented.
    first = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    second = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    assert _tls_context(first) is _tls_context(second)
    assert _tls_context(first).verify_mode.name == "CERT_REQUIRED"
    custom = openai.DefaultHttpxClient(verify=False)
    assert _tls_context(openai.OpenAI(base_url=server.base_url, api_key="test", http_client=custom)) is not (
        _tls_context(first)
    )
    tracer, store, rollout = traced
    spans = await run_traced(
        tracer,
        store,
        rollout,
        lambda: first.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]),
    )
    assert [span.name for span in spans if span.name == SPAN_NAME] == [SPAN_NAME]


def test_uninstrumented_clients_build_their_own_tls_context(server: FakeOpenAIServer) -> None:
    first = openai.OpenAI(base_url=server.base_url, api_key="test")
    second = openai.OpenAI(base_url=server.base_url, api_key="test")
    assert _tls_context(first) is not _tls_context(second)


async def test_stream_abandoned_without_closing_still_ends_the_span(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    received: List[str] = []

    def call() -> None:
        stream = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "stop reading early"}], stream=True
        )
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
            if len(received) == 2:
                break  # neither exhausted nor closed: the caller just drops the stream

    (span,) = llm_spans(await run_traced(tracer, store, rollout, call))
    assert span.status.status_code == "OK"
    assert span.attributes["gen_ai.prompt.0.content"] == "stop reading early"
    assert span.attributes["gen_ai.completion.0.content"] == "".join(received) == "Echo:"
    assert span.end_time is not None and span.start_time is not None and span.end_time >= span.start_time


async def test_stream_abandoned_in_a_reference_cycle_ends_its_span_when_collected(
    traced: Any, server: FakeOpenAIServer
) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")

    def call() -> None:
        holder: Dict[str, Any] = {}
        holder["itself"] = holder  # only the garbage collector frees what the holder keeps
        holder["stream"] = client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "kept in a cycle"}], stream=True
        )
        next(iter(holder["stream"]))
        del holder
        gc.collect()  # the span is ended on a thread of its own, not inside the collection
        for thread in threading.enumerate():
            if thread.name == "agentbolt-stream-end":
                thread.join(timeout=10)

    (span,) = llm_spans(await run_traced(tracer, store, rollout, call))
    assert span.status.status_code == "OK"
    assert span.attributes["gen_ai.prompt.0.content"] == "kept in a cycle"


async def test_async_stream_abandoned_without_closing_still_ends_the_span(
    traced: Any, server: FakeOpenAIServer
) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")

    async def call() -> None:
        stream = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "first chunk only"}], stream=True
        )
        async for _ in stream:
            break
        await stream.response.aclose()  # what the caller does with the connection; the SDK stream stays open

    (span,) = llm_spans(await run_traced(tracer, store, rollout, call))
    assert span.attributes["gen_ai.prompt.0.content"] == "first chunk only"
    assert span.status.status_code == "OK"


async def test_streaming_response_helper_records_the_response(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    messages = [{"role": "user", "content": "find cats"}]
    parsed: List[Any] = []
    streamed: List[str] = []

    def call() -> None:
        with client.chat.completions.with_streaming_response.create(
            model="fake-model", messages=messages, tools=TOOLS
        ) as response:
            parsed.append(response.parse())
        with client.chat.completions.with_streaming_response.create(
            model="fake-model", messages=[{"role": "user", "content": "streamed"}], stream=True
        ) as response:
            for chunk in response.parse():
                streamed.append(chunk.choices[0].delta.content or "" if chunk.choices else "")

    spans = llm_spans(await run_traced(tracer, store, rollout, call))
    assert len(spans) == 2
    attrs = spans[0].attributes
    assert attrs["gen_ai.response.id"] == parsed[0].id
    assert attrs["gen_ai.completion.0.tool_calls.0.id"] == parsed[0].choices[0].message.tool_calls[0].id
    assert list(attrs["response_token_ids"]) == tokenize(json.dumps({"query": "find cats"}))
    assert "".join(streamed) == "Echo: streamed"
    assert spans[1].attributes["gen_ai.completion.0.content"] == "Echo: streamed"
    [first, second] = TracerTraceToTriplet().adapt(await store.query_spans(rollout.rollout_id))
    assert first.prompt["token_ids"] == prompt_ids(messages)
    assert second.response["token_ids"] == tokenize("Echo: streamed")


async def test_async_streaming_response_helper_records_the_response(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
    texts: List[str] = []

    async def call() -> None:
        async with client.chat.completions.with_streaming_response.create(
            model="fake-model", messages=[{"role": "user", "content": "plain"}]
        ) as response:
            texts.append((await response.parse()).choices[0].message.content or "")
        async with client.chat.completions.with_streaming_response.create(
            model="fake-model", messages=[{"role": "user", "content": "streamed"}], stream=True
        ) as response:
            pieces = [chunk.choices[0].delta.content or "" async for chunk in await response.parse() if chunk.choices]
            texts.append("".join(pieces))

    spans = llm_spans(await run_traced(tracer, store, rollout, call))
    assert texts == ["Echo: plain", "Echo: streamed"]
    assert [span.attributes.get("gen_ai.completion.0.content") for span in spans] == texts
    assert all(span.attributes.get("response_token_ids") for span in spans)


# --------------------------------------------------------------------------------------------------------------------
# Legacy text completions (client.completions.create)

OPENAI_CALLS = r"openai\.(chat\.)?completion"
"""The ``llm_call_match`` that trains on chat and text completions alike (the default matches chat completions)."""


def text_spans(spans: Sequence[Span]) -> List[Span]:
    return [span for span in spans if span.name == TEXT_COMPLETION_SPAN_NAME]


async def test_text_completion_is_recorded_with_token_ids_and_logprobs(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    answers: List[str] = []

    def call() -> None:
        answer = client.completions.create(
            model="fake-model", prompt="Once upon", max_tokens=16, temperature=0.25, stop="\n", logprobs=1
        )
        answers.append(answer.choices[0].text)

    spans = await run_traced(tracer, store, rollout, call)
    assert llm_spans(spans) == []
    (span,) = text_spans(spans)
    attrs = span.attributes
    assert answers == ["Echo: Once upon"]
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.system"] == "openai"
    assert attrs["gen_ai.request.model"] == "fake-model"
    assert attrs["gen_ai.request.max_tokens"] == 16
    assert attrs["gen_ai.request.temperature"] == 0.25
    assert list(attrs["gen_ai.request.stop_sequences"]) == ["\n"]
    assert attrs["gen_ai.request.stream"] is False
    assert attrs["gen_ai.prompt.0.role"] == "user"
    assert attrs["gen_ai.prompt.0.content"] == "Once upon"
    assert attrs["gen_ai.completion.0.content"] == "Echo: Once upon"
    assert attrs["gen_ai.completion.0.finish_reason"] == "stop"
    assert str(attrs["gen_ai.response.id"]).startswith("cmpl-")
    assert attrs["gen_ai.response.model"] == "fake-model"
    assert list(attrs["prompt_token_ids"]) == tokenize("Once upon")
    assert list(attrs["response_token_ids"]) == tokenize("Echo: Once upon")
    assert list(attrs["response_logprobs"]) == pytest.approx([-0.01 * (i + 1) for i in range(len("Echo: Once upon"))])
    assert attrs["gen_ai.usage.input_tokens"] == len("Once upon")
    assert attrs["gen_ai.usage.output_tokens"] == len("Echo: Once upon")
    assert span.status.status_code == "OK"
    assert span.rollout_id == rollout.rollout_id


async def test_streamed_text_completion_accumulates_text_and_ids(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    received: List[str] = []

    def call() -> None:
        stream = client.completions.create(
            model="fake-model", prompt="stream this", stream=True, stream_options={"include_usage": True}
        )
        for chunk in stream:
            received.extend(choice.text for choice in chunk.choices)

    (span,) = text_spans(await run_traced(tracer, store, rollout, call))
    attrs = span.attributes
    assert "".join(received) == attrs["gen_ai.completion.0.content"] == "Echo: stream this"
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.completion.0.finish_reason"] == "stop"
    assert list(attrs["prompt_token_ids"]) == tokenize("stream this")
    assert list(attrs["response_token_ids"]) == tokenize("Echo: stream this")
    assert attrs["gen_ai.usage.input_tokens"] == len("stream this")
    assert span.status.status_code == "OK"


async def test_async_text_completions_plain_and_streamed(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
    texts: List[str] = []

    async def call() -> None:
        # A prompt given as token ids, as agents that tokenize themselves send it.
        answer = await client.completions.create(model="fake-model", prompt=tokenize("ids"))
        texts.append(answer.choices[0].text)
        stream = await client.completions.create(model="fake-model", prompt="async stream", stream=True)
        async with stream:
            texts.append("".join([choice.text async for chunk in stream for choice in chunk.choices]))

    spans = text_spans(await run_traced(tracer, store, rollout, call))
    assert texts == ["Echo: ids", "Echo: async stream"]
    assert [span.attributes["gen_ai.completion.0.content"] for span in spans] == texts
    assert json.loads(str(spans[0].attributes["gen_ai.prompt.0.content"])) == tokenize("ids")
    assert [list(span.attributes["response_token_ids"]) for span in spans] == [tokenize(text) for text in texts]
    assert list(spans[1].attributes["prompt_token_ids"]) == tokenize("async stream")
    assert [span.attributes["gen_ai.request.stream"] for span in spans] == [False, True]


async def test_failed_text_completion_is_recorded_as_error(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    server.config.fail_next = 1
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)

    async def call() -> None:
        with pytest.raises(openai.InternalServerError):
            await client.completions.create(model="fake-model", prompt="x")

    (span,) = text_spans(await run_traced(tracer, store, rollout, call))
    assert span.status.status_code == "ERROR"
    assert span.attributes["error.type"] == "InternalServerError"
    assert span.attributes["gen_ai.prompt.0.content"] == "x"
    assert any(event.name == "exception" for event in span.events)


async def test_text_completion_raw_and_streaming_responses_are_recorded(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    texts: List[str] = []

    def call() -> None:
        raw = client.completions.with_raw_response.create(model="fake-model", prompt="raw")
        texts.append(raw.parse().choices[0].text)
        raw_stream = client.completions.with_raw_response.create(model="fake-model", prompt="raw stream", stream=True)
        texts.append("".join(choice.text for chunk in raw_stream.parse() for choice in chunk.choices))
        with client.completions.with_streaming_response.create(model="fake-model", prompt="lazy") as response:
            texts.append(response.parse().choices[0].text)

    spans = text_spans(await run_traced(tracer, store, rollout, call))
    assert texts == ["Echo: raw", "Echo: raw stream", "Echo: lazy"]
    assert [span.attributes["gen_ai.completion.0.content"] for span in spans] == texts
    assert [list(span.attributes["response_token_ids"]) for span in spans] == [tokenize(text) for text in texts]


async def test_text_completion_spans_become_triplets_with_the_openai_calls_match(
    traced: Any, server: FakeOpenAIServer
) -> None:
    tracer, store, rollout = traced
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    messages = [{"role": "user", "content": "chat"}]

    def call() -> None:
        client.completions.create(model="fake-model", prompt="text")
        client.chat.completions.create(model="fake-model", messages=messages)
        for _ in client.completions.create(model="fake-model", prompt="more text", stream=True):
            pass
        emit_reward(0.5)

    spans = await run_traced(tracer, store, rollout, call)
    # The contract's default match is chat completions only.
    assert [t.response["token_ids"] for t in TracerTraceToTriplet().adapt(spans)] == [tokenize("Echo: chat")]
    triplets = TracerTraceToTriplet(llm_call_match=OPENAI_CALLS).adapt(spans)
    assert [t.prompt["token_ids"] for t in triplets] == [tokenize("text"), prompt_ids(messages), tokenize("more text")]
    assert triplets[0].response["token_ids"] == tokenize("Echo: text")
    assert triplets[0].prompt["raw_content"] == [{"role": "user", "content": "text"}]
    assert triplets[0].response["raw_content"][0]["content"] == "Echo: text"
    assert triplets[2].response["token_ids"] == tokenize("Echo: more text")
    assert [t.reward for t in triplets] == [None, None, 0.5]
    conversations = TraceToMessages().adapt(spans)
    assert conversations[0]["messages"] == [
        {"role": "user", "content": "text"},
        {"role": "assistant", "content": "Echo: text"},
    ]


async def test_a_raw_response_method_bound_before_instrumenting_is_recorded(server: FakeOpenAIServer) -> None:
    server.config.token_ids = True
    server.config.fail_next = 0
    client = openai.OpenAI(base_url=server.base_url, api_key="test")
    # What LangChain's ChatOpenAI keeps after its first call: the SDK builds with_raw_response once per client, bound
    # to the create method of that moment.
    chat = client.chat.completions.with_raw_response.create
    text = client.completions.with_streaming_response.create
    async with traced_rollout() as traced:

        def call() -> None:
            assert chat(model="fake-model", messages=[{"role": "user", "content": "bound"}]).parse().choices
            with text(model="fake-model", prompt="bound early") as response:
                assert response.parse().choices[0].text == "Echo: bound early"

        spans = await run_traced(*traced, call)
    (chat_span,) = llm_spans(spans)
    (text_span,) = text_spans(spans)
    assert chat_span.attributes["gen_ai.completion.0.content"] == "Echo: bound"
    assert list(chat_span.attributes["response_token_ids"]) == tokenize("Echo: bound")
    assert text_span.attributes["gen_ai.completion.0.content"] == "Echo: bound early"


async def test_the_agent_name_header_names_the_call_without_a_gateway(traced: Any, server: FakeOpenAIServer) -> None:
    tracer, store, rollout = traced
    writer = openai.OpenAI(
        base_url=server.base_url, api_key="test", default_headers={"X-Agentbolt-Agent-Name": "writer"}
    )
    plain = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")

    async def call() -> None:
        writer.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "draft"}])
        await plain.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "check"}],
            extra_headers={"x-agentbolt-agent-name": "critic"},
        )
        await plain.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "anyone"}])

    spans = await run_traced(tracer, store, rollout, call)
    assert [span.attributes.get("agentbolt.llm.agent_name") for span in llm_spans(spans)] == ["writer", "critic", None]
    triplets = TracerTraceToTriplet(agent_match="^writer$")(spans)
    assert [t.prompt["token_ids"] for t in triplets] == [prompt_ids([{"role": "user", "content": "draft"}])]
