"""The dashboard reads the rewards of a rollout list in one store call, whatever the number of rollouts, with the
rewards and the order that reading them one rollout at a time gives, on every store a server can serve."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

import httpx
import pytest
from support.servers import free_port

from agentbolt.store import dashboard
from agentbolt.store.base import LightningStore
from agentbolt.store.client_server import LightningStoreServer
from agentbolt.types import AttemptedRollout, EnqueueRolloutRequest, Span
from agentbolt.utils.reward_spans import REWARD_SPAN_NAME, find_final_reward

from .conftest import make_span, make_store

SERVED_BACKENDS = ["memory_thread_safe", "threaded", "sqlite", "postgres"]
ROLLOUTS = 300


class CountingServer(LightningStoreServer):
    """A store server recording each store call its routes make (name, arguments), then making it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: List[Tuple[str, Tuple[Any, ...], Dict[str, Any]]] = []

    async def _call_store(self, method_name: str, /, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((method_name, args, kwargs))
        return await super()._call_store(method_name, *args, **kwargs)

    def names(self) -> List[str]:
        return [name for name, _, _ in self.calls]


def reward_span(rollout_id: str, attempt_id: str, sequence_id: int, value: float, **attributes: Any) -> Span:
    return make_span(
        rollout_id,
        attempt_id,
        sequence_id,
        f"{sequence_id:016x}",
        name=REWARD_SPAN_NAME,
        attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value, **attributes},
    )


async def seed(store: LightningStore, count: int) -> None:
    """``count`` finished rollouts, a quarter of them validation, with distinct rewards; every tenth has none, every
    seventh a second reward span (the last counts), every twenty-fifth a first attempt whose reward does not count."""
    await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=f"task {i}", mode="val" if i % 4 == 0 else "train") for i in range(count)]
    )
    claimed = await store.dequeue_many_rollouts(limit=count, worker_id="w")
    spans: List[Span] = []
    for i, started in enumerate(claimed):
        rollout_id, attempt_id = started.rollout_id, started.attempt.attempt_id
        if i % 25 == 0:
            spans.append(reward_span(rollout_id, attempt_id, 1, 5.0))
            await store.update_attempt(rollout_id, attempt_id, status="failed")
            attempt_id = (await store.start_attempt(rollout_id, worker_id="w")).attempt.attempt_id
        if i % 10 != 0:
            if i % 7 == 0:
                spans.append(reward_span(rollout_id, attempt_id, 2, 9.0))
            spans.append(reward_span(rollout_id, attempt_id, 3, (i * 37 % count) / count))
    await store.add_many_spans(spans)
    for rollout in await store.query_rollouts():
        assert isinstance(rollout, AttemptedRollout)
        if rollout.attempt.status != "succeeded":
            await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")


async def rewards_one_rollout_at_a_time(store: LightningStore) -> Dict[str, Optional[float]]:
    """The final reward of each rollout as read rollout by rollout: its latest attempt's reward spans."""
    rewards: Dict[str, Optional[float]] = {}
    for rollout in await store.query_rollouts():
        assert isinstance(rollout, AttemptedRollout)
        spans = await store.query_spans(rollout.rollout_id, rollout.attempt.attempt_id, name=REWARD_SPAN_NAME)
        rewards[rollout.rollout_id] = find_final_reward(spans)
    return rewards


@pytest.fixture(params=SERVED_BACKENDS)
async def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Tuple[LightningStore, CountingServer, httpx.AsyncClient]]:
    async with make_store(request.param, tmp_path) as store:
        server = CountingServer(store, host="127.0.0.1", port=free_port())
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard", timeout=120) as http:
                yield store, server, http
        finally:
            await server.stop()


async def rollouts_page(http: httpx.AsyncClient, **params: Any) -> Dict[str, Any]:
    answer = await http.get("/rollouts", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def test_a_reward_sort_gives_the_rewards_and_order_of_reading_them_one_rollout_at_a_time(
    served: Tuple[LightningStore, CountingServer, httpx.AsyncClient],
) -> None:
    store, _, http = served
    await seed(store, ROLLOUTS)
    expected = await rewards_one_rollout_at_a_time(store)

    page = await rollouts_page(http, sort_by="reward", sort_order="desc", limit=500)

    assert page["total"] == ROLLOUTS
    listed = [(item["rollout_id"], item["reward"]) for item in page["items"]]
    assert dict(listed) == expected
    rewarded = sorted(((r, i) for i, r in expected.items() if r is not None), key=lambda pair: -pair[0])
    assert listed[: len(rewarded)] == [(i, r) for r, i in rewarded]
    assert all(reward is None for _, reward in listed[len(rewarded) :])
    assert len(rewarded) == ROLLOUTS - ROLLOUTS // 10


async def test_the_store_calls_of_a_reward_sort_do_not_grow_with_the_number_of_rollouts(
    served: Tuple[LightningStore, CountingServer, httpx.AsyncClient],
) -> None:
    store, server, http = served
    await seed(store, ROLLOUTS)

    await rollouts_page(http, sort_by="reward", mode="val")  # a quarter of the rollouts
    few = server.names()
    server.calls.clear()
    await rollouts_page(http, sort_by="reward")
    many = server.names()

    assert many == few
    assert many.count("query_spans_of_attempts") == 1 and "query_spans" not in many
    ((_, (pairs,), kwargs),) = [call for call in server.calls if call[0] == "query_spans_of_attempts"]
    assert len(pairs) == ROLLOUTS and kwargs == {"name": REWARD_SPAN_NAME}


async def test_a_page_the_store_sorts_reads_the_rewards_of_its_rollouts_in_one_call(
    served: Tuple[LightningStore, CountingServer, httpx.AsyncClient],
) -> None:
    store, server, http = served
    await seed(store, ROLLOUTS)
    expected = await rewards_one_rollout_at_a_time(store)

    page = await rollouts_page(http, limit=50, offset=100)

    assert {item["rollout_id"]: item["reward"] for item in page["items"]} == {
        item["rollout_id"]: expected[item["rollout_id"]] for item in page["items"]
    }
    ((_, (pairs,), _),) = [call for call in server.calls if call[0] == "query_spans_of_attempts"]
    assert len(pairs) == 50 and "query_spans" not in server.names()


async def test_rewards_of_rollouts_that_ended_a_while_ago_are_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "_REWARD_SETTLE_SECONDS", 0.0)  # every ended rollout has settled
    async with make_store("sqlite", tmp_path) as store:
        await seed(store, 20)
        running = await store.start_rollout(input="still running", worker_id="w")
        await store.add_span(reward_span(running.rollout_id, running.attempt.attempt_id, 1, 0.5))
        server = CountingServer(store, host="127.0.0.1", port=free_port())
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard") as http:
                first = await rollouts_page(http, sort_by="reward")
                server.calls.clear()
                second = await rollouts_page(http, sort_by="reward")
        finally:
            await server.stop()
    assert [(i["rollout_id"], i["reward"]) for i in second["items"]] == [
        (i["rollout_id"], i["reward"]) for i in first["items"]
    ]
    (read,) = [args[0] for name, args, _ in server.calls if name == "query_spans_of_attempts"]
    assert read == [(running.rollout_id, running.attempt.attempt_id)], "only the running rollout is read again"


async def test_an_unreadable_reward_span_shows_no_reward_for_its_rollout_only(
    served: Tuple[LightningStore, CountingServer, httpx.AsyncClient], caplog: pytest.LogCaptureFixture
) -> None:
    store, _, http = served
    started = [await store.start_rollout(input=f"task {i}", worker_id="w") for i in range(3)]
    unnamed = reward_span(started[1].rollout_id, started[1].attempt.attempt_id, 1, 1.0)
    del unnamed.attributes["agentlightning.reward.0.name"]
    await store.add_many_spans(
        [
            reward_span(started[0].rollout_id, started[0].attempt.attempt_id, 1, 0.25),
            unnamed,
            reward_span(started[2].rollout_id, started[2].attempt.attempt_id, 1, 0.75),
        ]
    )
    for rollout in started:
        await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")

    with caplog.at_level(logging.WARNING, logger="agentbolt.store.server"):
        page = await rollouts_page(http, sort_by="reward", sort_order="desc")

    assert [(item["rollout_id"], item["reward"]) for item in page["items"]] == [
        (started[2].rollout_id, 0.75),
        (started[0].rollout_id, 0.25),
        (started[1].rollout_id, None),
    ]
    warnings = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert warnings and all(started[1].rollout_id in message for message in warnings)
