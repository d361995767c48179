"""The deprecated v0.1 protocol: task server, client, dev loader and fit_v0 workers."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any, Iterator, Optional

import pytest
from support.servers import free_port, taken_port

import agentbolt as agl
from agentbolt.tracer import OtelTracer

warnings.filterwarnings("ignore", category=DeprecationWarning)

RESOURCES = {"prompt": agl.PromptTemplate(template="Hello {name}", engine="f-string")}


class LegacyAgent(agl.LitAgent[Any]):
    """A v0.1-style agent: the rollout receives the rollout id instead of the rollout."""

    def training_rollout(self, task: Any, rollout_id: str, resources: Any) -> float:  # type: ignore[override]
        agl.emit_message(resources["prompt"].format(name=task["name"]))
        return 1.0 if task["name"] == "ok" else 0.0

    def validation_rollout(self, task: Any, rollout_id: str, resources: Any) -> float:  # type: ignore[override]
        return self.training_rollout(task, rollout_id, resources)


class ServerThread:
    """Runs an AgentLightningServer on its own event loop in a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server: Optional[agl.AgentLightningServer] = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self.server = agl.AgentLightningServer(host="127.0.0.1", port=free_port(), task_timeout_seconds=60)
        self.call(self.server.start())
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def legacy_server() -> Iterator[ServerThread]:
    with ServerThread() as server:
        yield server


def test_fit_v0_against_task_server(legacy_server: ServerThread) -> None:
    server = legacy_server.server
    assert server is not None
    resources_id = legacy_server.call(server.update_resources(RESOURCES))
    ids = [
        legacy_server.call(server.queue_task({"name": name}, mode="train", resources_id=resources_id))
        for name in ("ok", "no")
    ]
    trainer = agl.Trainer(n_runners=1, max_rollouts=2, tracer=OtelTracer())
    trainer.fit(LegacyAgent(), server.endpoint)
    rewards = {}
    for rollout_id in ids:
        rollout = legacy_server.call(server.poll_completed_rollout(rollout_id, timeout=10))
        assert rollout is not None
        rewards[rollout.task.input["name"]] = rollout.final_reward
    assert rewards == {"ok": 1.0, "no": 0.0}


def test_server_routes_and_client(legacy_server: ServerThread) -> None:
    server = legacy_server.server
    assert server is not None
    client = agl.AgentLightningClient(server.endpoint, poll_interval=0.05)
    assert client.get_latest_resources() is None
    resources_id = legacy_server.call(server.update_resources(RESOURCES))
    latest = client.get_latest_resources()
    assert latest is not None and latest.resources_id == resources_id
    assert client.get_resources_by_id(resources_id) == latest
    assert client.get_resources_by_id("res-unknown") is None
    rollout_id = legacy_server.call(server.queue_task({"name": "x"}))
    task = client.poll_next_task()
    assert task is not None and task.rollout_id == rollout_id and task.num_claims == 1
    answer = client.post_rollout(agl.RolloutLegacy(rollout_id=rollout_id, final_reward=0.25))
    assert answer is not None and answer["status"] == "ok"
    completed = legacy_server.call(server.retrieve_completed_rollouts())
    assert [r.final_reward for r in completed] == [0.25]


def test_dev_task_loader() -> None:
    loader = agl.DevTaskLoader([{"name": "a"}, {"name": "b"}], RESOURCES)
    first, second, third = loader.poll_next_task(), loader.poll_next_task(), loader.poll_next_task()
    assert [first.rollout_id, second.rollout_id, third.rollout_id] == [
        "local_task_001",
        "local_task_002",
        "local_task_001",
    ]
    assert loader.get_resources_by_id("local").resources == RESOURCES
    with pytest.raises(ValueError):
        loader.get_resources_by_id("other")
    with pytest.raises(ValueError):
        agl.DevTaskLoader([], RESOURCES)
    with pytest.raises(ValueError):
        agl.DevTaskLoader([agl.Task(rollout_id="r", input=1), 2], RESOURCES)
    trainer = agl.Trainer(n_runners=1, max_rollouts=2, tracer=OtelTracer())
    trainer.fit_v0(LegacyAgent(), loader)
    assert [r.final_reward for r in loader.rollouts] == [0.0, 0.0]
    assert "DevTaskLoader(num_tasks=2" in repr(loader)


def test_fit_v0_rejects_bad_urls() -> None:
    trainer = agl.Trainer(n_runners=1, tracer=OtelTracer())
    with pytest.raises(ValueError, match="http"):
        trainer.fit_v0(LegacyAgent(), "ftp://example")


def test_a_string_train_dataset_is_an_error_saying_it_was_read_as_a_server_url() -> None:
    trainer = agl.Trainer(n_runners=1, tracer=OtelTracer())
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="pass the tasks as a list"):
        trainer.fit(LegacyAgent(), "what is 2 + 2?")


async def test_task_server_on_a_taken_port_fails_to_start_and_can_stop() -> None:
    with taken_port() as port:
        server = agl.AgentLightningServer(host="127.0.0.1", port=port)
        with pytest.raises(RuntimeError, match="did not start up within"):
            await server.start()
    await server.stop()
