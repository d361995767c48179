"""Several processes share one store server: no rollout is claimed twice, no span is lost, sequence ids increase."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

from support.servers import free_port

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.sqlite import SqliteLightningStore

WORKERS = 3
ROLLOUTS_PER_WORKER = 12
SPANS_PER_ROLLOUT = 3

# Each worker process enqueues its share of rollouts, then claims rollouts until every rollout has been enqueued
# and the queue is empty. It records spans on each claimed rollout (one alone, the rest as a batch) and, with each
# enqueue, a span into one shared rollout that all workers write to concurrently.
WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentbolt.store.client_server import LightningStoreClient
    from agentbolt.types import Span

    endpoint, worker_id, shared_rollout, shared_attempt = sys.argv[1:5]
    per_worker, spans_per_rollout, total = (int(x) for x in sys.argv[5:8])

    def span(rollout_id, attempt_id, sequence_id, name):
        return Span.from_attributes(
            attributes={"worker": worker_id}, rollout_id=rollout_id, attempt_id=attempt_id,
            sequence_id=sequence_id, name=name,
        )

    async def main():
        client = LightningStoreClient(endpoint)
        report = {"claimed": [], "shared": []}
        for i in range(per_worker):
            await client.enqueue_rollout({"worker": worker_id, "i": i})
            sequence_id = await client.get_next_span_sequence_id(shared_rollout, shared_attempt)
            report["shared"].append(sequence_id)
            await client.add_span(span(shared_rollout, shared_attempt, sequence_id, f"shared-{worker_id}"))
        while True:
            claimed = await client.dequeue_rollout(worker_id=worker_id)
            if claimed is None:
                if (await client.statistics())["total_rollouts"] >= total + 1:
                    break
                await asyncio.sleep(0.01)
                continue
            rid, aid = claimed.rollout_id, claimed.attempt.attempt_id
            report["claimed"].append(rid)
            first = await client.get_next_span_sequence_id(rid, aid)
            await client.add_span(span(rid, aid, first, "first"))
            pairs = [(rid, aid)] * (spans_per_rollout - 1)
            rest = await client.get_many_span_sequence_ids(pairs)
            added = await client.add_many_spans([span(rid, aid, s, "rest") for s in rest])
            assert len(added) == len(rest)
            await client.update_attempt(rid, aid, status="succeeded")
        await client.close()
        print(json.dumps(report))

    asyncio.run(main())
    """
)


async def test_workers_in_several_processes(tmp_path: Path) -> None:
    store = SqliteLightningStore(tmp_path / "store.db")
    server = LightningStoreServer(store, "127.0.0.1", free_port(), launch_mode="asyncio")
    await server.start()
    try:
        shared = await server.start_rollout({"shared": True})
        total = WORKERS * ROLLOUTS_PER_WORKER
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                WORKER,
                server.endpoint,
                f"w{n}",
                shared.rollout_id,
                shared.attempt.attempt_id,
                str(ROLLOUTS_PER_WORKER),
                str(SPANS_PER_ROLLOUT),
                str(total),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for n in range(WORKERS)
        ]
        reports: List[Dict[str, Any]] = []
        for proc in procs:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
            assert proc.returncode == 0, err.decode()
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))

        claimed = [rid for report in reports for rid in report["claimed"]]
        assert len(claimed) == len(set(claimed)) == total  # every rollout claimed exactly once
        rollouts = await store.query_rollouts(rollout_id_in=claimed)
        assert len(rollouts) == total and all(r.status == "succeeded" for r in rollouts)
        for rollout_id in claimed:
            spans = await store.query_spans(rollout_id)
            assert [s.sequence_id for s in spans] == list(range(1, SPANS_PER_ROLLOUT + 1))

        shared_ids = [report["shared"] for report in reports]
        for ids in shared_ids:
            assert ids == sorted(ids) and len(set(ids)) == len(ids)  # strictly increasing per process
        everything = [s for ids in shared_ids for s in ids]
        assert len(set(everything)) == len(everything)  # never issued twice across processes
        stored = await store.query_spans(shared.rollout_id)
        assert sorted(s.sequence_id for s in stored) == sorted(everything)  # no span lost
        assert (await store.statistics())["total_spans"] == total * SPANS_PER_ROLLOUT + len(everything)
    finally:
        await server.stop()
        await store.close()
