#!/usr/bin/env python
"""Agent runtime benchmark.

Part 1 — tracing overhead: latency of an OpenAI chat completion made with the real ``openai`` SDK against a local
OpenAI-compatible server (``tests/support/fake_openai.py``, started as a separate process, answering with vLLM-style token
ids), traced vs untraced. Traced calls run inside ``AgentOpsTracer.trace_context`` of a rollout, so each one
creates its span and records the request/response attributes and token ids; the span processor's background
thread writes the spans to the store in batches. Untraced calls go through the SDK's original ``create``.
Traced and untraced calls alternate (the order within each pair alternates too) so both see the same machine
load. The overhead is the difference of the percentiles (``paired_overhead_p50_ms`` is the median of the
per-pair differences). ``tracing_cpu_ms_per_call`` is the extra CPU time of the client process per traced call
(span creation, attributes, conversion and the store write on the background thread), measured over separate
blocks of traced and untraced calls: it is much less affected by other load on the machine than latency.

Prints ONE JSON object on stdout::

    {"tracing_overhead_p50_ms": ..., "tracing_overhead_p99_ms": ..., "paired_overhead_p50_ms": ...,
     "tracing_cpu_ms_per_call": ..., "traced_cpu_ms_per_call": ..., "untraced_cpu_ms_per_call": ...,
     "traced_p50_ms": ..., "untraced_p50_ms": ..., "traced_p99_ms": ..., "untraced_p99_ms": ...,
     "calls": N, "stream": bool, "store": "memory"|"http", "spans_stored": N, "machine": {...}}

Usage::

    python benchmarks/runtime_bench.py [--calls 300] [--warmup 30] [--stream] [--store memory|http]
        [--part all|tracing|rollouts] [--runners 1 4 8] [--rollouts 200] [--strategy cs|ray] [--warmup-rollouts 0]

Part 2 — rollout throughput: ``Trainer.fit`` with the client-server strategy (the algorithm process serves a
SQLite store over HTTP, runner processes connect as clients), the default tracer, and a trivial agent making two
chat completions against the same local server (a new ``openai.OpenAI`` client per rollout, as agents commonly do)
and returning a reward. The algorithm enqueues ``--rollouts`` rollouts at once and waits for them with
``wait_for_rollouts`` on the ones still running; ``rollouts_per_s`` is rollouts divided by the time from the first
enqueue to the last finished rollout, for each ``--runners`` count. ``cpu_ms_per_rollout`` is the CPU time (user +
system, from psutil) spent over the same window per rollout by the trainer process (algorithm and store server),
by the runner processes, and by the fake OpenAI server, and their total: on a shared machine it says far more
than wall-clock rates, which depend on how much of the CPUs other jobs leave. Adds to the JSON::

    {"rollouts_per_s": {"1": ..., "4": ..., "8": ...},
     "cpu_ms_per_rollout": {"1": {"trainer": ..., "runners": ..., "backend": ..., "total": ...}, ...},
     "rollouts": N, ...}

``--part tracing`` or ``--part rollouts`` runs one part only. ``--strategy ray`` runs the runners as Ray actors
(:class:`agentbolt.execution.ray.RayExecutionStrategy` on a local Ray instance started for each runner count; its
processes count as "runners"). ``--warmup-rollouts N`` runs N rollouts before the timed window, so every runner is up
and has made its first calls (Ray actors take seconds to start).

``--store http`` writes spans to an in-memory store served by ``agentbolt store --backend memory`` in a separate
process (through LightningStoreClient) instead of an in-process InMemoryLightningStore.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

from result_files import RunRecord, add_result_options

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def background_process(args: List[str], health_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run a server process until the block exits; waits for ``health_url`` to answer 200."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{args} exited: {process.stderr.read().decode() if process.stderr else ''}")
            with contextlib.suppress(OSError), urllib.request.urlopen(health_url, timeout=1) as response:
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{args} did not become healthy")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


async def measure(args: argparse.Namespace, base_url: str, store: Any) -> Dict[str, Any]:
    import openai
    from openai.resources.chat.completions import Completions

    from agentbolt.tracer import AgentOpsTracer

    tracer = AgentOpsTracer()
    tracer.init_worker(0, store)
    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)
    completions = client.chat.completions
    original_create = Completions.create.__agentbolt_original__  # the SDK method before instrumentation
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ]

    def call(create: Callable[..., Any]) -> float:
        start = time.perf_counter()
        if args.stream:
            stream = create(completions, model="fake-model", messages=messages, stream=True)
            for _ in stream:
                pass
        else:
            create(completions, model="fake-model", messages=messages)
        return (time.perf_counter() - start) * 1000

    traced_create = Completions.create
    rollout = await store.start_rollout(input={"benchmark": "tracing"})
    traced: List[float] = []
    untraced: List[float] = []
    async with tracer.trace_context("bench", rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id):
        for _ in range(args.warmup):
            call(traced_create)
            call(original_create)
        for i in range(args.calls):
            pair: List[Tuple[List[float], Callable[..., Any]]] = [(traced, traced_create), (untraced, original_create)]
            if i % 2:
                pair.reverse()
            for sink, create in pair:
                sink.append(call(create))
        # CPU time of this process per call (the API server runs in another process), measured in separate
        # blocks so that the background span writes are charged to the traced block; less sensitive than wall
        # time to other load on the machine.
        processor = tracer._lightning_span_processor
        assert processor is not None
        cpu_per_call: Dict[str, float] = {}
        for label, create in (("traced", traced_create), ("untraced", original_create)):
            processor.force_flush()
            start_cpu = time.process_time()
            for _ in range(args.calls):
                call(create)
            processor.force_flush()
            cpu_per_call[label] = (time.process_time() - start_cpu) * 1000 / args.calls
    tracer.teardown_worker(0)
    spans = await store.query_spans(rollout.rollout_id)
    paired = [t - u for t, u in zip(traced, untraced, strict=True)]
    return {
        "tracing_overhead_p50_ms": round(percentile(traced, 0.5) - percentile(untraced, 0.5), 4),
        "tracing_overhead_p99_ms": round(percentile(traced, 0.99) - percentile(untraced, 0.99), 4),
        "paired_overhead_p50_ms": round(statistics.median(paired), 4),
        "tracing_cpu_ms_per_call": round(cpu_per_call["traced"] - cpu_per_call["untraced"], 4),
        "traced_cpu_ms_per_call": round(cpu_per_call["traced"], 4),
        "untraced_cpu_ms_per_call": round(cpu_per_call["untraced"], 4),
        "traced_p50_ms": round(percentile(traced, 0.5), 4),
        "untraced_p50_ms": round(percentile(untraced, 0.5), 4),
        "traced_p99_ms": round(percentile(traced, 0.99), 4),
        "untraced_p99_ms": round(percentile(untraced, 0.99), 4),
        "calls": args.calls,
        "stream": args.stream,
        "store": args.store,
        "spans_stored": len(spans),
    }


BENCH_MODEL = "fake-model"


def _two_call_agent() -> Any:
    import openai

    import agentbolt as agl

    @agl.rollout
    def two_call_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.endpoint, api_key="bench", max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
        return 1.0

    return two_call_agent


def cpu_seconds(processes: List[Any]) -> float:
    """User + system CPU seconds used so far by ``processes`` (psutil handles); gone processes count 0."""
    import psutil

    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def _strategy(name: str, n_runners: int) -> Dict[str, Any]:
    if name == "ray":
        ray_init = {"num_cpus": max(8, n_runners), "include_dashboard": False, "object_store_memory": 100 * 1024 * 1024}
        return {"type": "ray", "n_runners": n_runners, "num_cpus_per_runner": 0.5, "init_kwargs": ray_init}
    return {"type": "cs", "n_runners": n_runners, "server_port": free_port(), "server_host": "127.0.0.1"}


def measure_rollouts(
    base_url: str,
    n_runners: int,
    n_rollouts: int,
    workdir: Path,
    backend_pid: int,
    strategy: str = "cs",
    warmup_rollouts: int = 0,
) -> Tuple[float, Dict[str, float]]:
    """Trainer.fit (client-server or Ray strategy, SQLite store) with ``n_runners`` runners.

    Returns:
        Rollouts per second, and CPU milliseconds per rollout over the same window: of the trainer process (algorithm
        and store server), of its runner processes, and of the fake OpenAI server.
    """
    import psutil

    import agentbolt as agl
    from agentbolt.store.sqlite import SqliteLightningStore

    class EnqueueAll(agl.Algorithm):
        elapsed = 0.0
        cpu: Dict[str, float] = {}

        async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
            store = self.get_store()
            resources = await store.add_resources({"main_llm": agl.LLM(endpoint=base_url, model=BENCH_MODEL)})
            requests = [
                agl.EnqueueRolloutRequest(input=task, mode="train", resources_id=resources.resources_id)
                for task in train_dataset
            ]
            warmup, requests = requests[:warmup_rollouts], requests[warmup_rollouts:]
            if warmup:
                warm = [r.rollout_id for r in await store.enqueue_many_rollouts(warmup)]
                while len(await store.wait_for_rollouts(rollout_ids=warm, timeout=0.5)) < len(warm):
                    pass
            me = psutil.Process()
            groups = {"trainer": [me], "runners": me.children(recursive=True), "backend": [psutil.Process(backend_pid)]}
            start_cpu = {name: cpu_seconds(processes) for name, processes in groups.items()}
            start = time.perf_counter()
            rollouts = await store.enqueue_many_rollouts(requests)
            pending = [r.rollout_id for r in rollouts]
            # Ask only about the rollouts still running; the store answers as soon as they all finished or the
            # slice is over, so this loop neither sleeps past the last rollout nor polls an idle store.
            while pending:
                finished = await store.wait_for_rollouts(rollout_ids=pending, timeout=0.5)
                done = {rollout.rollout_id for rollout in finished}
                pending = [rollout_id for rollout_id in pending if rollout_id not in done]
            type(self).elapsed = time.perf_counter() - start
            type(self).cpu = {name: cpu_seconds(processes) - start_cpu[name] for name, processes in groups.items()}

    algorithm = EnqueueAll()
    store = SqliteLightningStore(str(workdir / f"runners-{n_runners}.db"))
    trainer = agl.Trainer(
        algorithm=algorithm,
        store=store,
        strategy=_strategy(strategy, n_runners),
        runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05},
    )
    # No console progress: it polls the store, which would count in the trainer's CPU per rollout.
    trainer.fit(
        _two_call_agent(), [{"q": f"question {i}"} for i in range(n_rollouts + warmup_rollouts)], progress=False
    )
    asyncio.run(store.close())
    cpu_ms = {name: round(seconds * 1000 / n_rollouts, 2) for name, seconds in EnqueueAll.cpu.items()}
    cpu_ms["total"] = round(sum(EnqueueAll.cpu.values()) * 1000 / n_rollouts, 2)
    return n_rollouts / EnqueueAll.elapsed, cpu_ms


async def measure_tracing(args: argparse.Namespace, base_url: str) -> Dict[str, Any]:
    if args.store == "memory":
        from agentbolt.store.memory import InMemoryLightningStore

        return await measure(args, base_url, InMemoryLightningStore(thread_safe=True))
    from agentbolt.store.client_server import LightningStoreClient

    store_port = free_port()
    command = [sys.executable, "-m", "agentbolt", "store", "--backend", "memory", "--port", str(store_port)]
    with background_process(command, f"http://127.0.0.1:{store_port}/v1/agl/health"):
        client = LightningStoreClient(f"http://127.0.0.1:{store_port}")
        try:
            return await measure(args, base_url, client)
        finally:
            await client.close()


def run(args: argparse.Namespace) -> Dict[str, Any]:
    import tempfile

    port = free_port()
    fake = [sys.executable, str(ROOT / "tests" / "support" / "fake_openai.py"), "--port", str(port), "--token-ids"]
    result: Dict[str, Any] = {}
    with background_process(fake, f"http://127.0.0.1:{port}/v1/models") as backend:
        base_url = f"http://127.0.0.1:{port}/v1"
        if args.part in ("all", "tracing"):
            result.update(asyncio.run(measure_tracing(args, base_url)))
        if args.part in ("all", "rollouts"):
            with tempfile.TemporaryDirectory() as workdir:
                figures = {
                    n: measure_rollouts(
                        base_url, n, args.rollouts, Path(workdir), backend.pid, args.strategy, args.warmup_rollouts
                    )
                    for n in args.runners
                }
            result["rollouts_per_s"] = {str(n): round(rate, 1) for n, (rate, _) in figures.items()}
            result["cpu_ms_per_rollout"] = {str(n): cpu for n, (_, cpu) in figures.items()}
            result["rollouts"] = args.rollouts
            strategy = "client-server strategy" if args.strategy == "cs" else "Ray strategy (runners as actors)"
            result["rollout_agent"] = f"2 chat completions + reward; {strategy}; SQLite store"
            result["strategy"] = args.strategy
            result["warmup_rollouts"] = args.warmup_rollouts
    return result


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="Traced and untraced calls each (default 300).")
    parser.add_argument("--warmup", type=int, default=30, help="Warm-up pairs, not measured.")
    parser.add_argument("--stream", action="store_true", help="Use stream=True and consume the stream.")
    parser.add_argument("--store", choices=["memory", "http"], default="memory")
    parser.add_argument("--part", choices=["all", "tracing", "rollouts"], default="all")
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 4, 8], help="Runner counts (default 1 4 8).")
    parser.add_argument("--rollouts", type=int, default=200, help="Rollouts per runner count (default 200).")
    parser.add_argument("--strategy", choices=["cs", "ray"], default="cs", help="Execution strategy (default cs).")
    parser.add_argument("--warmup-rollouts", type=int, default=0, help="Untimed rollouts before the window.")
    add_result_options(parser)
    args = parser.parse_args()
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    if args.rollouts < 1 or any(n < 1 for n in args.runners) or args.warmup_rollouts < 0:
        parser.error("--rollouts and --runners must be positive, --warmup-rollouts not negative")
    record.finish(run(args), args)


if __name__ == "__main__":
    main()
