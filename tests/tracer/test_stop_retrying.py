"""An OtelTracer told to stop retrying (its process was stopping with the store gone) and then started again in the
same process (a second ``Trainer.fit``, a restarted runner) rides out store outages again.

The store is a real ``agentbolt store`` subprocess on SQLite, killed and started again on the same file and port.
Spans reach it over OTLP/HTTP (the client's default) or directly through the store API.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Literal

import pytest
from support.servers import StoreServerProcess

from agentbolt.store.base import LightningStoreCapabilities
from agentbolt.store.client_server import LightningStoreClient
from agentbolt.tracer import OtelTracer
from agentbolt.types import AttemptedRollout


class DirectClient(LightningStoreClient):
    """The real client, without the OTLP endpoint: the tracer writes spans through the store API instead."""

    @property
    def capabilities(self) -> LightningStoreCapabilities:
        return LightningStoreCapabilities({**super().capabilities, "otlp_traces": False})  # type: ignore[typeddict-item]


async def _trace_operation(tracer: OtelTracer, rollout: AttemptedRollout, *, stop: bool = False) -> None:
    """Trace one operation, named after the rollout's task, for the rollout; with ``stop``, the process then stops."""
    name = rollout.input["task"]
    async with tracer.trace_context(name, rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        with tracer.operation_context(name):
            pass
        if stop:
            tracer.stop_retrying()


@pytest.mark.parametrize("path", ["otlp", "direct"])
async def test_a_tracer_started_again_after_stop_retrying_retries_through_an_outage(
    store_server_process: StoreServerProcess, path: Literal["otlp", "direct"]
) -> None:
    server = store_server_process
    store = LightningStoreClient(server.endpoint) if path == "otlp" else DirectClient(server.endpoint)
    tracer = OtelTracer(write_timeout=60.0)
    try:
        # A first run stops while its store is gone: its spans are given up instead of retried.
        tracer.init_worker(0, store)
        first = await store.start_rollout(input={"task": "first"})
        server.stop(signal.SIGKILL)
        await _trace_operation(tracer, first, stop=True)
        await asyncio.to_thread(tracer.teardown_worker, 0)

        # The same tracer is started again for a second run; its store goes away in the middle of the run.
        server.start()
        tracer.init_worker(0, store)
        second = await store.start_rollout(input={"task": "second"})
        ended = server.outage("kill", 2.0)
        await _trace_operation(tracer, second)
        await asyncio.to_thread(tracer.teardown_worker, 0)  # waits (up to write_timeout) for the spans to be written
        await asyncio.to_thread(ended.join, 60)
        assert not server.errors

        names = {span.name for span in await store.query_spans(second.rollout_id)}
        assert "second" in names, names
    finally:
        await store.close()
