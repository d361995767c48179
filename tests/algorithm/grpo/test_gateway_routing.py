"""GRPO routes its policy through a user's LLM gateway without taking the gateway's other models away."""

from __future__ import annotations

from typing import Any, Dict, List

import agentbolt as agl
from agentbolt.algorithm.grpo.algorithm import GRPO
from agentbolt.llm_proxy import LLMProxy

JUDGE: Dict[str, Any] = {
    "model_name": "judge",
    "litellm_params": {"model": "hosted_vllm/judge", "api_base": "http://127.0.0.1:9/v1"},
}


class StubPolicyServer:
    """Stands in for the served policy: only its name and address reach the gateway."""

    base_url = "http://127.0.0.1:9/v1"

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def stop(self) -> None:
        pass


def _names(proxy: LLMProxy) -> List[str]:
    return [entry["model_name"] for entry in proxy.model_list]


async def test_the_policy_is_added_next_to_the_gateways_models_and_removed_after_the_run() -> None:
    store = agl.InMemoryLightningStore()
    proxy = LLMProxy(model_list=[JUDGE], store=store, launch_mode="asyncio", host="127.0.0.1")
    algorithm = GRPO(served_model_name="policy")
    algorithm.set_llm_proxy(proxy)
    stub = StubPolicyServer("policy")
    algorithm._start_server = lambda trainer, tokenizer: stub  # type: ignore[assignment,method-assign]
    await proxy.start()
    try:
        async with algorithm._serving(store, None, None) as (_, routed):  # type: ignore[arg-type]
            assert routed is proxy
            assert _names(proxy) == ["judge", "policy"]
            stub.model_name = "policy-v2"  # a remote server's next adapter version
            assert algorithm._route(proxy, stub)  # type: ignore[arg-type]
            assert _names(proxy) == ["judge", "policy-v2"]
            assert not algorithm._route(proxy, stub)  # type: ignore[arg-type]
        assert proxy.is_running()  # the user's proxy is left running, with its own models only
        assert proxy.model_list == [JUDGE]
    finally:
        await proxy.stop()
