"""Ctrl-C or SIGTERM of a client-server run while its runners are in the middle of rollouts.

The interruption may reach the trainer's process only (``kill -INT``, ``kill -TERM``, a supervisor) or every process
of the group (Ctrl-C in a terminal). Either way the runners stop at once, and their rollouts are recorded as failed
in the store, which is still served while they stop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List, Tuple

import psutil
import pytest
from support.servers import free_port

from agentbolt.store.sqlite import SqliteLightningStore

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    import agentbolt as agl
    from runtime.agents import slow_agent

    class EnqueueAndWait(agl.Algorithm):
        async def run(self, train_dataset=None, val_dataset=None):
            store = self.get_store()
            resources_id = (await store.add_resources(self.get_initial_resources())).resources_id
            for task in train_dataset:
                await store.enqueue_rollout(input=task, resources_id=resources_id)
            while len(await store.query_rollouts(status_in=["preparing", "running"])) < len(train_dataset):
                await asyncio.sleep(0.1)
            open({ready!r}, "w").write("1")
            await asyncio.sleep(3600)

    trainer = agl.Trainer(
        algorithm=EnqueueAndWait(),
        n_runners=2,
        port={port},
        store={store!r},
        runner={{"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1}},
        initial_resources={{"main_llm": agl.LLM(endpoint="http://127.0.0.1:9/v1", model="unused")}},
    )
    trainer.fit(slow_agent, [{{"sleep": 600}}, {{"sleep": 600}}], progress=False)
    print("fit returned", flush=True)
    """
)


def _default_sigint() -> None:
    """Child set-up: Python's own Ctrl-C handling (a shell starts background jobs with SIGINT ignored), own group."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()


def _statuses(path: Path) -> List[Tuple[str, List[str]]]:
    async def read() -> List[Tuple[str, List[str]]]:
        store = SqliteLightningStore(str(path))
        try:
            return [
                (rollout.status, [attempt.status for attempt in await store.query_attempts(rollout.rollout_id)])
                for rollout in await store.query_rollouts()
            ]
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.mark.parametrize(
    ("signum", "to_group"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigint-to-trainer", "sigterm-to-trainer", "ctrl-c-in-terminal"],
)
def test_interrupted_runners_stop_at_once_and_record_their_rollouts_as_failed(
    tmp_path: Path, signum: int, to_group: bool
) -> None:
    ready, store = tmp_path / "ready", tmp_path / "store.db"
    script = SCRIPT.format(
        tests=str(Path(__file__).parent.parent), ready=str(ready), port=free_port(), store=str(store)
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    children: List[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the runners did not start their rollouts"
            time.sleep(0.1)
        children = psutil.Process(process.pid).children(recursive=True)
        started = time.monotonic()
        if to_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
        elapsed = time.monotonic() - started
        assert "fit returned" in stdout, stderr
        # The runners do not wait for the graceful timeout (10 s) nor for the store's outage timeout.
        assert elapsed < 8, f"took {elapsed:.1f} s to stop:\n{stderr}"
        assert _statuses(store) == [("failed", ["failed"])] * 2, stderr
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for child in children:
            if child.is_running():
                child.kill()
