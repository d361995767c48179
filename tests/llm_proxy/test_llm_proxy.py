"""The LLMProxy facade: configuration checks, resources, launch modes (thread, mp) with real stores."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

import agentbolt as agl
from agentbolt.gateway.routing import ModelRouter, UnknownModelError
from agentbolt.llm_proxy import LLMProxy, get_active_llm_proxy, set_active_llm_proxy
from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.types import LLM, ProxyLLM
from agentbolt.utils.server_launcher import PythonServerLauncherArgs

from .conftest import model_list_for, wait_for_spans
from .fake_backend import RESPONSE_TOKENS, FakeBackend

ONE_MODEL = [{"model_name": "m", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://127.0.0.1:1/v1"}}]


def test_exported_at_top_level() -> None:
    assert agl.LLMProxy is LLMProxy


def test_defaults_and_aliases() -> None:
    proxy = LLMProxy(model_list=ONE_MODEL, num_retries=2)
    assert proxy.middlewares == ["rollout_attempt", "stream_conversion"]
    assert proxy.callbacks == ["return_token_ids", "logprobs", "opentelemetry"]
    assert proxy.litellm_config == {"litellm_settings": {"num_retries": 2}}
    assert proxy.server_launcher_args.launch_mode == "mp"
    assert proxy.server_launcher_args.healthcheck_url == "/health"
    assert proxy.get_store() is None and not proxy.is_running()
    with pytest.raises(ValueError, match="Invalid middleware alias: 'nope'"):
        LLMProxy(middlewares=["nope"])
    with pytest.raises(ValueError, match="Invalid callback alias: 'litellm'"):
        LLMProxy(callbacks=["litellm"])
    with pytest.raises(ValueError, match="launcher_args"):
        LLMProxy(port=1234, launcher_args=PythonServerLauncherArgs())


def test_model_list_is_validated_with_clear_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"model_list\[0\].litellm_params.api_base is required for hosted_vllm"):
        LLMProxy(model_list=[{"model_name": "m", "litellm_params": {"model": "hosted_vllm/m"}}])
    with pytest.raises(ValueError, match=r"model_list\[0\].model_name"):
        ModelRouter([{"litellm_params": {"model": "openai/x"}}])
    with pytest.raises(ValueError, match="not set"):
        ModelRouter([{"model_name": "m", "litellm_params": {"model": "openai/x", "api_key": "os.environ/NO_SUCH_VAR"}}])
    monkeypatch.setenv("MY_KEY", "sk-test")
    router = ModelRouter(
        [{"model_name": "m", "litellm_params": {"model": "openai/gpt-x", "api_key": "os.environ/MY_KEY", "timeout": 5}}]
    )
    [deployment] = router.deployments()
    assert (deployment.api_key, deployment.upstream_model, deployment.token_ids) == ("sk-test", "gpt-x", False)
    assert deployment.timeout == 5.0 and deployment.api_base.startswith("https://")
    with pytest.raises(UnknownModelError, match="Available models: m"):
        router.candidates("other")
    proxy = LLMProxy(model_list=ONE_MODEL)
    with pytest.raises(ValueError, match="model_list"):
        proxy.update_model_list([{"model_name": "m"}])  # type: ignore[list-item]
    assert proxy.model_list == ONE_MODEL


def test_as_resource() -> None:
    proxy = LLMProxy(model_list=ONE_MODEL, launch_mode="thread", port=4321)
    resource = proxy.as_resource(sampling_parameters={"temperature": 0.2})
    assert isinstance(resource, ProxyLLM)
    assert resource.model == "m" and resource.sampling_parameters == {"temperature": 0.2}
    assert resource.get_base_url("ro-1", "at-1") == "http://127.0.0.1:4321/rollout/ro-1/attempt/at-1"
    bound = proxy.as_resource("ro-1", "at-1")
    assert type(bound) is LLM and bound.endpoint == "http://127.0.0.1:4321/rollout/ro-1/attempt/at-1"
    with pytest.raises(ValueError, match="both"):
        proxy.as_resource("ro-1")
    # Ids are escaped as ProxyLLM.get_base_url escapes them: one rule for both ways of binding.
    assert proxy.as_resource("ro 1?", "at-1").endpoint == resource.get_base_url("ro 1?", "at-1")
    assert proxy.as_resource("ro 1?", "at-1").endpoint == "http://127.0.0.1:4321/rollout/ro%201%3F/attempt/at-1"
    with pytest.raises(ValueError, match="path segment"):
        proxy.as_resource("ro/1", "at-1")
    with pytest.raises(ValueError, match="No models found"):
        LLMProxy().as_resource()
    two = LLMProxy(model_list=[*ONE_MODEL, {**ONE_MODEL[0], "model_name": "n"}])
    with pytest.raises(ValueError, match="Several models"):
        two.as_resource()
    assert two.as_resource(model="n").model == "n"


async def test_start_needs_a_store_with_the_right_capability(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="needs a store"):
        await LLMProxy(model_list=ONE_MODEL).start()
    with pytest.raises(RuntimeError, match="'zero_copy'"):
        await LLMProxy(model_list=ONE_MODEL, store=InMemoryLightningStore()).start()
    with pytest.raises(RuntimeError, match="'thread_safe'"):
        await LLMProxy(model_list=ONE_MODEL, store=InMemoryLightningStore(), launch_mode="thread").start()
    with caplog.at_level(logging.WARNING, logger="agentbolt.llm_proxy"):
        await LLMProxy(model_list=ONE_MODEL).stop()
    assert "not running" in caplog.text


def test_active_proxy_registry() -> None:
    proxy = LLMProxy(model_list=ONE_MODEL)
    set_active_llm_proxy(proxy)
    assert get_active_llm_proxy() is proxy


async def test_thread_mode_with_sqlite_store_and_restart(backend: FakeBackend, tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "store.db")
    rollout = await store.start_rollout(input={"q": 1})
    proxy = LLMProxy(model_list=model_list_for(backend)[:1], store=store, launch_mode="thread")
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    url = proxy.as_resource(rollout.rollout_id, rollout.attempt.attempt_id).endpoint + "/v1/chat/completions"
    try:
        await proxy.restart()  # starts a proxy that is not running
        assert proxy.is_running() and get_active_llm_proxy() is proxy
        async with httpx.AsyncClient() as client:
            assert (await client.post(url, json=body)).status_code == 200
            await proxy.restart()
            assert (await client.post(url, json=body)).status_code == 200
    finally:
        await proxy.stop()
    spans = await wait_for_spans(store, rollout.rollout_id, 2)
    assert [s.attributes["response_token_ids"] for s in spans] == [RESPONSE_TOKENS, RESPONSE_TOKENS]
    assert spans[0].sequence_id < spans[1].sequence_id
    await store.close()


async def test_mp_mode_writes_through_a_store_server(backend: FakeBackend) -> None:
    server = LightningStoreServer(InMemoryLightningStore(thread_safe=True), launch_mode="thread")
    await server.start()
    rollout = await server.start_rollout(input={"q": 1})
    proxy = LLMProxy(model_list=model_list_for(backend)[:1], store=server)  # launch_mode="mp": a forked process
    try:
        await proxy.start()
        url = proxy.as_resource(rollout.rollout_id, rollout.attempt.attempt_id).endpoint + "/v1/chat/completions"
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url, json={"model": "echo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            )
        assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
        # The gateway process handed the stream's span over before [DONE]: once flushed, it is in the store.
        assert await proxy.flush(30.0)
        spans = await server.query_spans(rollout.rollout_id)
    finally:
        await proxy.stop()
        await server.stop()
    assert len(spans) == 1
    assert spans[0].attributes["response_token_ids"] == RESPONSE_TOKENS
    assert spans[0].attributes["gen_ai.request.stream"] is True
