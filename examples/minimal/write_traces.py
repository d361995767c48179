"""Write the spans of one rollout to a store, with ``OtelTracer`` or the default tracer (``AgentOpsTracer``).

The agent opens a custom OpenTelemetry span, runs an ``operation``, optionally calls an OpenAI-compatible model
(traced by the default tracer's OpenAI SDK instrumentation) and emits a reward. Afterwards the spans are read back
from the store and printed in the order the store issued their sequence ids.

Three places for the spans to go (``--store``):

* ``memory`` (default): an in-process ``InMemoryLightningStore``; spans are written directly.
* ``server``: a ``LightningStoreServer`` started in this process on a free port, reached through a
  ``LightningStoreClient``: spans travel over OTLP/HTTP to the server's ``/v1/traces``.
* ``http://HOST:PORT``: a running ``agl store`` / ``agentbolt store`` server, also over OTLP.

Usage::

    python -m examples.minimal.write_traces
    python -m examples.minimal.write_traces --tracer agentops --store server
    agl store --port 4747 &  python -m examples.minimal.write_traces --store http://127.0.0.1:4747
    python -m examples.minimal.write_traces --tracer agentops --llm-base-url http://127.0.0.1:8000/v1 --model M
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import AsyncIterator, List, Optional

from opentelemetry import trace

import agentbolt as agl
from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from agentbolt.utils.server_launcher import pick_free_port
from examples.common.environment import CONFIGURATION_ERROR, require_reachable

TRACERS = {"otel": agl.OtelTracer, "agentops": agl.AgentOpsTracer}


async def agent(question: str, llm_base_url: Optional[str], model: str) -> None:
    """A small agent whose every step becomes a span of the active rollout."""
    tracer = trace.get_tracer("examples.minimal")
    with (
        tracer.start_as_current_span("plan", attributes={"question": question}),
        agl.operation(name="lookup", source="notes"),
    ):
        facts = ["Paris is the capital of France."]
    answer = facts[0]
    if llm_base_url is not None:
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=llm_base_url, api_key="unused") as client:
            reply = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], max_tokens=16
            )
        answer = reply.choices[0].message.content or ""
    agl.emit_reward(1.0 if "Paris" in answer else 0.0)


@contextlib.asynccontextmanager
async def open_store(where: str) -> AsyncIterator[agl.LightningStore]:
    """The store named by ``--store``: ``memory``, ``server`` (started here) or the URL of a running server."""
    if where == "memory":
        yield agl.InMemoryLightningStore(thread_safe=True)
        return
    server: Optional[LightningStoreServer] = None
    if where == "server":
        server = LightningStoreServer(agl.InMemoryLightningStore(thread_safe=True), host="127.0.0.1",
                                      port=pick_free_port("127.0.0.1"))  # fmt: skip
        await server.start()
        where = server.endpoint
    elif not where.startswith(("http://", "https://")):
        raise SystemExit(f"--store must be 'memory', 'server' or an http(s) URL, not {where!r}")
    client = LightningStoreClient(where)
    try:
        yield client
    finally:
        await client.close()
        if server is not None:
            await server.stop()


async def write_traces(
    tracer_name: str = "otel",
    store_location: str = "memory",
    llm_base_url: Optional[str] = None,
    model: str = "gpt-4o-mini",
) -> List[agl.Span]:
    """Run the agent once inside a trace context and return the spans the store holds for that rollout."""
    tracer = TRACERS[tracer_name]()
    async with open_store(store_location) as store:
        tracer.init_worker(0, store)
        try:
            rollout = await store.start_rollout(input={"question": "What is the capital of France?"})
            async with tracer.trace_context(rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
                await agent("What is the capital of France?", llm_base_url, model)
            return list(await store.query_spans(rollout.rollout_id, sort_by="sequence_id"))
        finally:
            tracer.teardown_worker(0)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.minimal.write_traces", description=__doc__.split("\n")[0])
    parser.add_argument("--tracer", choices=sorted(TRACERS), default="otel")
    parser.add_argument("--store", default="memory", help="memory, server, or the URL of a running store server")
    parser.add_argument("--llm-base-url", default=None, help="an OpenAI-compatible endpoint to call once (optional)")
    parser.add_argument("--model", default="gpt-4o-mini")
    args = parser.parse_args(argv)
    if args.store not in ("memory", "server"):
        if not args.store.startswith(("http://", "https://")):
            parser.exit(
                CONFIGURATION_ERROR,
                f"error: --store must be 'memory', 'server' or an http(s) URL, not {args.store!r}\n",
            )
        require_reachable(
            parser,
            args.store,
            service="the store server",
            configure="start one (agl store --port PORT) or use --store memory or --store server",
        )
    if args.llm_base_url is not None:
        require_reachable(
            parser,
            f"{args.llm_base_url.rstrip('/')}/models",
            service="the OpenAI-compatible endpoint",
            configure="start one (agentbolt serve smollm2-135m-instruct --port PORT) or drop --llm-base-url",
        )
    spans = asyncio.run(write_traces(args.tracer, args.store, args.llm_base_url, args.model))
    names = {span.span_id: span.name for span in spans}
    for span in spans:
        parent = names.get(span.parent_id or "", "-")
        print(f"{span.sequence_id:>3}  {span.name:<40} parent={parent}")
    print(f"{len(spans)} spans stored for rollout {spans[0].rollout_id if spans else '?'}")


if __name__ == "__main__":
    main()
