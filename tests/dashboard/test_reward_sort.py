"""Sorting the rollouts list by reward: the reward of each rollout's latest attempt orders it, ties keep the store's
order, rollouts without a reward go last, and each reward span is parsed once per request."""

from __future__ import annotations

import collections
import math
from typing import Any, AsyncIterator, Dict, List, Literal, Tuple

import httpx
import pytest
from support.servers import free_port

from agentbolt.store.client_server import LightningStoreServer
from agentbolt.store.memory import InMemoryLightningStore
from agentbolt.types import EnqueueRolloutRequest, Rollout
from agentbolt.utils import reward_spans

from .seeding import finish, reward_span

Served = Tuple[InMemoryLightningStore, httpx.AsyncClient, Dict[str, str]]


async def _add_rewards(store: InMemoryLightningStore, rollout_id: str, *rewards: float) -> str:
    """Start an attempt, record one reward span per reward (the last one counts), succeed it; its attempt id."""
    attempt_id = (await store.start_attempt(rollout_id, worker_id="w")).attempt.attempt_id
    for reward in rewards:
        sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
        await store.add_span(reward_span(rollout_id, attempt_id, sequence_id, reward))
    await store.update_attempt(rollout_id, attempt_id, status="succeeded")
    return attempt_id


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """Rollouts whose reward spans differ: ties, a later span or attempt that overrides, none, NaN."""
    store = InMemoryLightningStore(thread_safe=True)
    resources = await store.add_resources({})
    names = ["tie-a", "tie-b", "tie-c", "two-spans", "retried", "retried-unrewarded", "queued", "nan", "negative"]
    rollouts = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=name, resources_id=resources.resources_id) for name in names]
    )
    ids = {name: rollout.rollout_id for name, rollout in zip(names, rollouts, strict=True)}
    for name in ("tie-a", "tie-b", "tie-c"):
        await finish(store, ids[name], "w", 0.5)
    await _add_rewards(store, ids["two-spans"], 1.0, 0.25)
    await finish(store, ids["retried"], "w", 0.9, status="failed")
    await finish(store, ids["retried"], "w", 0.1)
    await finish(store, ids["retried-unrewarded"], "w", 0.8, status="failed")
    await finish(store, ids["retried-unrewarded"], "w", None)
    await finish(store, ids["nan"], "w", float("nan"))
    await finish(store, ids["negative"], "w", -1.0)
    server = LightningStoreServer(store, host="127.0.0.1", port=free_port())
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.endpoint + "/v1/agl/dashboard") as http:
            yield store, http, ids
    finally:
        await server.stop()


async def _listed(http: httpx.AsyncClient, **params: Any) -> List[Tuple[str, Any]]:
    answer = await http.get("/rollouts", params=params)
    assert answer.status_code == 200, answer.text
    return [(item["rollout_id"], item["reward"]) for item in answer.json()["items"]]


def _in_store_order(store_order: List[Rollout], ids: List[str]) -> List[str]:
    position = {rollout.rollout_id: index for index, rollout in enumerate(store_order)}
    return sorted(ids, key=position.__getitem__)


@pytest.mark.parametrize("sort_order", ["desc", "asc"])
async def test_a_reward_sort_orders_by_the_latest_attempts_last_reward_ties_in_the_store_order(
    served: Served, sort_order: Literal["asc", "desc"]
) -> None:
    store, http, ids = served
    store_order = list(await store.query_rollouts(sort_by="start_time", sort_order=sort_order))
    ties = _in_store_order(store_order, [ids["tie-a"], ids["tie-b"], ids["tie-c"]])
    unrewarded = _in_store_order(store_order, [ids["retried-unrewarded"], ids["queued"], ids["nan"]])
    others = [(ids["negative"], -1.0), (ids["retried"], 0.1), (ids["two-spans"], 0.25)]
    tied = [(rollout_id, 0.5) for rollout_id in ties]
    rewarded = others + tied if sort_order == "asc" else tied + others[::-1]

    listed = await _listed(http, sort_by="reward", sort_order=sort_order)

    assert listed[: len(rewarded)] == rewarded
    assert [rollout_id for rollout_id, _ in listed[len(rewarded) :]] == unrewarded
    shown = dict(listed)
    assert shown[ids["retried-unrewarded"]] is None and shown[ids["queued"]] is None


async def test_pages_of_a_reward_sort_split_its_whole_order(served: Served) -> None:
    _, http, _ = served
    whole = await _listed(http, sort_by="reward", sort_order="desc")

    pages = [await _listed(http, sort_by="reward", sort_order="desc", limit=2, offset=o) for o in range(0, 10, 2)]

    assert [item for page in pages for item in page] == whole and len(whole) == 9


async def test_a_reward_sort_and_the_resource_scores_parse_each_reward_span_once(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, http, ids = served
    parsed: collections.Counter[Tuple[str, str, int]] = collections.Counter()
    read = reward_spans.get_reward_value

    def counting(span: Any) -> Any:
        parsed[(span.rollout_id, span.attempt_id, span.sequence_id)] += 1
        return read(span)

    monkeypatch.setattr(reward_spans, "get_reward_value", counting)

    listed = await _listed(http, sort_by="reward", sort_order="desc", reward_min=-10)
    assert len(listed) == 6 and max(parsed.values()) == 1
    # Only the spans of latest attempts are read: not the failed first attempts'.
    assert {rollout_id for rollout_id, _, _ in parsed} == set(ids.values()) - {ids["queued"], ids["retried-unrewarded"]}
    parsed.clear()
    (score,) = (await http.get("/resources")).json()["items"]
    assert max(parsed.values()) == 1
    assert score["rewarded"] == 6 and math.isclose(score["mean_reward"], (0.5 * 3 + 0.25 + 0.1 - 1.0) / 6)
