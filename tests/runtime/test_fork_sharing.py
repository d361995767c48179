"""Runner processes forked by the client-server strategy keep sharing the parent's Python objects."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and /proc/PID/smaps_rollup")

# The parent builds ~60 MiB of small Python objects, then starts two runners with the strategy; each runner runs a
# full garbage collection and reports how much memory it no longer shares with the parent. Once the runners are gone,
# the parent's objects are no longer frozen: its garbage is collected again.
_SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, json, multiprocessing, sys
    from agentbolt.execution import ClientServerExecutionStrategy

    objects = [{"index": i, "payload": [i, str(i)]} for i in range(300_000)]

    async def runner(store, worker_id, event):
        frozen = gc.get_freeze_count()  # the parent's objects, frozen before the fork
        gc.collect()
        private = 0
        with open("/proc/self/smaps_rollup") as rollup:
            for line in rollup:
                key, _, value = line.partition(":")
                if key in ("Private_Clean", "Private_Dirty"):
                    private += int(value.split()[0]) * 1024
        with open(f"{sys.argv[1]}/runner-{worker_id}.json", "w") as out:
            json.dump({"private_mib": private / 2**20, "frozen": frozen}, out)

    async def algorithm(store, event):
        pass

    multiprocessing.set_start_method("fork")
    strategy = ClientServerExecutionStrategy(role="runner", n_runners=2, managed_store=False)
    strategy.execute(algorithm, runner, None)  # the bundles use no store
    print(json.dumps({"objects": len(objects), "frozen": gc.get_freeze_count()}))
    """
)


def test_a_garbage_collection_in_a_runner_does_not_copy_the_parents_objects(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.splitlines()[-1])["frozen"] == 0
    reports = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("runner-*.json"))]
    assert len(reports) == 2
    for report in reports:
        assert report["frozen"] >= 300_000, report
        # Visiting the parent's 300k objects would have copied their pages (~60 MiB) into the runner.
        assert report["private_mib"] < 30, report
