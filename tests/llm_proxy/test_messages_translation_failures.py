"""A chat backend's answer that the Messages translation cannot read: the client gets an error, and the call's span
records it as failed, since the agent never saw an answer it could use.

The backend here is the hand-written fake of ``test_gateway_upstream_failures``: it writes answers that are valid
HTTP and JSON but not chat completions, which no real inference server does on purpose.
"""

from __future__ import annotations

import json
from typing import Any, Dict

import httpx
import orjson

from agentbolt.llm_proxy import LLMProxy
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import AttemptedRollout

from .conftest import ProxyFactory, wait_for_spans
from .test_gateway_upstream_failures import Answer, FakeHandWrittenBackend, chunk_event, json_answer, sse_answer

MESSAGE: Dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
NOT_A_CHUNK = b'data: {"id": "c", "choices": [{"index": 0, "delta": "not an object"}]}\n\n'


def _url(proxy: LLMProxy, rollout: AttemptedRollout) -> str:
    return f"{proxy.endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/messages"


async def test_an_answer_that_is_not_a_chat_completion_is_a_502_and_a_failed_span(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    answer = json_answer({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": "hi"}]})
    async with (
        FakeHandWrittenBackend(Answer(answer)) as backend,
        make_proxy(model_list=backend.model_list()) as proxy,
        httpx.AsyncClient(timeout=30) as http,
    ):
        response = await http.post(_url(proxy, rollout), json=MESSAGE)
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert response.status_code == 502, response.text
    assert response.json()["error"]["type"] == "api_error"
    assert span.status.status_code == "ERROR" and span.attributes["http.response.status_code"] == 502
    assert span.attributes["error.type"] == "upstream_malformed_response"


async def test_a_stream_event_that_is_not_a_chat_chunk_ends_the_stream_and_fails_the_span(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    """The broken event and the end of the stream arrive together: the span must not be written as a success."""
    stream = sse_answer(chunk_event("Hel"), NOT_A_CHUNK + chunk_event("lo") + b"data: [DONE]\n\n") + b"0\r\n\r\n"
    async with (
        FakeHandWrittenBackend(Answer(stream)) as backend,
        make_proxy(model_list=backend.model_list()) as proxy,
        httpx.AsyncClient(timeout=30) as http,
    ):
        response = await http.post(_url(proxy, rollout), json={**MESSAGE, "stream": True})
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    events = [json.loads(line[len("data: ") :]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "error" and "not a chat chunk" in events[-1]["error"]["message"], events
    assert not any(event["type"] == "message_stop" for event in events)
    assert span.status.status_code == "ERROR" and span.attributes["http.response.status_code"] == 502
    assert span.attributes["error.type"] == "upstream_malformed_response"
    assert span.attributes["gen_ai.completion.0.content"] == "Hello"


async def test_a_stream_cut_by_an_untranslatable_event_is_not_recorded_as_a_client_that_left(
    make_proxy: ProxyFactory, store: InMemoryLightningStore, rollout: AttemptedRollout
) -> None:
    """The broken event comes while the backend is still streaming: the gateway ends the call, the client did not."""
    stream = sse_answer(chunk_event("Hel"), NOT_A_CHUNK)  # the backend then keeps the connection open
    async with (
        FakeHandWrittenBackend(Answer(stream)) as backend,
        make_proxy(model_list=backend.model_list()) as proxy,
        httpx.AsyncClient(timeout=30) as http,
    ):
        response = await http.post(_url(proxy, rollout), json={**MESSAGE, "stream": True})
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    last = orjson.loads(response.text.rstrip().splitlines()[-1][len("data: ") :])
    assert last["type"] == "error" and "not a chat chunk" in last["error"]["message"]
    assert span.status.status_code == "ERROR" and span.attributes["error.type"] == "upstream_malformed_response"
