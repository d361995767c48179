#!/usr/bin/env python
"""LightningStore benchmark: throughput and latency of the store operations, in process and over HTTP.

Prints ONE JSON object on stdout and writes it to a result file (``result_files.py``); its ``results``::

    {"results": [{"backend", "transport", "op", "concurrency", "ops_per_s", "p50_ms", "p99_ms", ...}, ...],
     "setup": {...}}

Backends: ``memory`` (InMemoryLightningStore) and ``sqlite`` (SqliteLightningStore on a temporary file).
Transports: ``inprocess`` (the store object) and ``http`` (a real LightningStoreServer started as a separate process
on 127.0.0.1, reached with the real LightningStoreClient). Each op runs at concurrency 1 and 16 (asyncio tasks).
``add_many_spans`` sends batches of 100 spans and reports spans/s (``"unit": "spans/s"``). ``wait_for_rollouts``
has a row for already-finished rollouts and a ``wait_wakeup`` row: the latency from the call that finishes a
rollout to the return of a waiter blocked on it in a ``wait_for_rollouts`` call with a long timeout.

``--million-spans`` instead fills a SQLite store with 1,000,000 spans (5,000 rollouts x 200 spans of 20
attributes), starts the server on it, and reports the server's RSS and the latency of ``query_spans`` for one
rollout (200 spans), over HTTP and in process.

Usage::

    python benchmarks/store_bench.py [--quick] [--backends memory sqlite] [--transports inprocess http]
    python benchmarks/store_bench.py --million-spans [--db PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import psutil
from result_files import RunRecord, add_result_options

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agentbolt.store.base import LightningStore  # noqa: E402
from agentbolt.types import Span  # noqa: E402
from agentbolt.types.tracer import OtelResource, SpanContext, TraceStatus  # noqa: E402

OPS = [
    "enqueue_rollout",
    "dequeue_rollout",
    "start_rollout",
    "add_span",
    "add_many_spans",
    "query_spans",
    "wait_for_rollouts",
    "wait_wakeup",
]
SPAN_ATTRIBUTES = 20
BATCH = 100
QUERY_SPANS = 200

# The server process. It prefers the project's CLI entry point when it offers the sqlite backend.
SERVER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from agentbolt.store.client_server import LightningStoreServer

    backend, path, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if backend == "sqlite":
        from agentbolt.store.sqlite import SqliteLightningStore
        store = SqliteLightningStore(path)
    else:
        from agentbolt.store.memory import InMemoryLightningStore
        store = InMemoryLightningStore(thread_safe=True)
    server = LightningStoreServer(store, host="127.0.0.1", port=port, launch_mode="asyncio")
    asyncio.run(server.run_forever())
    """
)


# ---------------------------------------------------------------------------------------------------------------------
# helpers


def settle_collector() -> None:
    """Collect, then move every object the benchmark holds so far (modules, servers, prepared spans, earlier
    results) out of the collector's reach: a full collection walks every object it tracks, and one walking the
    harness's own heap in the middle of a timed loop (tens of milliseconds) would be charged to whichever call it
    interrupted. Collections of what the timed calls themselves create still count."""
    gc.collect()
    gc.freeze()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_supports_sqlite() -> bool:
    try:
        out = subprocess.run(
            [sys.executable, "-m", "agentbolt", "store", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "sqlite" in out.stdout and "--path" in out.stdout


def server_command(backend: str, path: str, port: int, use_cli: bool) -> List[str]:
    if use_cli:
        cmd = [sys.executable, "-m", "agentbolt", "store", "--backend", backend, "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--log-level", "WARNING"]
        if backend == "sqlite":
            cmd += ["--path", path]
        return cmd
    return [sys.executable, "-c", SERVER_SCRIPT, backend, path, str(port)]


async def wait_healthy(endpoint: str, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"store server exited with code {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"{endpoint}/v1/agl/health") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError("store server did not become healthy")


@contextlib.asynccontextmanager
async def http_server(backend: str, path: str, use_cli: bool) -> Any:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        server_command(backend, path, port, use_cli),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        await wait_healthy(endpoint, proc)
        yield endpoint, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_span(rollout_id: str, attempt_id: str, index: int, sequence_id: int) -> Span:
    span_id = f"{index:016x}"
    trace_id = f"{abs(hash(rollout_id)) % (1 << 64):032x}"
    attributes: Dict[str, Any] = {f"attr.{i}": f"value {i} of span {index}" for i in range(SPAN_ATTRIBUTES - 4)}
    attributes.update({"gen_ai.usage.input_tokens": 128, "gen_ai.usage.output_tokens": 64, "score": 0.5, "ok": True})
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id=trace_id,
        span_id=span_id,
        parent_id=None,
        name="openai.chat.completion",
        status=TraceStatus(status_code="OK"),
        attributes=attributes,
        events=[],
        links=[],
        start_time=time.time(),
        end_time=time.time() + 0.01,
        context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
        parent=None,
        resource=OtelResource(attributes={"service.name": "bench"}, schema_url=""),
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def row(
    backend: str,
    transport: str,
    op: str,
    concurrency: int,
    count: int,
    elapsed: float,
    latencies: List[float],
    **extra: Any,
) -> Dict[str, Any]:
    latencies = sorted(latencies)
    result: Dict[str, Any] = {
        "backend": backend,
        "transport": transport,
        "op": op,
        "concurrency": concurrency,
        "ops_per_s": round(count / elapsed, 1) if elapsed > 0 and count else None,
        "p50_ms": round(percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "samples": len(latencies),
    }
    result.update(extra)
    return result


async def run_concurrently(
    concurrency: int, count: int, op: Callable[[int, int], Awaitable[None]]
) -> Tuple[float, List[float]]:
    """Run ``count`` calls of ``op(worker, i)`` spread over ``concurrency`` tasks; (wall seconds, latencies)."""
    latencies: List[float] = []
    counter = iter(range(count))

    async def worker(w: int) -> None:
        for i in counter:
            start = time.perf_counter()
            await op(w, i)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return time.perf_counter() - start, latencies


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# ---------------------------------------------------------------------------------------------------------------------
# operations


async def prepare_op(
    store: LightningStore, op: str, concurrency: int, count: int
) -> Tuple[Callable[[int, int], Awaitable[None]], int, Dict[str, Any]]:
    """Set up the data ``op`` needs (untimed); returns (the call to time, items per call, extra row fields)."""
    from agentbolt.types import EnqueueRolloutRequest

    if op == "enqueue_rollout":

        async def enqueue(w: int, i: int) -> None:
            await store.enqueue_rollout({"task": i, "question": "What is 2 + 2?"}, mode="train")

        return enqueue, 1, {}

    if op == "dequeue_rollout":
        for part in chunks(range(count), 100):
            await store.enqueue_many_rollouts([EnqueueRolloutRequest(input={"task": i}) for i in part])

        async def dequeue(w: int, i: int) -> None:
            claimed = await store.dequeue_rollout(worker_id=f"worker-{w}")
            assert claimed is not None, "queue ran dry"

        return dequeue, 1, {}

    if op == "start_rollout":

        async def start(w: int, i: int) -> None:
            await store.start_rollout({"task": i})

        return start, 1, {}

    if op in ("add_span", "add_many_spans"):
        per_call = 1 if op == "add_span" else BATCH
        rollouts = [await store.start_rollout({"task": w}) for w in range(concurrency)]
        batches: List[List[Span]] = []
        for i in range(count):  # call i writes to rollout i % concurrency
            rollout = rollouts[i % concurrency]
            base = i * per_call
            batches.append(
                [
                    make_span(rollout.rollout_id, rollout.attempt.attempt_id, base + k, base + k + 1)
                    for k in range(per_call)
                ]
            )

        async def add(w: int, i: int) -> None:
            if per_call == 1:
                assert await store.add_span(batches[i][0]) is not None
            else:
                assert len(await store.add_many_spans(batches[i])) == per_call

        return add, per_call, ({"unit": "spans/s", "batch_size": BATCH} if per_call > 1 else {})

    if op == "query_spans":
        rollout = await store.start_rollout({"task": "query"})
        spans_of_rollout = [
            make_span(rollout.rollout_id, rollout.attempt.attempt_id, k, k + 1) for k in range(QUERY_SPANS)
        ]
        await store.add_many_spans(spans_of_rollout)

        async def query(w: int, i: int) -> None:
            result = await store.query_spans(rollout.rollout_id)
            assert len(result) == QUERY_SPANS

        return query, 1, {"spans_per_query": QUERY_SPANS}

    if op == "wait_for_rollouts":
        finished: List[str] = []
        for _ in range(min(count, 200)):
            rollout = await store.start_rollout({"task": "done"})
            await store.update_rollout(rollout.rollout_id, status="succeeded")
            finished.append(rollout.rollout_id)

        async def wait(w: int, i: int) -> None:
            result = await store.wait_for_rollouts(rollout_ids=[finished[i % len(finished)]], timeout=0)
            assert len(result) == 1

        return wait, 1, {"note": "rollouts already finished"}

    raise ValueError(op)


async def bench_wakeup(store: LightningStore, trials: int) -> List[float]:
    """Latency from the update finishing a rollout to the return of a waiter blocked on it."""
    latencies: List[float] = []
    for _ in range(trials):
        rollout = await store.start_rollout({"task": "wake"})
        done = asyncio.get_running_loop().create_future()

        async def waiter(rollout_id: str = rollout.rollout_id, done: asyncio.Future[float] = done) -> None:
            while True:
                result = await store.wait_for_rollouts(rollout_ids=[rollout_id], timeout=30.0)
                if result:
                    done.set_result(time.perf_counter())
                    return

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.05)  # let the waiter block
        start = time.perf_counter()
        await store.update_rollout(rollout.rollout_id, status="succeeded")
        latencies.append(await done - start)
        await task
    return latencies


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def bench_target(
    store: LightningStore,
    backend: str,
    transport: str,
    ops: Sequence[str],
    concurrencies: Sequence[int],
    count: int,
    server: Optional[psutil.Process] = None,
) -> List[Dict[str, Any]]:
    """Rows for one store; ``server_cpu_ms_per_call`` is the CPU time the serving process spent per call."""
    serving = server or psutil.Process()
    results = []
    for op in ops:
        if op == "wait_wakeup":
            trials = max(10, count // 20)
            lat = await bench_wakeup(store, trials)
            results.append(
                row(backend, transport, op, 1, 0, 0.0, lat, note="finish-to-waiter latency; ops_per_s not applicable")
            )
            log(results[-1])
            continue
        for concurrency in concurrencies:
            call, per_call, extra = await prepare_op(store, op, concurrency, count)
            settle_collector()
            cpu_before = cpu_seconds(serving)
            elapsed, lat = await run_concurrently(concurrency, count, call)
            extra["server_cpu_ms_per_call"] = round((cpu_seconds(serving) - cpu_before) / len(lat) * 1000, 3)
            results.append(row(backend, transport, op, concurrency, count * per_call, elapsed, lat, **extra))
            log(results[-1])
    return results


def log(message: Any) -> None:
    print(json.dumps(message) if not isinstance(message, str) else message, file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def inprocess_store(backend: str, path: str) -> Any:
    if backend == "sqlite":
        from agentbolt.store.sqlite import SqliteLightningStore

        store: Any = SqliteLightningStore(path)
        try:
            yield store
        finally:
            await store.close()
    else:
        from agentbolt.store.memory import InMemoryLightningStore

        yield InMemoryLightningStore()


@contextlib.asynccontextmanager
async def http_client(endpoint: str) -> Any:
    from agentbolt.store.client_server import LightningStoreClient

    client = LightningStoreClient(endpoint, long_waits=True)  # the wake-up row waits up to 30 s
    try:
        yield client
    finally:
        await client.close()


# ---------------------------------------------------------------------------------------------------------------------
# side by side with the reference


SIDE_BY_SIDE_OPS = [
    "health",
    "enqueue_rollout",
    "dequeue_rollout",
    "start_rollout",
    "add_span",
    "update_attempt",
    "get_rollout_by_id",
]
REFERENCE_VENV = ROOT / ".venv-ref"


@contextlib.asynccontextmanager
async def served_target(target: str, tmp: str, postgres: Any) -> Any:
    """A running server for ``target`` (its own process) and a client of it: ``(client, server process)``."""
    from agentbolt.store.http import LightningStoreClient

    port = free_port()
    backend, _, loop = target.partition("-")  # "postgres-asyncio": the postgres server on asyncio's own loop
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if loop:
        env["AGENTBOLT_EVENT_LOOP"] = loop
    if target == "reference":
        agl = REFERENCE_VENV / "bin" / "agl"
        if not agl.exists():
            raise SystemExit(f"{agl} is missing: run `make bench-reference` first")
        command = [str(agl), "store", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    else:
        command = [sys.executable, "-m", "agentbolt", "store", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--log-level", "WARNING"]
        if backend == "sqlite":
            command += ["--backend", "sqlite", "--path", os.path.join(tmp, f"bench-{port}.db")]
        elif backend == "postgres":
            command += ["--backend", "postgres", "--dsn", postgres.dsn(), "--schema", f"bench_{port}"]
        else:
            command += ["--backend", "memory"]
    # The reference imports LiteLLM, which otherwise tries to download a price list at start-up.
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = LightningStoreClient(f"http://127.0.0.1:{port}")
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield client, proc
    finally:
        await client.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def prepare_side_by_side_op(
    store: LightningStore, op: str, concurrency: int, count: int
) -> Callable[[int, int], Awaitable[None]]:
    """The timed call of ``op`` (data it needs prepared, untimed); only routes of the reference's API are used."""
    if op == "health":
        # One GET of the health route: the HTTP round trip and the client's own work, with no store operation. It is
        # the floor under every other call, and the client's share of it is the same for every server.
        from agentbolt.store.http import LightningStoreClient

        assert isinstance(store, LightningStoreClient)

        async def health(w: int, i: int) -> None:
            await store.get_server_id()

        return health
    if op == "enqueue_rollout":

        async def enqueue(w: int, i: int) -> None:
            await store.enqueue_rollout({"task": i, "question": "What is 2 + 2?"}, mode="train")

        return enqueue
    if op == "dequeue_rollout":
        for i in range(count):
            await store.enqueue_rollout({"task": i})

        async def dequeue(w: int, i: int) -> None:
            assert await store.dequeue_rollout(worker_id=f"worker-{w}") is not None, "queue ran dry"

        return dequeue
    if op == "start_rollout":

        async def start(w: int, i: int) -> None:
            await store.start_rollout({"task": i})

        return start
    rollouts = [await store.start_rollout({"task": w}) for w in range(concurrency)]
    if op == "add_span":

        async def add(w: int, i: int) -> None:
            rollout = rollouts[w]
            assert await store.add_span(make_span(rollout.rollout_id, rollout.attempt.attempt_id, i, i + 1)) is not None

        return add
    if op == "update_attempt":

        async def update(w: int, i: int) -> None:
            await store.update_attempt(rollouts[w].rollout_id, "latest", metadata={"step": i})

        return update
    if op == "get_rollout_by_id":

        async def get(w: int, i: int) -> None:
            assert await store.get_rollout_by_id(rollouts[w].rollout_id) is not None

        return get
    raise ValueError(op)


async def prepare_query_spans(store: LightningStore) -> Tuple[Callable[[int, int], Awaitable[None]], Dict[str, Any]]:
    """A rollout of ``QUERY_SPANS`` spans (added one by one: the reference has no batch route) and its query."""
    rollout = await store.start_rollout({"task": "query"})
    for k in range(QUERY_SPANS):
        await store.add_span(make_span(rollout.rollout_id, rollout.attempt.attempt_id, k, k + 1))

    async def query(w: int, i: int) -> None:
        assert len(await store.query_spans(rollout.rollout_id)) == QUERY_SPANS

    return query, {"spans_per_query": QUERY_SPANS}


async def side_by_side(args: argparse.Namespace) -> Dict[str, Any]:
    """Interleaved rounds: in each round every target serves every operation at each concurrency."""
    postgres = None
    if any(target.startswith("postgres") for target in args.targets):
        sys.path.insert(0, str(ROOT / "tests"))
        from support.postgres import LocalPostgres

        # Durable settings, as a production server would run (fsync on, synchronous commit).
        postgres = LocalPostgres(settings={"fsync": "on", "full_page_writes": "on"})
    rows: List[Dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="agentbolt-bench-") as tmp:
            for round_index in range(args.rounds):
                for target in args.targets:
                    log(f"== round {round_index + 1}/{args.rounds}: {target}")
                    async with served_target(target, tmp, postgres) as (client, proc):
                        server = psutil.Process(proc.pid)
                        for op in SIDE_BY_SIDE_OPS:
                            for concurrency in args.concurrency:
                                call = await prepare_side_by_side_op(client, op, concurrency, args.count)
                                settle_collector()
                                cpu_before = cpu_seconds(server)
                                elapsed, lat = await run_concurrently(concurrency, args.count, call)
                                extra = {
                                    "round": round_index,
                                    "server_cpu_ms_per_call": round(
                                        (cpu_seconds(server) - cpu_before) / len(lat) * 1000, 3
                                    ),
                                }
                                rows.append(row(target, "http", op, concurrency, args.count, elapsed, lat, **extra))
                                log(rows[-1])
                        for concurrency in args.concurrency:
                            call, extra = await prepare_query_spans(client)
                            settle_collector()
                            elapsed, lat = await run_concurrently(concurrency, args.queries, call)
                            rows.append(
                                row(
                                    target,
                                    "http",
                                    "query_spans",
                                    concurrency,
                                    args.queries,
                                    elapsed,
                                    lat,
                                    round=round_index,
                                    **extra,
                                )
                            )
                            log(rows[-1])
    finally:
        if postgres is not None:
            postgres.close()
    add_ratios(rows)
    return {"side_by_side": rows, "summary": summarize(rows, args.targets)}


def add_ratios(rows: List[Dict[str, Any]]) -> None:
    """Give each row of ours ``ratio_to_reference``: its ops/s over the reference's for the same op, concurrency and
    round (the ratio is what a loaded machine leaves comparable)."""
    reference = {(r["op"], r["concurrency"], r["round"]): r for r in rows if r["backend"] == "reference"}
    for item in rows:
        ref = reference.get((item["op"], item["concurrency"], item["round"]))
        if item["backend"] != "reference" and ref and ref["ops_per_s"] and item["ops_per_s"]:
            item["ratio_to_reference"] = round(item["ops_per_s"] / ref["ops_per_s"], 2)


def summarize(rows: List[Dict[str, Any]], targets: Sequence[str]) -> Dict[str, Any]:
    """Per (op, concurrency): each target's ops/s and p99 per round, and each target's ratio to the reference."""
    summary: Dict[str, Any] = {}
    for item in rows:
        key = f"{item['op']}@c{item['concurrency']}"
        entry = summary.setdefault(key, {})
        entry.setdefault(item["backend"], {"ops_per_s": [], "p50_ms": [], "p99_ms": [], "server_cpu_ms_per_call": []})
        for field in ("ops_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_call"):
            entry[item["backend"]][field].append(item.get(field))
    if "reference" in targets:
        for entry in summary.values():
            reference = entry.get("reference")
            if not reference:
                continue
            for target, values in entry.items():
                if target == "reference":
                    continue
                values["ratio_per_round"] = [
                    round(ours / ref, 2) if ours and ref else None
                    for ours, ref in zip(values["ops_per_s"], reference["ops_per_s"], strict=False)
                ]
    return summary


# ---------------------------------------------------------------------------------------------------------------------
# the one-million-spans mode


async def million_spans(db: Path, total_spans: int, queries: int, use_cli: bool) -> Dict[str, Any]:
    from agentbolt.store.sqlite import SqliteLightningStore

    per_rollout = QUERY_SPANS
    report: Dict[str, Any] = {"db": str(db), "spans_target": total_spans}
    store = SqliteLightningStore(db)
    try:
        existing = (await store.statistics()).get("total_spans", 0)
        rollout_ids: List[str] = [r.rollout_id for r in await store.query_rollouts()]
        fill_start = time.perf_counter()
        added = 0
        while existing + added < total_spans:
            rollout = await store.start_rollout({"task": len(rollout_ids)})
            spans = [make_span(rollout.rollout_id, rollout.attempt.attempt_id, k, k + 1) for k in range(per_rollout)]
            await store.add_many_spans(spans)
            rollout_ids.append(rollout.rollout_id)
            added += per_rollout
            if len(rollout_ids) % 500 == 0:
                log(f"filled {existing + added} spans")
        fill_seconds = time.perf_counter() - fill_start
        report["fill"] = {"spans_added": added, "seconds": round(fill_seconds, 1)}
        if added:
            report["fill"]["spans_per_s"] = round(added / fill_seconds, 1)
        report["spans"] = (await store.statistics()).get("total_spans")
        # In process, on the full database.
        sample = random.Random(0).sample(rollout_ids, min(queries, len(rollout_ids)))
        lat: List[float] = []
        for rollout_id in sample:
            start = time.perf_counter()
            result = await store.query_spans(rollout_id)
            lat.append(time.perf_counter() - start)
            assert len(result) == per_rollout
        report["inprocess_query_spans"] = row("sqlite", "inprocess", "query_spans", 1, len(lat), sum(lat), lat)
    finally:
        await store.close()
    report["db_bytes"] = db.stat().st_size
    async with http_server("sqlite", str(db), use_cli) as (endpoint, proc):
        report.update(await query_served_spans("sqlite", endpoint, proc, rollout_ids, queries, per_rollout))
    return report


async def query_served_spans(
    backend: str, endpoint: str, proc: subprocess.Popen[bytes], rollout_ids: List[str], queries: int, per_rollout: int
) -> Dict[str, Any]:
    """The serving process's RSS (idle, and peak while answering) and query_spans latency over HTTP."""
    server = psutil.Process(proc.pid)
    report: Dict[str, Any] = {"server_rss_mb_idle": round(server.memory_info().rss / 2**20, 1)}
    peak = 0
    lat: List[float] = []
    async with http_client(endpoint) as client:
        for rollout_id in random.Random(1).sample(rollout_ids, min(queries, len(rollout_ids))):
            start = time.perf_counter()
            result = await client.query_spans(rollout_id)
            lat.append(time.perf_counter() - start)
            assert len(result) == per_rollout
            peak = max(peak, server.memory_info().rss)
        report["server_total_spans"] = (await client.statistics()).get("total_spans")
        peak = max(peak, server.memory_info().rss)
    report["server_rss_mb_peak"] = round(peak / 2**20, 1)
    report["http_query_spans"] = row(backend, "http", "query_spans", 1, len(lat), sum(lat), lat)
    return report


async def million_spans_postgres(total_spans: int, queries: int) -> Dict[str, Any]:
    """Fill a PostgreSQL store with ``total_spans`` spans, serve it, report the server's RSS and query_spans latency."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.postgres import LocalPostgres

    from agentbolt.store.postgres import PostgresLightningStore

    per_rollout = QUERY_SPANS
    postgres = LocalPostgres(settings={"fsync": "on", "full_page_writes": "on"})
    report: Dict[str, Any] = {"backend": "postgres", "spans_target": total_spans}
    try:
        store = PostgresLightningStore(postgres.dsn(), schema="million")
        rollout_ids: List[str] = []
        fill_start = time.perf_counter()
        try:
            while len(rollout_ids) * per_rollout < total_spans:
                rollout = await store.start_rollout({"task": len(rollout_ids)})
                spans = [
                    make_span(rollout.rollout_id, rollout.attempt.attempt_id, k, k + 1) for k in range(per_rollout)
                ]
                await store.add_many_spans(spans)
                rollout_ids.append(rollout.rollout_id)
                if len(rollout_ids) % 500 == 0:
                    log(f"filled {len(rollout_ids) * per_rollout} spans")
            fill_seconds = time.perf_counter() - fill_start
            report["fill"] = {"spans_added": len(rollout_ids) * per_rollout, "seconds": round(fill_seconds, 1)}
            report["fill"]["spans_per_s"] = round(len(rollout_ids) * per_rollout / fill_seconds, 1)
            report["spans"] = (await store.statistics()).get("total_spans")
        finally:
            await store.close()
        report["database_bytes"] = int(postgres.psql("SELECT pg_database_size(current_database())").strip())
        report["spans_table_bytes"] = int(postgres.psql("SELECT pg_total_relation_size('million.spans')").strip())
        port = free_port()
        command = [sys.executable, "-m", "agentbolt", "store", "--backend", "postgres", "--dsn", postgres.dsn()]
        command += ["--schema", "million", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            await wait_healthy(endpoint, proc)
            report.update(await query_served_spans("postgres", endpoint, proc, rollout_ids, queries, per_rollout))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        postgres.close()
    return report


# ---------------------------------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> Dict[str, Any]:
    setup: Dict[str, Any] = {"sqlite": sqlite3.sqlite_version}
    use_cli = (not args.script_server) and cli_supports_sqlite()
    setup["server_entry_point"] = "python -m agentbolt store" if use_cli else "LightningStoreServer script"
    if args.side_by_side:
        args.count = args.count or (100 if args.quick else 400)
        args.queries = min(args.queries, 40 if args.quick else 200)
        report = await side_by_side(args)
        setup["count_per_row"] = args.count
        report["setup"] = setup
        return report
    if args.million_spans and args.backend == "postgres":
        return {"million_spans": await million_spans_postgres(args.spans, args.queries), "setup": setup}
    if args.million_spans:
        db = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="agentbolt-bench-")) / "million.db"
        report = await million_spans(db, args.spans, args.queries, use_cli)
        return {"million_spans": report, "setup": setup}
    count = args.count or (200 if args.quick else 2000)
    results: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agentbolt-bench-") as tmp:
        for backend in args.backends:
            for transport in args.transports:
                path = os.path.join(tmp, f"{backend}-{transport}.db")
                log(f"== {backend} / {transport}")
                if transport == "inprocess":
                    async with inprocess_store(backend, path) as store:
                        results += await bench_target(store, backend, transport, args.ops, args.concurrency, count)
                else:
                    async with http_server(backend, path, use_cli) as (endpoint, proc), http_client(endpoint) as client:
                        server = psutil.Process(proc.pid)
                        results += await bench_target(
                            client, backend, transport, args.ops, args.concurrency, count, server
                        )
    setup["count_per_row"] = count
    return {"results": results, "setup": setup}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 calls per row instead of 2000")
    parser.add_argument("--count", type=int, default=0, help="calls per row (overrides --quick)")
    parser.add_argument("--backends", nargs="+", default=["memory", "sqlite"], choices=["memory", "sqlite"])
    parser.add_argument("--transports", nargs="+", default=["inprocess", "http"], choices=["inprocess", "http"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    parser.add_argument(
        "--script-server", action="store_true", help="serve with a LightningStoreServer script, not the CLI"
    )
    parser.add_argument("--million-spans", action="store_true", help="fill a sqlite store with 1M spans and query it")
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans for --million-spans")
    parser.add_argument("--queries", type=int, default=500, help="queries for --million-spans")
    parser.add_argument("--db", help="database file for --million-spans (reused if it already holds spans)")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="interleaved rounds of the reference server and ours over HTTP (same client), JSON with ratios",
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["reference", "sqlite", "postgres"],
        choices=["reference", "sqlite", "postgres", "memory", "sqlite-asyncio", "postgres-asyncio"],
        help="servers to compare; NAME-asyncio serves NAME on asyncio's own event loop instead of uvloop",
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds for --side-by-side")
    parser.add_argument(
        "--backend", default="sqlite", choices=["sqlite", "postgres"], help="backend of --million-spans"
    )
    add_result_options(parser)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    record = RunRecord.start(__file__, argv)
    args = parse_args(argv)
    settle_collector()
    record.finish(asyncio.run(main_async(args)), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
