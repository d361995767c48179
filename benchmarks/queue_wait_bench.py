#!/usr/bin/env python
"""Idle runners: how long a queued rollout waits before a runner claims it, with runners that wait for queued
rollouts (``wait_for_queued_rollouts``) and with runners that sleep their poll interval (a store that cannot wait,
as every store did before), side by side.

A SQLite store server runs in its own process (``agentbolt store``). In each round and for each mode, ``--runners``
``LitAgentRunner``s in this process serve its queue over HTTP with ``--poll-interval`` (an agent that returns at
once), and the algorithm side enqueues ``--rollouts`` rollouts one at a time, waiting for each to finish and then a
random 0.2 to 2 poll intervals, so that the runners are idle when the next one comes. A rollout's claim delay is its
attempt's start time minus its own creation time, both stamped by the server. The "sleep" mode's runners talk to
the server through a client whose ``wait_for_queued_rollouts`` is the base store's (it sleeps the timeout).

Prints one JSON object and writes a result file (``--result-name``)::

    {"modes": {"wait": {"claim_delay_ms": {"p50": ..., "p90": ..., "max": ..., "mean": ...}, "rollouts": N},
               "sleep": {...}},
     "runners": N, "poll_interval": s, "rounds": R}

Usage::

    python benchmarks/queue_wait_bench.py [--runners 4] [--poll-interval 1.0] [--rollouts 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from result_files import RunRecord, add_result_options

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import agentbolt as agl  # noqa: E402
from agentbolt.execution import ThreadingEvent  # noqa: E402
from agentbolt.store.base import LightningStore  # noqa: E402
from agentbolt.store.http import LightningStoreClient  # noqa: E402
from agentbolt.tracer import OtelTracer  # noqa: E402
from agentbolt.utils.server_launcher import pick_free_port  # noqa: E402

MODES = ("wait", "sleep")


class ClientThatCannotWait(LightningStoreClient):
    """The HTTP client with the base store's ``wait_for_queued_rollouts``: it sleeps the timeout."""

    wait_for_queued_rollouts = LightningStore.wait_for_queued_rollouts  # type: ignore[assignment]


class InstantAgent(agl.LitAgent[Any]):
    """Finishes at once: what is timed is the wait before the claim, not the work."""

    def rollout(self, task: Any, resources: Any, rollout: Any) -> float:
        return 1.0


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def wait_healthy(client: LightningStoreClient, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"the store server exited with {proc.returncode}")
        try:
            await client.get_server_id()
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise SystemExit("the store server did not answer within 30 s")


async def one_block(endpoint: str, mode: str, args: argparse.Namespace, rng: random.Random) -> List[float]:
    """Start runners of ``mode``, feed them ``args.rollouts`` rollouts one at a time; the claim delays (ms)."""
    client_type = LightningStoreClient if mode == "wait" else ClientThatCannotWait
    algorithm = LightningStoreClient(endpoint, long_waits=True)
    stores = [client_type(endpoint) for _ in range(args.runners)]
    event = ThreadingEvent()
    runners = []
    tasks = []
    for index, store in enumerate(stores):
        runner: agl.LitAgentRunner[Any] = agl.LitAgentRunner(
            OtelTracer(), poll_interval=args.poll_interval, heartbeat_interval=0
        )
        runner.init(agent=InstantAgent())
        runner.init_worker(index, store)
        runners.append(runner)
        tasks.append(asyncio.create_task(runner.iter(event=event)))
    delays: List[float] = []
    try:
        resources = {"prompt": agl.PromptTemplate(template="{i}", engine="f-string")}
        resources_id = (await algorithm.add_resources(resources)).resources_id  # type: ignore[arg-type]
        await asyncio.sleep(args.poll_interval)  # every runner found the queue empty
        for i in range(args.rollouts):
            rollout = await algorithm.enqueue_rollout({"i": i}, resources_id=resources_id)
            (finished,) = await algorithm.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=60)
            assert finished.status == "succeeded", finished.status
            attempt = await algorithm.get_latest_attempt(finished.rollout_id)
            assert attempt is not None
            delays.append((attempt.start_time - finished.start_time) * 1000.0)
            await asyncio.sleep(args.poll_interval * rng.uniform(0.2, 2.0))
    finally:
        event.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for index, runner in enumerate(runners):
            runner.teardown_worker(index)
            runner.teardown()
        for store in [algorithm, *stores]:
            await store.close()
    return delays


async def measure(args: argparse.Namespace) -> Dict[str, Any]:
    rng = random.Random(args.seed)
    port = pick_free_port("127.0.0.1")
    endpoint = f"http://127.0.0.1:{port}"
    delays: Dict[str, List[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="agentbolt-queue-wait-") as tmp:
        command = [sys.executable, "-m", "agentbolt", "store", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--path", os.path.join(tmp, "store.db"), "--log-level", "WARNING"]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            probe = LightningStoreClient(endpoint, retry_delays=(), health_retry_delays=())
            await wait_healthy(probe, proc)
            await probe.close()
            for round_index in range(args.rounds):
                for mode in MODES if round_index % 2 == 0 else tuple(reversed(MODES)):
                    block = await one_block(endpoint, mode, args, rng)
                    delays[mode] += block
                    print(
                        f"round {round_index + 1}/{args.rounds} {mode}: median claim delay "
                        f"{statistics.median(block):.1f} ms",
                        file=sys.stderr,
                    )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {
        "modes": {
            mode: {
                "claim_delay_ms": {
                    "p50": round(percentile(values, 0.5), 2),
                    "p90": round(percentile(values, 0.9), 2),
                    "max": round(max(values), 2),
                    "mean": round(statistics.fmean(values), 2),
                },
                "rollouts": len(values),
            }
            for mode, values in delays.items()
        },
        "runners": args.runners,
        "poll_interval": args.poll_interval,
        "rounds": args.rounds,
    }


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runners", type=int, default=4, help="idle runners serving the queue (default 4)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the runners' poll interval in seconds")
    parser.add_argument("--rollouts", type=int, default=10, help="rollouts per mode and round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the two modes alternating (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the gaps between rollouts")
    add_result_options(parser)
    args = parser.parse_args()
    if args.runners < 1 or args.rollouts < 1 or args.rounds < 1 or args.poll_interval <= 0:
        parser.error("--runners, --rollouts and --rounds must be at least 1, --poll-interval positive")
    record.finish(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
