"""Synchronous agents run on daemon threads of their own: emitters work there, and a stop does not wait for them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import agentbolt as agl
from agentbolt.emitter import find_final_reward
from agentbolt.runner import LitAgentRunner
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.tracer import OtelTracer

PROMPT = {"prompt": agl.PromptTemplate(template="{x}", engine="f-string")}
FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 1.0}
AGENT_BLOCKS_FOR = 30.0


async def test_sync_agent_runs_on_a_daemon_thread_where_emitters_still_record() -> None:
    seen: Dict[str, Any] = {}

    @agl.rollout
    def agent(task: Any, prompt_template: agl.PromptTemplate, rollout: agl.Rollout) -> None:
        thread = threading.current_thread()
        seen.update(name=thread.name, daemon=thread.daemon, rollout_id=rollout.rollout_id)
        agl.emit_reward(0.25)

    store = InMemoryLightningStore()
    runner: LitAgentRunner[Any] = LitAgentRunner(OtelTracer(), heartbeat_interval=0)
    with runner.run_context(agent=agent, store=store):
        rollout = await runner.step({"x": "hi"}, resources=PROMPT)
    assert rollout.status == "succeeded"
    assert seen == {"name": f"rollout-{rollout.rollout_id}", "daemon": True, "rollout_id": rollout.rollout_id}
    assert find_final_reward(list(await store.query_spans(rollout.rollout_id))) == 0.25


class _StopOnceTheAgentStarts(agl.Algorithm):
    """Queues one rollout and returns (which stops the runners) as soon as the agent has started on it."""

    def __init__(self, started: threading.Event) -> None:
        super().__init__()
        self.started = started

    async def run(self, train_dataset: Optional[Any] = None, val_dataset: Optional[Any] = None) -> None:
        store = self.get_store()
        resources = await store.add_resources(PROMPT)
        await store.enqueue_rollout(input={"x": "hi"}, mode="train", resources_id=resources.resources_id)
        while not self.started.is_set():
            await asyncio.sleep(0.01)


def test_stopped_fit_returns_while_a_sync_agent_still_blocks() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    @agl.rollout
    def blocking_agent(task: Any, prompt_template: agl.PromptTemplate) -> float:
        started.set()
        release.wait(AGENT_BLOCKS_FOR)
        finished.set()
        return 1.0

    trainer = agl.Trainer(
        algorithm=_StopOnceTheAgentStarts(started),
        strategy=agl.SharedMemoryExecutionStrategy(graceful_delay=0.5, poll_interval=0.01, join_timeout=10),
        runner=FAST_RUNNER,
    )
    began = time.monotonic()
    try:
        trainer.fit(blocking_agent, [{"x": "hi"}], progress=False)
        elapsed = time.monotonic() - began
        # The rollout was cancelled after the graceful delay and fit returned; the agent has not returned yet.
        assert started.is_set() and not finished.is_set()
        assert elapsed < AGENT_BLOCKS_FOR / 2
        assert [t for t in threading.enumerate() if t.name.startswith("rollout-") and t.daemon]
    finally:
        release.set()
    threads: List[threading.Thread] = [t for t in threading.enumerate() if t.name.startswith("rollout-")]
    for thread in threads:
        thread.join(10)
    assert finished.is_set()


CTRL_C_SCRIPT = """
import sys, time
from pathlib import Path
import agentbolt as agl

ready = Path(sys.argv[1])

@agl.rollout
def agent(task, prompt_template):
    ready.write_text("1")
    time.sleep(float(sys.argv[2]))
    return 1.0

trainer = agl.Trainer(
    algorithm=agl.Baseline(polling_interval=0.05),
    strategy=agl.SharedMemoryExecutionStrategy(graceful_delay=0.5, poll_interval=0.01, join_timeout=10),
    runner={"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.05, "heartbeat_interval": 1.0},
    initial_resources={"prompt": agl.PromptTemplate(template="{x}", engine="f-string")},
)
trainer.fit(agent, [{"x": "hi"}], progress=False)
print("fit returned", flush=True)
"""


def test_ctrl_c_ends_the_process_while_a_sync_agent_still_blocks(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT, str(ready), str(AGENT_BLOCKS_FOR)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.05)
        interrupted = time.monotonic()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=AGENT_BLOCKS_FOR)
        exited_after = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Neither fit nor the interpreter's exit waited for the agent's thread.
    assert "fit returned" in stdout, stderr
    assert process.returncode == 0, stderr
    assert exited_after < AGENT_BLOCKS_FOR / 2, stderr
