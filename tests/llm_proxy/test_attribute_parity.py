"""One call traced twice, by the OpenAI SDK instrumentation and by the gateway, records the same attributes.

The agent's SDK calls go through the gateway, so each call yields an ``openai.chat.completion`` span (tracer) and an
``agentbolt.llm_call`` span (gateway) in the same rollout. Both are built by ``agentbolt.llm_call_attributes``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import openai
import pytest

from agentbolt.instrumentation.openai import SPAN_NAME
from agentbolt.llm_proxy import LLMProxy
from agentbolt.semconv import AGL_LLM_CALL
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import AgentOpsTracer
from agentbolt.types import Span

from .conftest import model_list_for
from .fake_backend import FakeBackend

# Only the gateway knows the backend it picked and the HTTP status it answered with.
GATEWAY_ONLY = {"server.address", "http.response.status_code"}
# The provider is "openai" for the SDK (the API it spoke) and the deployment's provider for the gateway.
SAME_KEY_OTHER_VALUE = {"gen_ai.system"}

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def _comparable(span: Span) -> Dict[str, Any]:
    return {key: (list(v) if isinstance(v, tuple) else v) for key, v in span.attributes.items()}


async def _both_spans(backend: FakeBackend, **request: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    store = InMemoryLightningStore(thread_safe=True)
    rollout = await store.start_rollout(input={"task": "parity"})
    proxy = LLMProxy(model_list=model_list_for(backend), store=store, launch_mode="asyncio")  # type: ignore[arg-type]
    await proxy.start()
    tracer = AgentOpsTracer()
    try:
        with tracer.lifespan(store):
            base_url = proxy.as_resource(model="echo").get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)  # type: ignore[call-arg]
            client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
                if request.get("stream"):
                    stream = await client.chat.completions.create(model="echo", **request)
                    async for _ in stream:
                        pass
                else:
                    await client.chat.completions.create(model="echo", **request)
            await client.close()
        assert await proxy.flush(30.0)
    finally:
        await proxy.stop()
    spans: List[Span] = list(await store.query_spans(rollout.rollout_id))
    [sdk] = [span for span in spans if span.name == SPAN_NAME]
    [gateway] = [span for span in spans if span.name == AGL_LLM_CALL]
    return _comparable(sdk), _comparable(gateway)


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_sdk_and_gateway_record_the_same_keys_and_values(backend: FakeBackend, stream: bool) -> None:
    sdk, gateway = await _both_spans(
        backend,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        n=1,
        stop=["\n\n"],
        max_completion_tokens=32,
        temperature=0.5,
        stream=stream,
    )
    assert set(sdk) == set(gateway) - GATEWAY_ONLY
    for key in set(sdk) - SAME_KEY_OTHER_VALUE:
        assert sdk[key] == gateway[key], key
    # The keys the OpenTelemetry GenAI conventions name, recorded alike whichever way the call was traced.
    for span in (sdk, gateway):
        assert span["gen_ai.request.choice.count"] == 1
        assert span["gen_ai.request.stream"] is stream
        assert span["gen_ai.request.stop_sequences"] == ["\n\n"]
        assert span["gen_ai.request.max_tokens"] == 32
        assert span["gen_ai.usage.input_tokens"] == len(span["prompt_token_ids"])
        assert span["gen_ai.usage.output_tokens"] == len(span["response_token_ids"]) == 4
        assert span["gen_ai.completion.0.tool_calls.0.name"] == "get_weather"
        assert len(span["response_logprobs"]) == 4
