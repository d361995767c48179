"""Error paths of the gateway against a scripted fake backend: timeouts, retries, bad bodies, dropped streams."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from agentbolt.gateway import Gateway, GatewaySettings, create_app
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.types import AttemptedRollout
from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

from .conftest import ProxyFactory, model_list_for, wait_for_spans
from .fake_backend import FakeBackend


def _url(proxy: object, rollout: AttemptedRollout) -> str:
    return proxy.as_resource(rollout.rollout_id, rollout.attempt.attempt_id, model="echo").endpoint  # type: ignore[attr-defined]


async def test_unknown_model_is_404_listing_models(make_proxy: ProxyFactory) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 404
    error = response.json()["error"]
    assert "'nope'" in error["message"] and "echo" in error["message"]
    assert error["available_models"][:2] == ["echo", "slow"]
    # The shape of OpenAI's and agentbolt serve's answer, so clients that test ``code`` recognise it
    assert (error["type"], error["param"], error["code"]) == ("not_found_error", "model", "model_not_found")


async def test_bad_request_bodies_are_400(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        url = f"{proxy.endpoint}/v1/chat/completions"
        not_json = await client.post(url, content=b"{oops", headers={"content-type": "application/json"})
        not_object = await client.post(url, json=[1, 2])
        no_model = await client.post(url, json={"messages": [{"role": "user", "content": "hi"}]})
        # orjson reads such an integer as an inexact float: forwarded, the client's value would silently change
        wide = await client.post(
            url, json={"model": "echo", "messages": [{"role": "user", "content": "hi"}], "metadata": {"id": 2**64}}
        )
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    assert not_object.status_code == 400 and "JSON object" in not_object.json()["error"]["message"]
    assert no_model.status_code == 400 and "'model'" in no_model.json()["error"]["message"]
    assert wide.status_code == 400 and wide.json()["error"]["param"] == "metadata.id"
    assert "beyond 64 bits" in wide.json()["error"]["message"]
    assert backend.requests == []


async def test_integers_up_to_64_bits_and_long_digit_strings_are_forwarded_exactly(
    make_proxy: ProxyFactory, backend: FakeBackend
) -> None:
    extra = {"metadata": {"largest": 2**64 - 1, "smallest": -(2**63), "text": "12345678901234567890123456789"}}
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "user", "content": "hi"}], **extra},
        )
    assert response.status_code == 200
    assert backend.requests[0]["metadata"] == extra["metadata"]


async def test_slow_backend_times_out_with_504_and_span_records_it(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    config = {"litellm_settings": {"request_timeout": 0.2}}
    async with make_proxy(litellm_config=config) as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{_url(proxy, rollout)}/v1/chat/completions",
            json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]},
        )
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert response.status_code == 504
    assert "timed out after 0.2 s" in response.json()["error"]["message"]
    assert len(spans) == 1
    assert spans[0].status.status_code == "ERROR"
    assert spans[0].attributes["error.type"] == "upstream_timeout"
    assert spans[0].attributes["gen_ai.request.model"] == "slow"


async def test_500s_are_retried_then_502(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy(num_retries=2) as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "fail500", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert "HTTP 500" in message and "3 attempt(s)" in message and "engine crashed" in message
    assert backend.count("fail500") == 3


async def test_transient_503s_are_retried_to_success(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy(num_retries=2) as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "flaky", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello there"
    assert backend.count("flaky") == 3


async def test_rate_limit_is_retried_then_429(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy(num_retries=1) as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "ratelimit", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 429
    assert "slow down" in response.json()["error"]["message"]
    assert backend.count("ratelimit") == 2


async def test_client_errors_pass_through_unretried(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy(num_retries=3) as proxy:
        client = openai.AsyncOpenAI(base_url=f"{proxy.endpoint}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="max_tokens is too large"):
            await client.chat.completions.create(model="badrequest", messages=[{"role": "user", "content": "x"}])
        await client.close()
    assert backend.count("badrequest") == 1


async def test_malformed_upstream_json_is_502(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{_url(proxy, rollout)}/v1/chat/completions",
            json={"model": "malformed", "messages": [{"role": "user", "content": "hi"}]},
        )
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert response.status_code == 502
    assert "malformed JSON" in response.json()["error"]["message"]
    assert spans[0].status.status_code == "ERROR"
    assert spans[0].attributes["error.type"] == "upstream_malformed_response"


async def test_stream_dropped_midway_gives_error_event_and_failed_span(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        client = openai.AsyncOpenAI(base_url=_url(proxy, rollout), api_key="unused", max_retries=0)
        received = []
        with pytest.raises(openai.APIError, match="dropped the stream"):
            stream = await client.chat.completions.create(
                model="drop", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for chunk in stream:
                received.append(chunk.choices[0].delta.content)
        await client.close()
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert received == ["", "Hel"]  # the events before the drop arrived unchanged
    span = spans[0]
    assert span.status.status_code == "ERROR"
    assert "dropped the stream" in (span.status.description or "")
    assert span.attributes["gen_ai.completion.0.content"] == "Hel"
    assert span.attributes["response_token_ids"] == [7]


async def _streamed_text(proxy: Any, rollout: AttemptedRollout, model: str) -> str:
    """The text of a streamed chat call through the SDK."""
    client = openai.AsyncOpenAI(base_url=_url(proxy, rollout), api_key="unused", max_retries=0)
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    finally:
        await client.close()


async def test_an_answer_quoting_the_end_marker_is_recorded_whole(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        content = await _streamed_text(proxy, rollout, "quotes_done")
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert content.startswith("say data: [DONE]")
    span = spans[0]
    assert span.status.status_code == "OK"
    assert span.attributes["gen_ai.completion.0.content"] == content


async def test_a_stream_written_without_the_optional_spaces_ends_cleanly(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    # "data:[DONE]" is the same event as "data: [DONE]" (the space after the colon is optional).
    body = {"model": "compact", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with make_proxy() as proxy, httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(f"{_url(proxy, rollout)}/chat/completions", json=body)
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert answer.status_code == 200 and answer.text.endswith("data:[DONE]\n\n"), answer.text[-200:]
    assert spans[0].status.status_code == "OK"
    assert spans[0].attributes["gen_ai.completion.0.content"] == "Hello there"


async def test_a_stream_without_its_last_event_ends_with_an_error_event(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        with pytest.raises(openai.APIError, match="ended before its last event"):
            await _streamed_text(proxy, rollout, "nodone")
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert spans[0].status.status_code == "ERROR"


async def test_an_answer_with_an_escaped_lone_surrogate_is_relayed_and_recorded(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy:
        client = openai.AsyncOpenAI(base_url=_url(proxy, rollout), api_key="unused", max_retries=0)
        completion = await client.chat.completions.create(
            model="surrogate", messages=[{"role": "user", "content": "hi"}]
        )
        await client.close()
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "a\ud83d b"  # what the backend sent, as the SDK reads it
    assert spans[0].status.status_code == "OK"
    # kept by an in-memory store, replaced by U+FFFD where the store writes JSON
    assert spans[0].attributes["gen_ai.completion.0.content"] in ("a\ud83d b", "a\ufffd b")


async def test_an_answer_the_client_left_before_is_recorded_as_not_seen(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout
) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        with pytest.raises(httpx.TimeoutException):
            await client.post(
                f"{_url(proxy, rollout)}/v1/chat/completions",
                json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]},
                timeout=0.5,
            )
        spans = await wait_for_spans(store, rollout.rollout_id, 1)  # type: ignore[arg-type]
    assert spans[0].status.status_code == "ERROR"
    assert spans[0].attributes["error.type"] == "client_closed"
    assert spans[0].attributes["gen_ai.completion.0.content"]  # what the backend answered is kept


async def test_unreachable_backend_is_502(make_proxy: ProxyFactory) -> None:
    dead = [{"model_name": "dead", "litellm_params": {"model": "openai/x", "api_base": "http://127.0.0.1:9/v1"}}]
    async with make_proxy(model_list=dead, num_retries=1) as proxy, httpx.AsyncClient() as client:
        response = await client.post(
            f"{proxy.endpoint}/v1/chat/completions",
            json={"model": "dead", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 502
    assert "unreachable after 2 attempt(s)" in response.json()["error"]["message"]


async def test_health_does_not_contact_backends(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy() as proxy, httpx.AsyncClient() as client:
        for _ in range(20):
            health = await client.get(f"{proxy.endpoint}/health")
            assert health.status_code == 200
        models = await client.get(f"{proxy.endpoint}/v1/models")
    assert health.json()["status"] == "ok"
    assert [m["id"] for m in models.json()["data"]][:3] == ["echo", "slow", "fail500"]
    assert backend.requests == []


async def test_a_hanging_store_does_not_stall_answers_and_spans_wait_for_it(backend: FakeBackend) -> None:
    # A store server that accepts connections but never answers (a real socket, not a mock).
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read(-1)

    hanging = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = hanging.sockets[0].getsockname()[1]
    store = LightningStoreClient(f"http://127.0.0.1:{port}", retry_delays=(), health_retry_delays=())
    settings = GatewaySettings(sequence_wait=0.2, stop_timeout=0.5)
    gateway = Gateway(model_list_for(backend)[:1], store, settings)
    launcher = PythonServerLauncher(
        create_app(gateway), PythonServerLauncherArgs(launch_mode="asyncio"), serve_context=gateway.serving
    )
    await launcher.start()
    url = f"{launcher.access_endpoint}/rollout/ro-1/attempt/at-1/v1/chat/completions"
    try:
        async with httpx.AsyncClient() as client:
            response = await client.post(url, json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 200  # answered once sequence_wait passed
            for writer in writers:  # now the store drops its connections: the sequence id is retried, not given up
                writer.close()
            for _ in range(100):
                if gateway.sequences is not None and gateway.sequences.unreachable:
                    break
                await asyncio.sleep(0.05)
            assert gateway.sequences is not None and gateway.sequences.unreachable
            # While the store is known to be unreachable, answers do not wait for sequence ids at all.
            response = await client.post(url, json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 200
            spans = (await client.get(f"{launcher.access_endpoint}/health")).json()["spans"]
        assert spans == {"queued": 2, "written": 0, "dropped": 0, "failed": 0, "repaired": 0, "lost": 0}
    finally:
        await launcher.stop()
        hanging.close()
        await store.close()
    assert gateway.writer is None  # stopped; the spans never written were counted as lost when it stopped


async def test_api_key_is_required_when_configured(make_proxy: ProxyFactory, backend: FakeBackend) -> None:
    async with make_proxy(api_key="s3cret") as proxy, httpx.AsyncClient() as client:
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        missing = await client.post(f"{proxy.endpoint}/v1/chat/completions", json=body)
        wrong = await client.get(f"{proxy.endpoint}/v1/models", headers={"authorization": "Bearer nope"})
        health = await client.get(f"{proxy.endpoint}/health")
        resource = proxy.as_resource(model="echo")
        sdk = openai.AsyncOpenAI(base_url=f"{resource.get_base_url(None, None)}/v1", api_key=resource.api_key)  # type: ignore[call-arg]
        completion = await sdk.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x"}])
        await sdk.close()
    assert missing.status_code == 401 and "API key" in missing.json()["error"]["message"]
    assert wrong.status_code == 401 and health.status_code == 200
    assert completion.choices[0].message.content == "Hello there"
    assert backend.count("echo") == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/no-such-route"),  # unknown route
        ("GET", "/v1/chat/completions"),  # wrong method
        ("DELETE", "/v1/models"),
        ("POST", "/flush"),
        ("GET", "/rollout/ro-1/attempt/at-1/v1/models"),
    ],
)
async def test_without_the_key_every_request_is_401_before_routing(
    make_proxy: ProxyFactory, method: str, path: str
) -> None:
    async with make_proxy(api_key="s3cret") as proxy, httpx.AsyncClient() as client:
        missing = await client.request(method, proxy.endpoint + path)
        wrong = await client.request(method, proxy.endpoint + path, headers={"authorization": "Bearer nope"})
        keyed = await client.request(method, proxy.endpoint + path, headers={"authorization": "Bearer s3cret"})
    for answer in (missing, wrong):
        assert answer.status_code == 401, (path, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer"
        assert answer.json()["error"]["code"] == "invalid_api_key"
    assert keyed.status_code != 401


async def test_health_and_the_openapi_document_are_open_with_a_key(make_proxy: ProxyFactory) -> None:
    async with make_proxy(api_key="s3cret") as proxy, httpx.AsyncClient() as client:
        health = await client.get(f"{proxy.endpoint}/health")
        document = await client.get(f"{proxy.endpoint}/openapi.json")
    assert health.status_code == 200 and document.status_code == 200
    assert "bearer" in str(document.json()["components"]).lower()


async def test_large_bodies_are_decoded_off_the_event_loop(
    make_proxy: ProxyFactory, store: object, rollout: AttemptedRollout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding and checking a body of megabytes takes long: it runs on a worker thread, a small one on the loop."""
    import threading

    from agentbolt.gateway import app as gateway_app

    threads = []
    parse = gateway_app.parse_json_object

    def recording_parse(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return parse(*args)

    monkeypatch.setattr(gateway_app, "parse_json_object", recording_parse)
    big = "x" * (2 << 20)
    async with make_proxy() as proxy, httpx.AsyncClient(timeout=60) as client:
        for content in ("hi", big):
            response = await client.post(
                f"{_url(proxy, rollout)}/v1/chat/completions",
                json={"model": "echo", "messages": [{"role": "user", "content": content}]},
            )
            assert response.status_code == 200
        spans = await wait_for_spans(store, rollout.rollout_id, 2)  # type: ignore[arg-type]
    assert len(spans) == 2
    loop_thread = threading.get_ident()
    assert threads[0] == loop_thread and threads[1] != loop_thread
