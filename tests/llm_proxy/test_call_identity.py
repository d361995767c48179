"""The gateway gives every call an id (``x-request-id``) that its span and the SDK instrumentation's span share."""

from __future__ import annotations

from typing import Any, Dict, List

import openai
import pytest

from agentbolt.adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, TraceToMessages
from agentbolt.llm_proxy import LLMProxy
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer

from .conftest import model_list_for, wait_for_spans
from .fake_backend import FakeBackend

CALL_ID = "agentbolt.llm.call_id"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


async def test_gateway_and_sdk_records_of_each_call_share_its_id(backend: FakeBackend) -> None:
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "identity"})
    ids = (rollout.rollout_id, rollout.attempt.attempt_id)
    proxy = LLMProxy(model_list=model_list_for(backend), store=store, launch_mode="asyncio")
    await proxy.start()
    tracer = AgentOpsTracer()
    headers: List[str] = []
    try:
        with tracer.lifespan(store):
            base_url = proxy.as_resource(model="echo").get_base_url(*ids)  # type: ignore[call-arg]
            client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            messages: List[Dict[str, Any]] = [{"role": "user", "content": "hi"}]
            async with tracer.trace_context("identity", rollout_id=ids[0], attempt_id=ids[1]):
                plain = await client.chat.completions.create(model="echo", messages=messages, tools=TOOLS)
                headers.append(plain._request_id or "")
                raw = await client.chat.completions.with_raw_response.create(model="echo", messages=messages)
                headers.append(raw.headers["x-request-id"])
                stream = await client.chat.completions.create(model="echo", messages=messages, stream=True)
                async for _ in stream:
                    pass
                headers.append(stream.response.headers["x-request-id"])
                with pytest.raises(openai.InternalServerError) as failed:
                    await client.chat.completions.create(model="fail500", messages=messages)
                headers.append(failed.value.request_id or "")
            await client.close()
        spans = await wait_for_spans(store, rollout.rollout_id, 9)
    finally:
        await proxy.stop()

    assert all(h.startswith("agentbolt-") for h in headers) and len(set(headers)) == 4
    gateway = [s for s in spans if s.name == "agentbolt.llm_call"]
    sdk = [s for s in spans if s.name == "openai.chat.completion"]
    assert [s.attributes[CALL_ID] for s in sorted(gateway, key=lambda s: s.sequence_id)] == headers
    assert sorted(str(s.attributes[CALL_ID]) for s in sdk) == sorted(headers)
    # Three answered calls, recorded twice each: one sample per call from every adapter.
    assert len(TraceToMessages()(spans)) == 4  # the failed call keeps its prompt
    assert len(LlmProxyTraceToTriplet()(spans)) == 3
    both = TracerTraceToTriplet(llm_call_match=r"openai\.chat\.completion|agentbolt\.llm_call")(spans)
    assert len(both) == 4 and len(TracerTraceToTriplet()(spans)) == 4
