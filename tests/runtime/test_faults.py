"""Fault handling of the runtime with real processes: killed runners, failing agents, store outages, Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
import psutil
import pytest
from support.fake_openai import FakeOpenAIConfig, FakeOpenAIServer
from support.servers import OutageKind, StoreServerProcess, free_port

import agentbolt as agl
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.store.sqlite import SqliteLightningStore
from runtime.agents import crash_once_agent, failing_agent, two_call_agent

FAST_RUNNER = {"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1, "heartbeat_interval": 1.0}


class EnqueueAndWait(agl.FastAlgorithm):
    """Enqueue every task with a rollout config and wait until all rollouts are finished, tolerating outages."""

    def __init__(self, config: Optional[agl.RolloutConfig] = None, deadline: float = 90.0) -> None:
        super().__init__()
        self.config = config
        self.deadline = deadline
        self.rollout_ids: List[str] = []

    async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        store = self.get_store()
        resources = self.get_initial_resources()
        assert resources is not None
        resources_id = (await store.add_resources(resources)).resources_id
        for task in train_dataset or []:
            rollout = await store.enqueue_rollout(
                input=task, mode="train", resources_id=resources_id, config=self.config
            )
            self.rollout_ids.append(rollout.rollout_id)
        deadline = time.monotonic() + self.deadline
        while time.monotonic() < deadline:
            try:
                finished = await store.wait_for_rollouts(rollout_ids=self.rollout_ids, timeout=0.05)
            except Exception:  # the store may be briefly unreachable in the outage test
                finished = []
            if len(finished) == len(self.rollout_ids):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError("rollouts did not finish in time")


@pytest.fixture(scope="module")
def fake_openai() -> Any:
    with FakeOpenAIServer(FakeOpenAIConfig(token_ids=True)) as server:
        yield server


def _resources(server: FakeOpenAIServer) -> Dict[str, Any]:
    return {"main_llm": agl.LLM(endpoint=server.base_url, model="fake-model")}


def test_failing_agent_gives_failed_attempt_with_exception_span(fake_openai: FakeOpenAIServer) -> None:
    store = InMemoryLightningStore()
    algorithm = EnqueueAndWait()
    trainer = agl.Trainer(
        strategy="shm", store=store, runner=FAST_RUNNER, algorithm=algorithm, initial_resources=_resources(fake_openai)
    )
    trainer.fit(failing_agent, [{"question": "ok"}, {"question": "boom", "fail": True}])

    async def check() -> None:
        by_question = {}
        for rollout_id in algorithm.rollout_ids:
            rollout = await store.get_rollout_by_id(rollout_id)
            assert rollout is not None
            by_question[rollout.input["question"]] = rollout
        assert by_question["ok"].status == "succeeded"
        failed = by_question["boom"]
        assert failed.status == "failed"
        attempt = await store.get_latest_attempt(failed.rollout_id)
        assert attempt is not None and attempt.status == "failed"
        spans = await store.query_spans(failed.rollout_id)
        exception_spans = [s for s in spans if s.name == "agentlightning.exception"]
        assert len(exception_spans) == 1
        assert exception_spans[0].attributes["exception.type"] == "RuntimeError"
        assert "agent failure for boom" in str(exception_spans[0].attributes["exception.message"])

    asyncio.run(check())


def test_killed_runner_attempt_becomes_unresponsive_and_is_retried(
    tmp_path: Path, fake_openai: FakeOpenAIServer
) -> None:
    marker = tmp_path / "first-attempt.pid"
    store = SqliteLightningStore(str(tmp_path / "store.db"), scan_debounce_seconds=0.2)
    algorithm = EnqueueAndWait(
        config=agl.RolloutConfig(unresponsive_seconds=2.0, max_attempts=3, retry_condition=["unresponsive"])
    )
    trainer = agl.Trainer(
        store=store,
        runner=FAST_RUNNER,
        algorithm=algorithm,
        initial_resources=_resources(fake_openai),
        # The test kills a runner on purpose: its SIGKILL exit code is expected.
        strategy={"type": "cs", "server_port": free_port(), "n_runners": 2, "allowed_exit_codes": (0, -15, -9)},
    )

    def killer() -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() or not marker.read_text():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGKILL)

    import threading

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    trainer.fit(crash_once_agent, [{"question": "survive", "marker": str(marker)}])
    thread.join(5)

    async def check() -> None:
        rollout_id = algorithm.rollout_ids[0]
        rollout = await store.get_rollout_by_id(rollout_id)
        assert rollout is not None and rollout.status == "succeeded"
        attempts = list(await store.query_attempts(rollout_id))
        assert [a.status for a in attempts] == ["unresponsive", "succeeded"]
        assert attempts[0].worker_id != attempts[1].worker_id
        await store.close()

    asyncio.run(check())


def _succeeded(endpoint: str) -> int:
    """How many rollouts the store at ``endpoint`` holds as succeeded."""
    response = httpx.get(f"{endpoint}/v1/agl/rollouts", params={"status_in": "succeeded"}, timeout=5)
    response.raise_for_status()
    return int(response.json()["total"])


@pytest.mark.parametrize("kind", ["restart", "pause"])
def test_store_outage_delays_but_loses_no_span(tmp_path: Path, kind: OutageKind) -> None:
    """The store is stopped and restarted on the same data, or paused, while two runner processes work.

    No rollout config asks for retries: every rollout must succeed on its first attempt with all of its spans.
    """
    server = StoreServerProcess(tmp_path / "store.db")
    server.start()
    n_tasks = 12
    try:
        with FakeOpenAIServer(FakeOpenAIConfig(token_ids=True, delay=0.15)) as slow_openai:
            from agentbolt.store.client_server import LightningStoreClient

            client = LightningStoreClient(server.endpoint)
            algorithm = EnqueueAndWait(deadline=120)
            trainer = agl.Trainer(
                store=client,
                runner=FAST_RUNNER,
                algorithm=algorithm,
                initial_resources=_resources(slow_openai),
                strategy={"type": "cs", "n_runners": 2, "managed_store": False},
            )

            def outage() -> None:
                # Once the runners are at work (two rollouts done), so that the outage meets rollouts midway.
                deadline = time.monotonic() + 60
                while _succeeded(server.endpoint) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
                server.outage(kind, 3.0 if kind == "restart" else 5.0).join()

            import threading

            thread = threading.Thread(target=outage, daemon=True)
            thread.start()
            try:
                trainer.fit(two_call_agent, [{"question": f"q{i}"} for i in range(n_tasks)])
            finally:
                thread.join(30)
                assert not server.errors, f"the store did not come back: {server.errors[0]!r}"

        async def check() -> None:
            rollouts = await client.query_rollouts()
            assert len(rollouts) == n_tasks
            assert {r.status for r in rollouts} == {"succeeded"}
            for rollout in rollouts:
                attempts = list(await client.query_attempts(rollout.rollout_id))
                assert [a.status for a in attempts] == ["succeeded"], rollout.rollout_id
                spans = await client.query_spans(rollout.rollout_id, "latest")
                names = sorted(s.name for s in spans)
                assert names.count("openai.chat.completion") == 2, names
                assert sum(1 for s in spans if s.name == "agentlightning.annotation") == 1, names
            await client.close()

        asyncio.run(check())
    finally:
        server.stop()


def test_ctrl_c_stops_every_child_process(tmp_path: Path, fake_openai: FakeOpenAIServer) -> None:
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        import agentbolt as agl
        from runtime.agents import slow_agent

        class Forever(agl.FastAlgorithm):
            async def run(self, train_dataset=None, val_dataset=None):
                import asyncio
                store = self.get_store()
                rid = (await store.add_resources(self.get_initial_resources())).resources_id
                for task in train_dataset:
                    await store.enqueue_rollout(input=task, resources_id=rid)
                open({str(ready)!r}, "w").write("1")
                await asyncio.sleep(3600)

        trainer = agl.Trainer(
            algorithm=Forever(),
            n_runners=2,
            port={free_port()},
            runner={{"type": "agentbolt.runner.LitAgentRunner", "poll_interval": 0.1}},
            initial_resources={{"main_llm": agl.LLM(endpoint={fake_openai.base_url!r}, model="fake-model")}},
        )
        trainer.fit(slow_agent, [{{"sleep": 600}}, {{"sleep": 600}}])
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the training script did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # let the runners pick up their rollouts
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) >= 2
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        process.wait(30)
        _, alive = psutil.wait_procs(children, timeout=max(0.1, 10 - (time.monotonic() - started)))
        assert not alive, f"children still alive 10 s after Ctrl-C: {[c.pid for c in alive]}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
