"""VERL's vLLM rollout servers, instrumented so that every response carries token ids (verl 0.9.1, vLLM >= 0.10.2).

VERL runs each rollout replica's vLLM as vLLM's own OpenAI server (``vLLMHttpServer``). The gateway asks it for
token ids on every call; :class:`PatchedvLLMServer` also makes them the server's default
(:func:`agentbolt.instrumentation.vllm.instrument_vllm`), so calls that reach a replica without the gateway are
recorded with token ids as well. :func:`use_patched_vllm_server` makes VERL build its ``vllm`` replicas with it;
the task runner calls it when ``agentbolt.instrument_vllm`` is true (the default).

Importing this module imports vLLM: it runs on GPU nodes only and is not exercised on the CPU test machines.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

__all__ = ["PatchedvLLMReplica", "PatchedvLLMServer", "use_patched_vllm_server"]


class PatchedvLLMServer(vLLMHttpServer):
    """``vLLMHttpServer`` whose OpenAI server returns token ids unless a request opts out."""

    async def launch_server(self, *args: Any, **kwargs: Any) -> Any:
        from agentbolt.instrumentation.vllm import instrument_vllm, is_vllm_instrumented

        if not is_vllm_instrumented():
            instrument_vllm()  # in this actor's process, where vLLM's API server runs
        return await super().launch_server(*args, **kwargs)


class PatchedvLLMReplica(vLLMReplica):
    """A ``vllm`` rollout replica whose servers are :class:`PatchedvLLMServer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(PatchedvLLMServer)


def use_patched_vllm_server() -> None:
    """Make VERL's ``vllm`` rollout replicas (created in this process from now on) use :class:`PatchedvLLMServer`."""
    RolloutReplicaRegistry.register("vllm", lambda: PatchedvLLMReplica)
