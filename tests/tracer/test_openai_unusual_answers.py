"""The OpenAI instrumentation against answers real servers give: broken strings, dropped streams, failures.

The server is a scripted stand-in for an OpenAI-compatible API (a real HTTP server on 127.0.0.1, FastAPI + uvicorn):
each request gets the next scripted answer, as a JSON body or as server-sent events, possibly cut mid-stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, AsyncIterator, Dict, Iterator, List, Tuple, Union

import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from support.fake_openai import FakeOpenAIServer
from support.servers import free_port

from agentbolt.instrumentation.openai import SPAN_NAME, instrument_openai, uninstrument_openai
from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore

from .test_openai_tracing import Traced, llm_spans, run_traced, traced_rollout

MESSAGES = [{"role": "user", "content": "hi"}]

Event = Union[str, Dict[str, Any]]


class Script:
    """What the stand-in answers, one entry per request, in order."""

    def __init__(self) -> None:
        self.answers: List[Tuple[str, Any]] = []
        self.arrived = threading.Event()
        self.release = threading.Event()

    def json(self, body: Union[str, Dict[str, Any]], status: int = 200) -> None:
        self.answers.append(("json", (status, body)))

    def events(self, events: List[Event], *, cut: bool = False) -> None:
        """Server-sent events; ``cut`` drops the connection after them instead of ending the stream."""
        self.answers.append(("sse", (events, cut)))

    def hang(self) -> None:
        """Answer only once :attr:`release` is set (:attr:`arrived` tells the request came)."""
        self.answers.append(("hang", None))


def stand_in_app(script: Script) -> FastAPI:
    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        await request.body()
        kind, payload = script.answers.pop(0)
        if kind == "hang":
            script.arrived.set()
            await asyncio.to_thread(script.release.wait)
            return Response("{}", media_type="application/json")
        if kind == "json":
            status, body = payload
            text = body if isinstance(body, str) else json.dumps(body)
            return Response(text, status_code=status, media_type="application/json")
        events, cut = payload

        async def stream() -> AsyncIterator[str]:
            for event in events:
                yield event if isinstance(event, str) else f"data: {json.dumps(event)}\n\n"
            if cut:
                raise ConnectionAbortedError("the stand-in drops the connection mid-stream")

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def chunk(delta: Dict[str, Any], finish: Any = None, **choice: Any) -> Dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}],
    }


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


@pytest.fixture(scope="module")
def server(script: Script) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(app=stand_in_app(script)) as running:
        yield running


@pytest.fixture
async def traced(script: Script) -> AsyncIterator[Traced]:
    script.answers.clear()
    async with traced_rollout() as running:
        yield running


# A JSON escape of half a surrogate pair decodes to a string with no UTF-8 form.
BROKEN_COMPLETION = (
    '{"id": "chatcmpl-2", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"index": 0, '
    '"message": {"role": "assistant", "content": "bad \\ud800 text"}, "finish_reason": "stop", "logprobs": '
    '{"content": [{"token": "\\udcff", "logprob": -1.0, "bytes": [255], "top_logprobs": []}]}}], '
    '"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'
)


async def test_lone_surrogates_in_a_response_are_recorded_replaced(
    traced: Any, server: FakeOpenAIServer, script: Script
) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    contents: List[str] = []

    def call() -> None:
        answer = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True)
        contents.append(answer.choices[0].message.content or "")

    script.json(BROKEN_COMPLETION)
    (span,) = llm_spans(await run_traced(*traced, call))
    assert contents == ["bad \ud800 text"]  # the caller's answer is the SDK's, as it is
    attrs = span.attributes
    assert attrs["gen_ai.completion.0.content"] == "bad \ufffd text"
    assert [entry["token"] for entry in json.loads(str(attrs["logprobs.content"]))] == ["\ufffd"]
    assert list(attrs["response_logprobs"]) == [-1.0]
    assert attrs["gen_ai.usage.output_tokens"] == 1
    span.model_dump_json()  # writable as JSON


async def test_a_lone_surrogate_in_an_error_message_is_recorded_replaced(
    server: FakeOpenAIServer, script: Script, caplog: pytest.LogCaptureFixture
) -> None:
    # Spans travel to a store server over OTLP, whose encoder drops (and logs) strings UTF-8 cannot carry.
    script.answers.clear()
    script.json('{"error": {"message": "bad \\ud800 request", "type": "invalid_request_error"}}', status=400)
    store_server = LightningStoreServer(InMemoryLightningStore(thread_safe=True), host="127.0.0.1", port=free_port())
    await store_server.start()
    store = LightningStoreClient(store_server.endpoint)
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    raised: List[str] = []

    def call() -> None:
        try:
            client.chat.completions.create(model="m", messages=MESSAGES)
        except openai.BadRequestError as exc:
            raised.append(str(exc))

    try:
        with caplog.at_level(logging.WARNING):
            async with traced_rollout(store) as traced:
                spans = llm_spans(await run_traced(*traced, call))
    finally:
        await store.close()
        await store_server.stop()
    assert raised == ["Error code: 400 - bad \ud800 request"]  # the caller's error is the SDK's, as it is
    (span,) = spans
    (event,) = [event for event in span.events if event.name == "exception"]
    assert event.attributes["exception.message"] == "Error code: 400 - bad \ufffd request"
    assert "bad \ufffd request" in str(event.attributes["exception.stacktrace"])
    assert event.attributes["exception.type"] == "openai.BadRequestError"
    assert span.status.status_code == "ERROR"
    assert span.status.description == "BadRequestError: Error code: 400 - bad \ufffd request"
    assert span.attributes["error.type"] == "BadRequestError"
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


async def test_a_stream_dropped_after_unrecordable_chunks_raises_the_sdk_error(
    traced: Any, server: FakeOpenAIServer, script: Script
) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    received: List[Any] = []
    broken_logprobs = {"content": [{"token": "\udcff", "logprob": -0.5, "bytes": [2**70], "top_logprobs": []}]}
    script.events(
        [
            chunk({"role": "assistant", "content": "He"}, logprobs=broken_logprobs),
            chunk({"content": [{"type": "text", "text": "\ud83d"}]}),
            chunk({"content": "llo"}),
        ],
        cut=True,
    )

    def call() -> None:
        with pytest.raises(openai.APIConnectionError):
            for piece in client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
                received.append(piece.choices[0].delta.content)

    (span,) = llm_spans(await run_traced(*traced, call))
    assert received == ["He", [{"type": "text", "text": "\ud83d"}], "llo"]
    assert span.status.status_code == "ERROR"
    assert span.attributes["error.type"] == "APIConnectionError"
    assert str(span.attributes["gen_ai.completion.0.content"]).startswith("He")
    assert str(span.attributes["gen_ai.completion.0.content"]).endswith("llo")
    assert json.loads(str(span.attributes["logprobs.content"]))[0]["bytes"] == [2**70]


async def test_error_answers_reach_the_caller_unchanged(traced: Any, server: FakeOpenAIServer, script: Script) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    raised: List[BaseException] = []
    script.json({"error": {"message": "bad request", "type": "invalid_request_error"}}, status=400)
    script.events([chunk({"role": "assistant", "content": "par"}), chunk({"content": "tial"})], cut=True)

    async def call() -> None:
        try:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        except openai.BadRequestError as exc:
            raised.append(exc)
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        try:
            async for _ in stream:
                pass
        except openai.APIConnectionError as exc:
            raised.append(exc)

    spans = llm_spans(await run_traced(*traced, call))
    assert [type(exc) for exc in raised] == [openai.BadRequestError, openai.APIConnectionError]
    assert [span.attributes["error.type"] for span in spans] == ["BadRequestError", "APIConnectionError"]
    assert spans[1].attributes["gen_ai.completion.0.content"] == "partial"


async def test_a_raw_response_method_kept_after_uninstrumenting_records_nothing(
    traced: Any, server: FakeOpenAIServer, script: Script
) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    answer = {
        "id": "chatcmpl-3",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
    for _ in range(3):
        script.json(answer)

    def call() -> None:
        # with_raw_response (what LangChain's ChatOpenAI calls) keeps the method it was built with
        client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        uninstrument_openai()
        try:
            client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
            client.chat.completions.create(model="m", messages=MESSAGES)
        finally:
            instrument_openai()

    spans = llm_spans(await run_traced(*traced, call))
    assert len(spans) == 1


async def test_a_cancelled_langchain_agent_leaves_no_model_call_open(
    traced: Any, server: FakeOpenAIServer, script: Script
) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_core.runnables import RunnableLambda
    from langchain_openai import ChatOpenAI

    tracer, _, _ = traced
    model = ChatOpenAI(base_url=server.base_url, api_key="test", model="m", max_retries=0)
    script.arrived.clear()
    script.release.clear()
    script.hang()

    async def agent(question: str) -> Any:
        return (await model.ainvoke(question)).content

    async def call() -> None:
        task = asyncio.create_task(
            RunnableLambda(agent).ainvoke("q", config={"callbacks": [tracer.get_langchain_handler()]})
        )
        await asyncio.to_thread(script.arrived.wait)  # the model call is under way at the server
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        spans = await run_traced(*traced, call)
    finally:
        script.release.set()
    by_name = {span.name: span for span in spans}
    chain, model_call = by_name["langchain.Chain.agent"], by_name["langchain.llm.ChatOpenAI"]
    assert model_call.parent_id == chain.span_id
    assert chain.status.status_code == model_call.status.status_code == "ERROR"
    assert any(event.name == "exception" for event in model_call.events)
    assert by_name[SPAN_NAME].attributes["error.type"] == "CancelledError"
