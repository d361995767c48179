"""Debug the room selector before optimizing it: one rollout in isolation, a hook printing its spans, a dry run.

    python -m examples.apo.apo_debug              # Trainer.dev: the seed prompt on 3 tasks, every span logged
    python -m examples.apo.apo_debug --mode runner  # one rollout with LitAgentRunner.step, then the stored spans
    python -m examples.apo.apo_debug --mode hook    # the same rollout, spans printed by a Hook as it ends
    python -m examples.apo.apo_debug --hosted       # the agent calls OPENAI_BASE_URL instead of the embedded model

``Trainer.dev`` uses the ``Baseline`` algorithm: it enqueues the tasks with the initial resources and logs each
rollout as it finishes (status, spans, the adapted conversation), without changing the prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any, Optional, Sequence

import agentbolt as agl
from agentbolt.utils.server_launcher import pick_free_port
from examples.apo.room_selector import load_room_tasks, prompt_template_baseline, room_selector
from examples.apo.room_selector_apo import EMBEDDED_MODEL, check_hosted, embedded_model
from examples.common.arguments import count


class DebugHook(agl.Hook):
    """Print every span the tracer collected when a rollout's trace ends."""

    async def on_trace_end(self, *, agent: Any, runner: Any, tracer: Any, rollout: Any) -> None:
        print(f"Spans of rollout {rollout.rollout_id}:")
        for span in tracer.get_last_trace():
            print(f"- {span.name}: {dict(span.attributes or {})}")


async def run_one(with_hook: bool) -> None:
    """One rollout outside any trainer: a runner, a tracer and an in-memory store."""
    tracer = agl.AgentOpsTracer()
    runner = agl.LitAgentRunner(tracer)
    store = agl.InMemoryLightningStore()
    task = load_room_tasks("train")[0]
    with runner.run_context(agent=room_selector, store=store, hooks=[DebugHook()] if with_hook else None):
        rollout = await runner.step(task, resources={"prompt_template": prompt_template_baseline()})
    print(f"Rollout {rollout.rollout_id} finished: {rollout.status}")
    if not with_hook:
        for span in await store.query_spans(rollout.rollout_id):
            print(f"- {span.name}: {dict(span.attributes)}")


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Debug the room selector agent.")
    parser.add_argument("--mode", choices=["dev", "runner", "hook"], default="dev")
    parser.add_argument("--tasks", type=count(), default=3, help="tasks of the dry run")
    parser.add_argument("--hosted", action="store_true", help="call OPENAI_BASE_URL, not the embedded model")
    args = parser.parse_args(argv)
    check_hosted(parser, args.hosted)
    agl.setup_logging("INFO")
    with contextlib.ExitStack() as stack:
        if not args.hosted:
            os.environ["OPENAI_BASE_URL"] = stack.enter_context(embedded_model(1, None))
            os.environ["OPENAI_API_KEY"] = "local"
            os.environ["ROOM_SELECTOR_MODEL"] = EMBEDDED_MODEL
        if args.mode == "dev":
            trainer = agl.Trainer(
                n_runners=1,
                port=pick_free_port("127.0.0.1"),
                initial_resources={"prompt_template": prompt_template_baseline()},
                adapter=agl.TraceToMessages(),
            )
            trainer.dev(room_selector, load_room_tasks("train")[: args.tasks])
        else:
            asyncio.run(run_one(with_hook=args.mode == "hook"))


if __name__ == "__main__":
    main()
