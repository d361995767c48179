"""The dashboard's read routes on a real store server: rollout summaries with filters, workers, resource scores."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

import httpx
import pytest
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import EnqueueRolloutRequest, PromptTemplate

from .seeding import seed_small


@pytest.fixture
async def seeded() -> AsyncIterator[Tuple[httpx.AsyncClient, Dict[str, List[str]]]]:
    store = InMemoryLightningStore(thread_safe=True)
    ids = await seed_small(store)
    server = LightningStoreServer(store, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard") as http:
            yield http, ids
    finally:
        await server.stop()


async def _rollouts(http: httpx.AsyncClient, **params: Any) -> Dict[str, Any]:
    answer = await http.get("/rollouts", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_a_page_of_summaries_carries_the_latest_attempt_reward_and_counts(seeded: Any) -> None:
    http, ids = seeded
    page = await _rollouts(http, limit=2, sort_by="start_time", sort_order="asc")

    assert page["total"] == 6 and len(page["items"]) == 2
    first = page["items"][0]
    assert first["rollout_id"] == ids["train"][0]
    assert first["reward"] == 0.0 and first["attempt"]["worker_id"] == "Worker-0"
    assert first["input_preview"].startswith('{"question":"what is 0 + 0?"')
    assert page["counts"]["succeeded"] == 4 and page["counts"]["failed"] == 1 and page["counts"]["queuing"] == 1


async def test_filters_combine(seeded: Any) -> None:
    http, ids = seeded
    by_mode = await _rollouts(http, mode=["val", "test"])
    assert {r["rollout_id"] for r in by_mode["items"]} == {*ids["val"], *ids["queued"]}
    by_worker = await _rollouts(http, worker_id="Worker-1", mode="train")
    assert {r["rollout_id"] for r in by_worker["items"]} == {ids["train"][1], ids["train"][3]}
    by_text = await _rollouts(http, text="FRANCE")
    assert [r["rollout_id"] for r in by_text["items"]] == ids["val"]
    by_reward = await _rollouts(http, reward_min=0.3, reward_max=0.6)
    assert [r["reward"] for r in by_reward["items"]] == [0.5]
    by_status = await _rollouts(http, status="failed")
    assert [r["rollout_id"] for r in by_status["items"]] == ids["val"]
    none_mode = await _rollouts(http, mode="none")
    assert none_mode["total"] == 0


async def test_time_range_and_resources_filters(seeded: Any) -> None:
    http, ids = seeded
    everything = await _rollouts(http, start_after=time.time() - 3600, start_before=time.time() + 1)
    assert everything["total"] == 6
    assert (await _rollouts(http, start_after=time.time() + 3600))["total"] == 0
    resources_id = everything["items"][-1]["resources_id"]
    assert resources_id is not None
    used = await _rollouts(http, resources_id=resources_id)
    assert {r["rollout_id"] for r in used["items"]} == {
        r["rollout_id"] for r in everything["items"] if r["resources_id"] == resources_id
    }
    assert set(ids["train"]) <= {r["rollout_id"] for r in used["items"]}
    assert (await _rollouts(http, resources_id="rs-other"))["total"] == 0


async def test_sorting_by_reward_puts_missing_rewards_last_and_pages(seeded: Any) -> None:
    http, _ = seeded
    descending = await _rollouts(http, sort_by="reward", sort_order="desc")
    assert [r["reward"] for r in descending["items"]] == [0.75, 0.5, 0.25, 0.0, None, None]
    second = await _rollouts(http, sort_by="reward", sort_order="asc", limit=2, offset=2)
    assert [r["reward"] for r in second["items"]] == [0.5, 0.75]
    assert second["total"] == 6


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"limit": 0}, 422),
        ({"limit": 501}, 422),
        ({"offset": -1}, 422),
        ({"sort_by": "input"}, 422),
        ({"status": "bogus"}, 422),
        ({"reward_min": "high"}, 422),
        ({"reward_min": 1, "reward_max": 0}, 400),
        ({"start_after": 10, "start_before": 5}, 400),
        ({"reward_min": "nan"}, 422),  # NaN would switch the filter off
        ({"start_after": "nan", "start_before": 0}, 422),
        ({"offset": 2**63}, 422),
    ],
)
async def test_bad_query_parameters_are_rejected_with_a_message(
    seeded: Any, params: Dict[str, Any], status: int
) -> None:
    http, _ = seeded
    answer = await http.get("/rollouts", params=params)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]


async def test_every_refused_query_parameter_is_named_by_its_location(seeded: Any) -> None:
    # What the rollouts page relies on to leave the invalid parameters of a link out, and only those.
    http, _ = seeded
    params = {"offset": -5, "sort_by": "bogus", "sort_order": "sideways", "status": ["failed", "weird"]}
    answer = await http.get("/rollouts", params=params)
    assert answer.status_code == 422
    assert {tuple(issue["loc"]) for issue in answer.json()["detail"]} == {
        ("query", "offset"),
        ("query", "sort_by"),
        ("query", "sort_order"),
        ("query", "status", 1),
    }


async def test_workers_report_their_recent_throughput(seeded: Any) -> None:
    http, _ = seeded
    answer = await http.get("/workers")
    workers = {w["worker_id"]: w for w in answer.json()["items"]}
    assert workers["Worker-0"]["finished_recently"] == 2
    assert workers["Worker-1"]["finished_recently"] == 3
    assert workers["Worker-1"]["throughput_per_minute"] == pytest.approx(3 / 10)


async def test_resource_scores_average_the_final_rewards_of_finished_rollouts(seeded: Any) -> None:
    http, _ = seeded
    (score,) = (await http.get("/resources")).json()["items"]
    assert score["rollouts"] == 5 and score["rewarded"] == 4  # the failed rollout recorded no reward
    assert score["mean_reward"] == pytest.approx((0 + 0.25 + 0.5 + 0.75) / 4)


async def test_resource_scores_of_rollouts_no_optimizer_tagged_are_given_per_mode(seeded: Any) -> None:
    http, _ = seeded
    (score,) = (await http.get("/resources")).json()["items"]
    assert score["by_purpose"] == [
        {"purpose": None, "mode": "train", "rollouts": 4, "with_reward": 4, "score": (0 + 0.25 + 0.5 + 0.75) / 4},
        {"purpose": None, "mode": "val", "rollouts": 1, "with_reward": 0, "score": 0.0},  # it failed
    ]


# Each task's outcome: (reward emitted, how the rollout ends).
SEARCH_OUTCOMES: Dict[str, Tuple[Optional[float], str]] = {
    "val-a": (0.25, "succeeded"),
    "val-b": (float("nan"), "succeeded"),
    "val-c": (1.0, "succeeded"),
    "val-d": (0.5, "failed"),
    "train-a": (1.0, "succeeded"),
    "train-b": (None, "succeeded"),
}


async def _run_tasks(store: InMemoryLightningStore, count: int) -> None:
    """A worker: finishes ``count`` rollouts as ``SEARCH_OUTCOMES`` says."""
    from .seeding import reward_span

    for _ in range(count):
        claimed = None
        while claimed is None:
            claimed = await store.dequeue_rollout(worker_id="Worker-0")
            if claimed is None:
                await asyncio.sleep(0.01)
        reward, status = SEARCH_OUTCOMES[claimed.input["task"]]
        attempt_id = claimed.attempt.attempt_id
        if reward is not None:
            sequence_id = await store.get_next_span_sequence_id(claimed.rollout_id, attempt_id)
            await store.add_span(reward_span(claimed.rollout_id, attempt_id, sequence_id, reward))
        await store.update_attempt(claimed.rollout_id, attempt_id, status=status)  # type: ignore[arg-type]


async def test_a_prompt_is_scored_per_purpose_as_the_prompt_optimizer_scored_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A real prompt search evaluates one candidate on validation tasks (rewards 0.25, NaN, 1.0, and 0.5 from a
    # rollout that then failed) and on training tasks (1.0, and no reward): each purpose's score on the dashboard is
    # the optimizer's own mean, not the mean of the finite rewards of every purpose pooled.
    from agentbolt.adapter import TraceToMessages
    from agentbolt.algorithm.apo.search import FULL_VAL, PromptSearch

    store = InMemoryLightningStore(thread_safe=True)
    search = PromptSearch(run_id="scored")
    adapter = TraceToMessages()
    search.set_store(store)
    search.set_adapter(adapter)
    search.set_initial_resources({"prompt_template": PromptTemplate(template="Answer {task}", engine="f-string")})
    train_tasks = [{"task": "train-a"}, {"task": "train-b"}]
    val_tasks = [{"task": key} for key in ("val-a", "val-b", "val-c", "val-d")]
    seed, train, val = search._start_run(train_tasks, val_tasks)
    candidate = search._create_seed_version(seed)
    validated, _ = await asyncio.gather(
        search.evaluate(candidate, val, mode="val", purpose=FULL_VAL), _run_tasks(store, len(val))
    )
    trained, _ = await asyncio.gather(
        search.evaluate(candidate, train, mode="train", purpose="train"), _run_tasks(store, len(train))
    )
    assert validated.mean == pytest.approx(0.3125) and trained.mean == pytest.approx(0.5)

    server = LightningStoreServer(store, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agentbolt"):
            async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard") as http:
                (score,) = (await http.get("/resources")).json()["items"]
    finally:
        await server.stop()
    # The optimizer warned about the NaN reward when it scored it; the dashboard, which reads the same rollouts at
    # every refresh, does not warn again.
    assert "reported the reward" not in caplog.text
    assert score["resources_id"] == "scored-v0"
    assert score["by_purpose"] == [
        {"purpose": "train", "mode": "train", "rollouts": 2, "with_reward": 1, "score": pytest.approx(trained.mean)},
        {"purpose": FULL_VAL, "mode": "val", "rollouts": 4, "with_reward": 2, "score": pytest.approx(validated.mean)},
    ]
    # The pooled figures keep their meaning: the finite final rewards of all six rollouts, whatever their status.
    assert score["rollouts"] == 6 and score["rewarded"] == 4
    assert score["mean_reward"] == pytest.approx((0.25 + 1.0 + 0.5 + 1.0) / 4)


async def test_rewards_that_cannot_be_read_or_ordered_do_not_break_the_lists() -> None:
    # An agent's reward span without a name, and a NaN reward: the rollouts list, its reward filters and sorting,
    # and the resource scores keep working, as training reads such rewards (as none).
    from .seeding import finish, reward_span

    store = InMemoryLightningStore(thread_safe=True)
    resources = await store.add_resources({})
    rollouts = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=i, resources_id=resources.resources_id) for i in range(3)]
    )
    await finish(store, rollouts[0].rollout_id, "w", 0.5)
    await finish(store, rollouts[1].rollout_id, "w", float("nan"))
    unnamed = await store.start_attempt(rollouts[2].rollout_id, worker_id="w")
    span = reward_span(rollouts[2].rollout_id, unnamed.attempt.attempt_id, 1, 1.0)
    del span.attributes["agentlightning.reward.0.name"]
    await store.add_span(span)
    await store.update_attempt(rollouts[2].rollout_id, unnamed.attempt.attempt_id, status="succeeded")
    server = LightningStoreServer(store, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard") as http:
            listed = {item["rollout_id"]: item["reward"] for item in (await _rollouts(http))["items"]}
            assert listed[rollouts[2].rollout_id] is None  # unreadable: no reward
            in_range = await _rollouts(http, reward_min=0, reward_max=1)
            assert [item["rollout_id"] for item in in_range["items"]] == [rollouts[0].rollout_id]
            by_reward = await _rollouts(http, sort_by="reward", sort_order="asc")
            assert by_reward["items"][0]["rollout_id"] == rollouts[0].rollout_id  # NaN and none go last
            (score,) = (await http.get("/resources")).json()["items"]
            assert score["rewarded"] == 1 and score["mean_reward"] == 0.5
    finally:
        await server.stop()


async def test_inputs_with_integers_beyond_64_bits_are_previewed_and_searched_as_json() -> None:
    store = InMemoryLightningStore(thread_safe=True)
    await store.enqueue_rollout(input={"n": 2**70, "q": "bigint"})
    server = LightningStoreServer(store, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard") as http:
            found = await _rollouts(http, text='"q":"bigint"')
    finally:
        await server.stop()
    assert found["items"][0]["input_preview"] == '{"n":1180591620717411303424,"q":"bigint"}'
