"""The v0.1 task server, client, dev loader and fit_v0 under bad input, restarts and failing workers."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import warnings
from typing import Any, Iterator

import pytest
from support.servers import free_port, serving_in_thread

import agentbolt as agl
from agentbolt.tracer import OtelTracer

from .test_legacy import RESOURCES, LegacyAgent, ServerThread

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture
def legacy_server() -> Iterator[ServerThread]:
    with ServerThread() as server:
        yield server


class _WrongShapeHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with JSON that is neither a task nor a resources update."""

    def do_GET(self) -> None:
        body = json.dumps({"unexpected": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def wrong_shape_endpoint() -> Iterator[str]:
    with serving_in_thread(_WrongShapeHandler) as url:
        yield url


def test_a_resources_id_is_one_path_segment_and_never_claims_a_task(legacy_server: ServerThread) -> None:
    server = legacy_server.server
    assert server is not None
    rollout_id = legacy_server.call(server.queue_task({"name": "x"}))
    client = agl.AgentLightningClient(server.endpoint, poll_interval=0.05)
    assert client.get_resources_by_id("../task") is None
    assert asyncio.run(client.get_resources_by_id_async("../task")) is None
    task = client.poll_next_task()
    assert task is not None and task.rollout_id == rollout_id and task.num_claims == 1


def test_an_answer_of_the_wrong_shape_is_a_failed_request(wrong_shape_endpoint: str) -> None:
    client = agl.AgentLightningClient(wrong_shape_endpoint, poll_interval=0.05)
    assert client.get_resources_by_id("res-1") is None
    assert client.get_latest_resources() is None
    assert asyncio.run(client.get_latest_resources_async()) is None


@pytest.mark.parametrize("endpoint", ["localhost:8000", "ftp://example", 8000, None])
def test_the_client_endpoint_must_be_an_http_url(endpoint: Any) -> None:
    with pytest.raises(ValueError, match=r"endpoint must be a URL starting with http:// or https://, got"):
        agl.AgentLightningClient(endpoint)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"poll_interval": -1}, ValueError, "poll_interval must be at least 0, got -1"),
        ({"poll_interval": "5"}, TypeError, "poll_interval must be a number, got str '5'"),
        ({"timeout": 0}, ValueError, "timeout must be greater than 0, got 0"),
        ({"timeout": float("nan")}, ValueError, "timeout must be a finite number"),
    ],
)
def test_client_intervals_are_checked(kwargs: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        agl.AgentLightningClient("http://127.0.0.1:8000", **kwargs)
    with pytest.raises(error, match=message):
        agl.DevTaskLoader([1], RESOURCES, **kwargs)


def test_post_rollout_rejects_what_is_not_a_rollout() -> None:
    client = agl.AgentLightningClient(f"http://127.0.0.1:{free_port()}")
    loader = agl.DevTaskLoader([1], RESOURCES)
    for poster in (client, loader):
        with pytest.raises(TypeError, match="rollout must be a RolloutLegacy, got dict"):
            poster.post_rollout({"rollout_id": "r"})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="rollout must be a RolloutLegacy, got dict"):
            asyncio.run(poster.post_rollout_async({"rollout_id": "r"}))  # type: ignore[arg-type]
    assert loader.rollouts == []


def test_dev_task_loader_takes_tasks_from_a_generator() -> None:
    loader = agl.DevTaskLoader((name for name in ["a", "b"]), RESOURCES)
    assert [loader.poll_next_task().input for _ in range(3)] == ["a", "b", "a"]


@pytest.mark.parametrize("tasks", ["abc", {"a": 1}, 5])
def test_dev_task_loader_tasks_must_be_a_list(tasks: Any) -> None:
    with pytest.raises(TypeError, match="tasks must be a list of task inputs or of Task objects, got"):
        agl.DevTaskLoader(tasks, RESOURCES)


def test_dev_task_loader_names_unknown_keyword_arguments() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['endpoint'\]"):
        agl.DevTaskLoader([1], RESOURCES, endpoint="http://x")


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-5.0, ValueError), ("60", TypeError)])
def test_task_timeout_seconds_must_be_a_positive_number(value: Any, error: type) -> None:
    with pytest.raises(error, match="task_timeout_seconds must be"):
        agl.AgentLightningServer(port=free_port(), task_timeout_seconds=value)


def test_a_restarted_server_keeps_its_tasks_resources_and_rollouts() -> None:
    server = agl.AgentLightningServer(host="127.0.0.1", port=free_port())
    client = agl.AgentLightningClient(server.endpoint, poll_interval=0.05)

    async def first_run() -> tuple[str, str, str]:
        await server.start()
        resources_id = await server.update_resources(RESOURCES)
        done_id = await server.queue_task({"name": "done"})
        claimed = await client.poll_next_task_async()
        assert claimed is not None and claimed.rollout_id == done_id
        await client.post_rollout_async(agl.RolloutLegacy(rollout_id=done_id, final_reward=1.0))
        pending_id = await server.queue_task({"name": "pending"})
        await server.stop()
        return resources_id, done_id, pending_id

    async def second_run(resources_id: str, done_id: str, pending_id: str) -> None:
        # A new event loop, as a second asyncio.run() of a script makes.
        await server.start()
        try:
            # Bounded only so that a server which lost the task fails this test instead of polling forever.
            task = await asyncio.wait_for(client.poll_next_task_async(), 60)
            assert task is not None and task.rollout_id == pending_id
            latest = await client.get_latest_resources_async()
            assert latest is not None and latest.resources_id == resources_id
            done = await server.poll_completed_rollout(done_id, timeout=5)
            assert done is not None and done.final_reward == 1.0
            waiter = asyncio.create_task(server.poll_completed_rollout(pending_id))
            await client.post_rollout_async(agl.RolloutLegacy(rollout_id=pending_id, final_reward=0.5))
            pending = await asyncio.wait_for(waiter, 30)
            assert pending is not None and pending.final_reward == 0.5
        finally:
            await server.stop()

    ids = asyncio.run(first_run())
    asyncio.run(second_run(*ids))


def test_fit_v0_warns_that_a_dev_task_loader_keeps_no_rollout_of_several_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loader = agl.DevTaskLoader([{"name": "a"}], RESOURCES)
    trainer = agl.Trainer(n_runners=2, max_rollouts=1, tracer=OtelTracer())
    with caplog.at_level(logging.WARNING, logger="agentbolt.trainer.legacy"):
        trainer.fit_v0(LegacyAgent(), loader)  # runs, as the reference's did
    assert "n_workers=2 each worker process posts its rollouts to its own copy of the DevTaskLoader" in caplog.text
    assert loader.rollouts == []


class _TracerFailingInWorkers(OtelTracer):
    def init_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"worker {worker_id} cannot trace")


def test_fit_v0_reports_workers_that_failed() -> None:
    trainer = agl.Trainer(n_runners=2, max_rollouts=1, tracer=_TracerFailingInWorkers())
    with pytest.raises(RuntimeError, match=r"v0.1 workers failed \(worker id: exit code\): \{0: 1, 1: 1\}"):
        trainer.fit_v0(LegacyAgent(), f"http://127.0.0.1:{free_port()}")


def _runner(client: Any, delays: Any) -> Any:
    from agentbolt.adapter import TracerTraceToTriplet
    from agentbolt.runner.legacy import LegacyAgentRunner

    tracer = OtelTracer()
    tracer.init()
    tracer.init_worker(0)
    agent = LegacyAgent()
    runner = LegacyAgentRunner(agent, client, tracer, TracerTraceToTriplet(), worker_id=0, post_retry_delays=delays)
    agent.set_runner(runner)  # type: ignore[arg-type]
    return runner, tracer


def test_a_result_the_restarting_server_could_not_take_is_posted_again(legacy_server: ServerThread) -> None:
    server = legacy_server.server
    assert server is not None
    resources_id = legacy_server.call(server.update_resources(RESOURCES))
    rollout_id = legacy_server.call(server.queue_task({"name": "ok"}, mode="train", resources_id=resources_id))
    client = agl.AgentLightningClient(server.endpoint, poll_interval=0.05)
    runner, tracer = _runner(client, (0.5, 0.5, 1.0, 2.0))
    task = client.poll_next_task()
    assert task is not None and task.rollout_id == rollout_id
    legacy_server.call(server.stop())  # the server restarts while the agent runs: the first post meets nobody
    restart = threading.Timer(0.7, lambda: legacy_server.call(server.start()))
    restart.start()
    try:
        result = runner._to_legacy_result(task, 1.0)
        assert runner._post(result)
    finally:
        restart.join()
        tracer.teardown_worker(0)
        tracer.teardown()
    completed = legacy_server.call(server.get_completed_rollout(rollout_id))
    assert completed is not None and completed.final_reward == 1.0


def test_a_result_no_server_takes_is_dropped_with_one_error(caplog: pytest.LogCaptureFixture) -> None:
    client = agl.AgentLightningClient(f"http://127.0.0.1:{free_port()}", timeout=1.0)
    runner, tracer = _runner(client, (0.05, 0.05))
    try:
        task = agl.Task(rollout_id="rollout-gone", input={"name": "ok"}, mode="train")
        with caplog.at_level(logging.ERROR, logger="agentbolt.runner.legacy"):
            assert not asyncio.run(runner._post_async(runner._to_legacy_result(task, 1.0)))
    finally:
        tracer.teardown_worker(0)
        tracer.teardown()
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "took none of 3 attempts to post the result of task rollout-gone" in record.getMessage()
