"""The gateway applies the ``sampling_parameters`` of a rollout's LLM resource to calls that do not set them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, List

import httpx
import pytest

from agentbolt.gateway.app import Gateway, GatewaySettings
from agentbolt.gateway.sampling import SamplingDefaults, with_sampling_defaults
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import LLM, AttemptedRollout, PromptTemplate, ProxyLLM

from .conftest import ProxyFactory, wait_for_spans
from .fake_backend import FakeBackend

GREEDY = {"temperature": 0.0, "max_tokens": 16}


async def _rollout_with(store: InMemoryLightningStore, **resources: Any) -> AttemptedRollout:
    update = await store.add_resources(resources)
    return await store.start_rollout(input={"task": "sampling"}, resources_id=update.resources_id)


async def _call(url: str, body: Dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **body}
        )
    assert response.status_code == 200, response.text


def _bound_url(endpoint: str, rollout: AttemptedRollout) -> str:
    return f"{endpoint}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"


async def test_a_call_without_parameters_gets_the_resources_and_the_span_records_them(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    rollout = await _rollout_with(
        store, main_llm=ProxyLLM(endpoint="http://gateway/v1", model="echo", sampling_parameters=GREEDY)
    )
    async with make_proxy() as proxy:
        await _call(_bound_url(proxy.endpoint, rollout), {"model": "echo"})
        [span] = await wait_for_spans(store, rollout.rollout_id, 1)
    assert backend.requests[-1]["temperature"] == 0.0 and backend.requests[-1]["max_tokens"] == 16
    assert span.attributes["gen_ai.request.temperature"] == 0.0
    assert span.attributes["gen_ai.request.max_tokens"] == 16


async def test_what_the_agent_passes_wins(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    rollout = await _rollout_with(store, main_llm=LLM(endpoint="http://x/v1", model="echo", sampling_parameters=GREEDY))
    async with make_proxy() as proxy:
        await _call(_bound_url(proxy.endpoint, rollout), {"model": "echo", "temperature": 0.9})
        await _call(_bound_url(proxy.endpoint, rollout), {"model": "echo", "max_completion_tokens": 4})
    first, second = backend.requests[-2:]
    assert first["temperature"] == 0.9 and first["max_tokens"] == 16
    assert second["temperature"] == 0.0 and second["max_completion_tokens"] == 4 and "max_tokens" not in second


async def test_calls_not_bound_to_a_rollout_and_other_models_are_left_alone(
    make_proxy: ProxyFactory, backend: FakeBackend, store: InMemoryLightningStore
) -> None:
    rollout = await _rollout_with(
        store,
        main_llm=LLM(endpoint="http://x/v1", model="slow", sampling_parameters=GREEDY),
        prompt=PromptTemplate(template="{q}", engine="f-string"),
    )
    async with make_proxy() as proxy:
        await _call(f"{proxy.endpoint}/v1", {"model": "echo"})
        await _call(_bound_url(proxy.endpoint, rollout), {"model": "echo"})
    assert all("temperature" not in body for body in backend.requests[-2:])


async def test_the_gateway_setting_turns_it_off(store: InMemoryLightningStore) -> None:
    for enabled in (True, False):
        gateway = Gateway([], store, GatewaySettings(sampling_defaults=enabled))
        async with gateway.serving():
            assert (gateway.sampling is not None) is enabled


async def test_resources_disagreeing_on_one_model_apply_nothing_and_warn_once(
    store: InMemoryLightningStore, caplog: pytest.LogCaptureFixture
) -> None:
    rollout = await _rollout_with(
        store,
        a=LLM(endpoint="http://x/v1", model="m", sampling_parameters={"temperature": 0.0}),
        b=LLM(endpoint="http://y/v1", model="m", sampling_parameters={"temperature": 1.0}),
        c=LLM(endpoint="http://y/v1", model="n", sampling_parameters={"temperature": 0.3}),
    )
    defaults = SamplingDefaults(store)
    with caplog.at_level(logging.WARNING, logger="agentbolt.gateway"):
        assert await defaults.for_call(rollout.rollout_id, "m") == {}
        second = await _rollout_with(
            store,
            a=LLM(endpoint="http://x/v1", model="m", sampling_parameters={"top_p": 1}),
            b=LLM(endpoint="http://y/v1", model="m", sampling_parameters={"top_p": 0.5}),
        )
        assert await defaults.for_call(second.rollout_id, "m") == {}
    assert await defaults.for_call(rollout.rollout_id, "n") == {"temperature": 0.3}
    assert sum("different sampling_parameters" in r.getMessage() for r in caplog.records) == 1


async def test_unknown_rollouts_and_rollouts_without_resources_get_nothing(store: InMemoryLightningStore) -> None:
    bare = await store.start_rollout(input={})
    defaults = SamplingDefaults(store)
    assert await defaults.for_call("ro-unknown", "m") == {}
    assert await defaults.for_call(bare.rollout_id, "m") == {}


async def test_a_rollout_keeps_the_parameters_of_its_first_call(store: InMemoryLightningStore) -> None:
    rollout = await _rollout_with(store, llm=LLM(endpoint="http://x/v1", model="m", sampling_parameters=GREEDY))
    defaults = SamplingDefaults(store)
    assert await defaults.for_call(rollout.rollout_id, "m") == GREEDY
    assert rollout.resources_id is not None
    await store.update_resources(rollout.resources_id, {"llm": LLM(endpoint="http://x/v1", model="m")})
    assert await defaults.for_call(rollout.rollout_id, "m") == GREEDY


async def test_a_store_that_fails_gives_no_defaults_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenStore(InMemoryLightningStore):
        async def get_rollout_by_id(self, rollout_id: str) -> Any:
            raise ConnectionError("store is down")

    defaults = SamplingDefaults(BrokenStore())
    with caplog.at_level(logging.WARNING, logger="agentbolt.gateway"):
        assert await defaults.for_call("ro-1", "m") == {}
        assert await defaults.for_call("ro-2", "m") == {}
    assert sum("store is down" in r.getMessage() for r in caplog.records) == 1


def test_max_tokens_and_max_completion_tokens_count_as_one() -> None:
    assert with_sampling_defaults({"max_completion_tokens": 4}, {"max_tokens": 16, "top_p": 0.9}) == {
        "max_completion_tokens": 4,
        "top_p": 0.9,
    }
    assert with_sampling_defaults({"max_tokens": 4}, {"max_completion_tokens": 16}) == {"max_tokens": 4}


async def test_calls_arriving_while_a_rollouts_parameters_are_read_share_that_one_read() -> None:
    """The first calls of a rollout arriving together used to read the store once each, and got their sequence ids in
    the order those reads ended rather than the order they arrived."""
    lookups: List[str] = []

    class SlowStore(InMemoryLightningStore):
        async def get_rollout_by_id(self, rollout_id: str) -> Any:
            lookups.append(rollout_id)
            await asyncio.sleep(0.05)  # a remote store's round trip
            return await super().get_rollout_by_id(rollout_id)

    store = SlowStore()
    rollout = await _rollout_with(store, llm=LLM(endpoint="http://x/v1", model="m", sampling_parameters=GREEDY))
    defaults = SamplingDefaults(store)
    finished: List[int] = []

    async def call(index: int) -> Dict[str, Any]:
        found = await defaults.for_call(rollout.rollout_id, "m")
        finished.append(index)
        return found

    assert await asyncio.gather(*(call(index) for index in range(20))) == [GREEDY] * 20
    assert lookups == [rollout.rollout_id]
    assert finished == list(range(20))  # they go on in the order they arrived
    assert await defaults.for_call(rollout.rollout_id, "m") == GREEDY and len(lookups) == 1
