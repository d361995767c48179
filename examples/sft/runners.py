"""Runner processes of the SFT example: each takes rollouts from the store server and runs the math agent.

The gateway on the algorithm's side records every LLM call with its token ids, so the runners' tracer only has to
record the rewards (and the OpenAI SDK calls). Stop them with Ctrl-C or SIGTERM.

Usage::

    python -m examples.sft.runners --store http://127.0.0.1:4747 --runners 8
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import signal
from typing import List, Optional

__all__ = ["main", "run_runner"]


def run_runner(store_url: str, worker_id: int) -> None:
    """One runner: iterate over the store's rollouts until SIGTERM / SIGINT."""
    import agentbolt as agl
    from agentbolt.runner.agent import TRAINING_POLL_INTERVAL
    from examples.sft.agent import math_agent

    store = agl.LightningStoreClient(store_url)
    tracer = agl.OtelTracer()
    runner = agl.LitAgentRunner(tracer=tracer, poll_interval=TRAINING_POLL_INTERVAL)
    stop = agl.ThreadingEvent()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    async def serve() -> None:
        try:
            with runner.run_context(agent=math_agent, store=store, worker_id=worker_id):
                await runner.iter(event=stop)
        finally:
            await store.close()

    asyncio.run(serve())


def main(argv: Optional[List[str]] = None) -> int:
    """Start ``--runners`` runner processes and wait for them."""
    parser = argparse.ArgumentParser(prog="python -m examples.sft.runners", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="URL of the store server, e.g. http://127.0.0.1:4747")
    parser.add_argument("--runners", type=int, default=4, help="Runner processes.")
    args = parser.parse_args(argv)
    if args.runners < 1:
        parser.error("--runners must be at least 1")
    import openai  # noqa: F401  # imported before forking, so the runners share its pages

    processes = [
        multiprocessing.Process(target=run_runner, args=(args.store, worker_id), name=f"runner-{worker_id}")
        for worker_id in range(args.runners)
    ]
    for process in processes:
        process.start()

    def forward(signum: int, _frame: object) -> None:
        for process in processes:
            if process.pid is not None and process.is_alive():
                process.terminate()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for process in processes:
        process.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
