"""Backend connections failing at every point of an answer: which failures the gateway retries, what the client gets.

The fake backend here writes its HTTP answers by hand, so that an answer can stop anywhere (before its first byte, in
its headers, within its body) and the connection can end with a close or a reset, which no real inference server can
be made to do on purpose.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Literal, Sequence

import httpx
import openai
import orjson
import pytest

from agentbolt.types import AttemptedRollout

from .conftest import ProxyFactory, wait_for_spans

Ending = Literal["keep", "close", "reset"]


@dataclass
class Answer:
    """What the fake backend writes after reading one request, and how it then ends the connection.

    ``end``: ``"keep"`` it open for the next request, ``"close"`` it (FIN), or ``"reset"`` it (RST: the kernel
    drops it at once, as when a backend process dies with data still unread).
    """

    data: bytes
    end: Ending = "keep"


def json_answer(body: Dict[str, Any], status: str = "200 OK") -> bytes:
    data = orjson.dumps(body)
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    return head.encode() + data


def chat_completion(content: str) -> Dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"id": "cmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def chunk_event(content: str) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": content}}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def sse_answer(*events: bytes) -> bytes:
    """An event-stream answer in chunked encoding, one HTTP chunk per event, without the final empty chunk."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)


class FakeHandWrittenBackend:
    """A fake OpenAI-compatible backend on 127.0.0.1 answering each request with the next scripted :class:`Answer`.

    The last answer is repeated for any further request. ``requests`` holds the request bodies received, in order.
    """

    def __init__(self, *answers: Answer) -> None:
        self.answers = answers
        self.requests: List[Dict[str, Any]] = []
        self._server: asyncio.Server | None = None
        self.base_url = ""

    def model_list(self, model: str = "m") -> List[Dict[str, Any]]:
        return [{"model_name": model, "litellm_params": {"model": f"hosted_vllm/{model}", "api_base": self.base_url}}]

    async def __aenter__(self) -> FakeHandWrittenBackend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.requests.append(orjson.loads(await reader.readexactly(length)))
                answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
                writer.write(answer.data)
                await writer.drain()
                if answer.end == "reset":
                    sock = writer.transport.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if answer.end == "close":
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """The URL of a port that refuses connections: bound, so that nothing else takes it, but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _rollout_url(proxy: Any, rollout: AttemptedRollout) -> str:
    return proxy.as_resource(rollout.rollout_id, rollout.attempt.attempt_id, model="m").endpoint


async def _post_chat(url: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(f"{url}/v1/chat/completions", json=CHAT)


async def test_an_answer_cut_within_its_body_is_a_502_without_retry(
    make_proxy: ProxyFactory, store: Any, rollout: AttemptedRollout
) -> None:
    whole = json_answer(chat_completion("Hello there"))
    async with (
        FakeHandWrittenBackend(Answer(whole[: len(whole) - 20], "close")) as backend,
        make_proxy(model_list=backend.model_list(), num_retries=2) as proxy,
    ):
        response = await _post_chat(_rollout_url(proxy, rollout))
        spans = await wait_for_spans(store, rollout.rollout_id, 1)
    assert len(backend.requests) == 1
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "upstream_error"
    assert backend.base_url in error["message"]
    assert "dropped the connection while answering" in error["message"] and "not retried" in error["message"]
    assert spans[0].status.status_code == "ERROR" and spans[0].attributes["error.type"] == "upstream_error"


async def test_the_openai_sdk_does_not_retry_a_cut_answer_either(make_proxy: ProxyFactory) -> None:
    """The SDK retries a 502 by default (here twice); ``x-should-retry: false`` keeps it to the one generation."""
    openai = pytest.importorskip("openai")
    whole = json_answer(chat_completion("Hello there"))
    async with (
        FakeHandWrittenBackend(Answer(whole[: len(whole) - 20], "close")) as backend,
        make_proxy(model_list=backend.model_list(), num_retries=2) as proxy,
    ):
        client = openai.AsyncOpenAI(base_url=f"{proxy.endpoint}/v1", api_key="unused", max_retries=2)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(**CHAT)
        await client.close()
    assert caught.value.status_code == 502 and caught.value.response.headers["x-should-retry"] == "false"
    assert len(backend.requests) == 1


async def test_an_answer_cut_within_its_headers_is_a_502_without_retry(make_proxy: ProxyFactory) -> None:
    async with (
        FakeHandWrittenBackend(Answer(b"HTTP/1.1 200 OK\r\ncontent-type: appl", "close")) as backend,
        make_proxy(model_list=backend.model_list(), num_retries=2) as proxy,
    ):
        response = await _post_chat(proxy.endpoint)
    assert len(backend.requests) == 1
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "upstream_error"
    assert "HTTP 200 answer ended within the headers" in error["message"] and "not retried" in error["message"]


async def test_a_connection_closed_before_any_byte_of_the_answer_is_retried(make_proxy: ProxyFactory) -> None:
    """As a pooled keep-alive connection that the backend had closed fails."""
    answers = (Answer(b"", "close"), Answer(json_answer(chat_completion("Hello there"))))
    async with (
        FakeHandWrittenBackend(*answers) as backend,
        make_proxy(model_list=backend.model_list(), num_retries=1) as proxy,
    ):
        response = await _post_chat(proxy.endpoint)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello there"
    assert len(backend.requests) == 2


async def test_a_connection_reset_before_any_byte_of_the_answer_is_retried_then_502(make_proxy: ProxyFactory) -> None:
    async with (
        FakeHandWrittenBackend(Answer(b"", "reset")) as backend,
        make_proxy(model_list=backend.model_list(), num_retries=2) as proxy,
    ):
        response = await _post_chat(proxy.endpoint)
    assert len(backend.requests) == 3
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "upstream_unavailable"
    assert "closed the connection without answering after 3 attempt(s)" in error["message"]


async def test_a_refused_connection_is_retried_on_the_next_deployment(
    make_proxy: ProxyFactory, refusing_url: str
) -> None:
    async with FakeHandWrittenBackend(Answer(json_answer(chat_completion("Hello there")))) as backend:
        refusing = {"model_name": "m", "litellm_params": {"model": "hosted_vllm/m", "api_base": refusing_url}}
        async with make_proxy(model_list=[refusing, *backend.model_list()], num_retries=1) as proxy:
            # Round robin: one of the two calls starts with the refusing deployment, whichever comes first.
            responses = [await _post_chat(proxy.endpoint) for _ in range(2)]
    assert [response.status_code for response in responses] == [200, 200]
    assert len(backend.requests) == 2


async def _stream_until_error(url: str) -> tuple[List[str], BaseException]:
    """The contents streamed through the SDK before the stream's error, and that error."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    received: List[str] = []
    try:
        stream = await client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True)
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    except openai.APIError as exc:
        return received, exc
    finally:
        await client.close()
    raise AssertionError(f"the stream ended without an error after {received}")


async def test_a_stream_reset_right_after_its_events_forwards_them_all_then_the_error_event(
    make_proxy: ProxyFactory, store: Any, rollout: AttemptedRollout
) -> None:
    # Sent at once with the reset: the gateway's HTTP client holds them all when it learns of the reset.
    pieces = ["Hel", "lo ", "the", "re"]
    async with (
        FakeHandWrittenBackend(Answer(sse_answer(*map(chunk_event, pieces)), "reset")) as backend,
        make_proxy(model_list=backend.model_list()) as proxy,
    ):
        received, error = await _stream_until_error(_rollout_url(proxy, rollout))
        spans = await wait_for_spans(store, rollout.rollout_id, 1)
    assert received == pieces
    assert "dropped the stream connection" in str(error)
    assert spans[0].status.status_code == "ERROR"
    assert spans[0].attributes["gen_ai.completion.0.content"] == "Hello there"


async def test_a_last_event_without_its_blank_line_is_forwarded_as_an_event_before_the_error_event(
    make_proxy: ProxyFactory,
) -> None:
    unterminated = chunk_event("re")[:-1]  # the data line is whole; the blank line ending the event never comes
    answer = sse_answer(chunk_event("Hel"), unterminated)
    async with (
        FakeHandWrittenBackend(Answer(answer, "close")) as backend,
        make_proxy(model_list=backend.model_list()) as proxy,
    ):
        received, error = await _stream_until_error(proxy.endpoint)
    assert received == ["Hel", "re"]
    assert "dropped the stream connection" in str(error)


@pytest.mark.parametrize("cut", [1, 2], ids=["blank-line-missing", "line-end-missing"])
async def test_a_stream_ending_cleanly_within_its_last_event_forwards_it_once_then_the_error_event(
    make_proxy: ProxyFactory, cut: int
) -> None:
    """The backend ends its answer properly (last chunk of the chunked body) but in the middle of its last event."""
    unterminated = chunk_event("re")[:-cut]
    answer = sse_answer(chunk_event("Hel"), unterminated) + b"0\r\n\r\n"
    async with (
        FakeHandWrittenBackend(Answer(answer)) as backend,
        make_proxy(model_list=backend.model_list()) as proxy,
    ):
        received, error = await _stream_until_error(proxy.endpoint)
    assert received == ["Hel", "re"]
    assert isinstance(error, openai.APIError) and "ended before its last event" in str(error)


@pytest.mark.parametrize(
    ("status", "error_type"), [("507 Insufficient Storage", "insufficient_storage"), ("529 Overloaded", "overloaded")]
)
async def test_server_errors_outside_500_to_504_pass_through_unretried(
    make_proxy: ProxyFactory, store: Any, rollout: AttemptedRollout, status: str, error_type: str
) -> None:
    body = {"error": {"message": f"backend says {status}", "type": error_type}}
    async with (
        FakeHandWrittenBackend(Answer(json_answer(body, status))) as backend,
        make_proxy(model_list=backend.model_list(), num_retries=2) as proxy,
    ):
        response = await _post_chat(_rollout_url(proxy, rollout))
        spans: Sequence[Any] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert len(backend.requests) == 1
    assert response.status_code == int(status.split()[0])
    assert response.json() == body
    assert spans[0].status.status_code == "ERROR"
    assert spans[0].attributes["error.type"] == "upstream_server_error"
