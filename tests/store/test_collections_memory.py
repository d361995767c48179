"""In-memory collections: table semantics, filters, sorting, queue, key-value map, locks and atomic sections."""

from __future__ import annotations

import asyncio
import pickle
import threading
from typing import List, Optional

import pytest
from pydantic import BaseModel

from agentbolt.store.collection import (
    DequeBasedQueue,
    DictBasedKeyValue,
    InMemoryLightningCollections,
    ListBasedCollection,
)
from agentbolt.store.collection import memory as memory_module
from agentbolt.store.collection.base import DuplicatedPrimaryKeyError
from agentbolt.store.collection.memory import _item_matches_filters, _LoopAwareAsyncLock, _ThreadSafeAsyncLock
from agentbolt.types import Attempt, Rollout, Worker

from .conftest import make_span


class Item(BaseModel):
    group: str
    key: str
    value: Optional[int] = None
    label: Optional[str] = None
    end_time: Optional[float] = None
    tags: List[str] = []


def items_collection(*items: Item) -> ListBasedCollection[Item]:
    return ListBasedCollection(list(items), Item, ["group", "key"], id="items")


def keys(result: object) -> List[str]:
    return [f"{item.group}/{item.key}" for item in result]  # type: ignore[attr-defined]


@pytest.fixture
def table() -> ListBasedCollection[Item]:
    return items_collection(
        Item(group="a", key="1", value=3, label="alpha", end_time=2.0, tags=["x"]),
        Item(group="b", key="1", value=1, label=None, end_time=None, tags=["y"]),
        Item(group="a", key="2", value=None, label="beta", end_time=1.0, tags=["x", "y"]),
        Item(group="c", key="9", value=2, label="gamma", end_time=3.0),
    )


# ---------------------------------------------------------------------------------------------------------------------
# Construction and mutation


def test_construction_is_validated() -> None:
    with pytest.raises(ValueError, match="primary_keys"):
        ListBasedCollection([], Item, [])
    with pytest.raises(TypeError):
        ListBasedCollection([], dict, ["k"])  # type: ignore[type-var]
    collection = items_collection()
    assert collection.primary_keys() == ("group", "key")
    assert collection.item_type() is Item
    assert collection.collection_name == "items"


async def test_insert_rejects_duplicates_atomically(table: ListBasedCollection[Item]) -> None:
    with pytest.raises(DuplicatedPrimaryKeyError):
        await table.insert([Item(group="z", key="1"), Item(group="a", key="1")])
    with pytest.raises(DuplicatedPrimaryKeyError):
        await table.insert([Item(group="z", key="1"), Item(group="z", key="1")])
    assert await table.size() == 4  # nothing of the failed batches was written
    with pytest.raises(TypeError):
        await table.insert([Worker(worker_id="w")])  # type: ignore[list-item]


async def test_update_and_delete_missing_items(table: ListBasedCollection[Item]) -> None:
    with pytest.raises(ValueError, match=r"Item does not exist with primary key\(s\): group='z', key='1'"):
        await table.update([Item(group="z", key="1")])
    with pytest.raises(ValueError, match="does not exist"):
        await table.delete([Item(group="a", key="1"), Item(group="z", key="1")])
    assert await table.size() == 4
    await table.delete([Item(group="a", key="1")])
    assert keys(await table.query()) == ["b/1", "a/2", "c/9"]


async def test_update_keeps_position_and_can_target_fields(table: ListBasedCollection[Item]) -> None:
    updated = await table.update([Item(group="a", key="1", value=100, label="ignored")], update_fields=["value"])
    assert updated[0].value == 100 and updated[0].label == "alpha"
    assert keys(await table.query()) == ["a/1", "b/1", "a/2", "c/9"]
    await table.update([Item(group="b", key="1", value=7)])
    replaced = await table.get({"_must": {"group": {"exact": "b"}, "key": {"exact": "1"}}})
    assert replaced is not None and replaced.value == 7 and replaced.tags == []
    with pytest.raises(ValueError, match="Unknown field"):
        await table.update([Item(group="a", key="1")], update_fields=["nope"])


async def test_upsert_modes(table: ListBasedCollection[Item]) -> None:
    replaced = await table.upsert([Item(group="a", key="1", value=9)])
    assert replaced[0].label is None  # update_fields=None replaces the whole item
    partial = await table.upsert(
        [Item(group="a", key="2", value=5, label="x"), Item(group="d", key="1", value=1, label="new")],
        update_fields=["value"],
    )
    assert (partial[0].value, partial[0].label) == (5, "beta")
    assert (partial[1].value, partial[1].label) == (1, "new")  # missing items are inserted whole
    kept = await table.upsert([Item(group="c", key="9", value=0), Item(group="e", key="1")], update_fields=[])
    assert kept[0].value == 2 and kept[1].group == "e"  # get-or-insert
    assert await table.size() == 6


async def test_returned_items_are_copies(table: ListBasedCollection[Item]) -> None:
    item = await table.get({"group": {"exact": "a"}, "key": {"exact": "1"}})
    assert item is not None
    item.value = -1
    again = await table.get({"group": {"exact": "a"}, "key": {"exact": "1"}})
    assert again is not None and again.value == 3
    original = Item(group="x", key="1", value=1)
    await table.insert([original])
    original.value = 2
    stored = await table.get({"group": {"exact": "x"}})
    assert stored is not None and stored.value == 1


# ---------------------------------------------------------------------------------------------------------------------
# Filters


async def test_filter_operators(table: ListBasedCollection[Item]) -> None:
    assert keys(await table.query({"group": {"exact": "a"}})) == ["a/1", "a/2"]
    assert keys(await table.query({"value": {"within": [1, 2]}})) == ["b/1", "c/9"]
    assert keys(await table.query({"label": {"contains": "ta"}})) == ["a/2"]  # None never contains
    assert keys(await table.query({"tags": {"contains": "y"}})) == ["b/1", "a/2"]  # generic membership
    assert keys(await table.query({"value": {"within": 5}})) == []  # TypeError -> no match
    assert keys(await table.query({"value": {"exact": None}})) == ["a/1", "b/1", "a/2", "c/9"]  # None ignored


async def test_filter_aggregation_and_must(table: ListBasedCollection[Item]) -> None:
    both = {"group": {"exact": "a"}, "label": {"contains": "al"}}
    assert keys(await table.query(both)) == ["a/1"]
    either = {**both, "_aggregate": "or"}
    assert keys(await table.query(either)) == ["a/1", "a/2"]
    any_of = {"group": {"exact": "b"}, "value": {"exact": 2}, "_aggregate": "or"}
    assert keys(await table.query(any_of)) == ["b/1", "c/9"]
    must = {"_must": {"group": {"within": ["a", "c"]}}, "value": {"exact": 2}, "label": {"exact": "beta"}}
    assert keys(await table.query({**must, "_aggregate": "or"})) == ["a/2", "c/9"]
    stacked = {"_must": [{"group": {"exact": "a"}}, {"key": {"exact": "2"}}]}
    assert keys(await table.query(stacked)) == ["a/2"]
    contradictory = {"_must": {"group": {"exact": "a"}}, "group": {"exact": "b"}}
    assert keys(await table.query(contradictory)) == []
    pinned = {"_must": {"group": {"exact": "a"}, "key": {"within": ["2", "1", "7"]}}}
    assert keys(await table.query(pinned)) == ["a/1", "a/2"]  # insertion order, not filter order
    groups = {"group": {"within": ["c", "a"]}}
    assert keys(await table.query(groups)) == ["a/1", "a/2", "c/9"]


async def test_invalid_filters_raise(table: ListBasedCollection[Item]) -> None:
    with pytest.raises(ValueError, match="operator"):
        await table.query({"group": {"like": "a"}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="aggregate"):
        await table.query({"group": {"exact": "a"}, "_aggregate": "xor"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="Duplicate"):
        await table.query({"_must": [{"group": {"exact": "a"}}, {"group": {"exact": "b"}}]})
    with pytest.raises(ValueError, match="operator"):
        await table.get({"_must": {"group": {"startswith": "a"}}})  # type: ignore[dict-item]


def test_item_matches_filters_is_pure() -> None:
    item = {"name": "alpha", "n": 3}
    assert _item_matches_filters(item, {"name": {"contains": "lp"}}, "and")
    assert not _item_matches_filters(item, {"name": {"contains": "lp"}, "n": {"exact": 4}}, "and")
    assert _item_matches_filters(item, {"name": {"contains": "zz"}, "n": {"exact": 3}}, "or")
    assert not _item_matches_filters(item, None, "and", {"n": {"within": [1, 2]}})
    assert _item_matches_filters(item, {}, "or")
    # Collections look the function up through the module global, so backends can share one definition.
    assert memory_module._item_matches_filters is _item_matches_filters


# ---------------------------------------------------------------------------------------------------------------------
# Sorting and pagination


async def test_sorting_rules(table: ListBasedCollection[Item]) -> None:
    assert keys(await table.query(sort={"name": "end_time", "order": "asc"})) == ["a/2", "a/1", "c/9", "b/1"]
    assert keys(await table.query(sort={"name": "end_time", "order": "desc"})) == ["b/1", "c/9", "a/1", "a/2"]
    assert keys(await table.query(sort={"name": "value", "order": "asc"})) == ["a/2", "b/1", "c/9", "a/1"]
    assert keys(await table.query(sort={"name": "label", "order": "asc"})) == ["b/1", "a/1", "a/2", "c/9"]
    with pytest.raises(ValueError, match="sort field"):
        await table.query(sort={"name": "missing", "order": "asc"})
    mixed = ListBasedCollection(
        [Rollout(rollout_id="r1", input=1, start_time=0.0), Rollout(rollout_id="r2", input="a", start_time=0.0)],
        Rollout,
        ["rollout_id"],
    )
    with pytest.raises(TypeError, match="not comparable"):
        await mixed.query(sort={"name": "input", "order": "asc"})
    with pytest.raises(TypeError, match="not comparable"):
        await mixed.get(sort={"name": "input", "order": "desc"})
    with pytest.raises(ValueError, match="name"):
        await table.query(sort={"order": "asc"})  # type: ignore[typeddict-item]
    with pytest.raises(ValueError, match="order"):
        await table.query(sort={"name": "value", "order": "up"})  # type: ignore[typeddict-item]


async def test_get_with_sort_returns_extremes(table: ListBasedCollection[Item]) -> None:
    top = await table.get(sort={"name": "value", "order": "desc"})
    bottom = await table.get({"group": {"exact": "a"}}, sort={"name": "value", "order": "asc"})
    assert top is not None and top.key == "1" and top.group == "a"
    assert bottom is not None and bottom.key == "2"
    assert await table.get({"group": {"exact": "zzz"}}) is None
    first = await table.get()
    assert first is not None and (first.group, first.key) == ("a", "1")


async def test_pagination(table: ListBasedCollection[Item]) -> None:
    page = await table.query(sort={"name": "key", "order": "asc"}, limit=2, offset=1)
    assert len(page) == 2 and page.total == 4 and (page.limit, page.offset) == (2, 1)
    assert len(await table.query(limit=0)) == 0
    assert (await table.query(limit=0)).total == 4
    assert len(await table.query(limit=-1, offset=3)) == 1
    assert len(await table.query(offset=10)) == 0
    with pytest.raises(ValueError):
        await table.query(limit=-2)
    with pytest.raises(ValueError):
        await table.query(offset=-1)


async def test_store_model_collections_index_by_rollout() -> None:
    collections = InMemoryLightningCollections("asyncio")
    attempts = [
        Attempt(rollout_id=f"ro-{r}", attempt_id=f"at-{a}", sequence_id=a, start_time=0.0)
        for r in range(3)
        for a in range(1, 4)
    ]
    await collections.attempts.insert(attempts)
    latest = await collections.attempts.get(
        {"_must": {"rollout_id": {"exact": "ro-1"}}}, sort={"name": "sequence_id", "order": "desc"}
    )
    assert latest is not None and (latest.rollout_id, latest.sequence_id) == ("ro-1", 3)
    counted = await collections.attempts.query({"_must": {"rollout_id": {"exact": "ro-2"}}}, limit=0)
    assert counted.total == 3
    await collections.spans.insert([make_span("ro-1", "at-1", 1, "s1"), make_span("ro-2", "at-1", 2, "s2")])
    assert await collections.evict_spans_for_rollout("ro-1") == 1
    assert await collections.evict_spans_for_rollout("ro-1") == 0
    assert [s.span_id for s in await collections.spans.query()] == ["s2"]


# ---------------------------------------------------------------------------------------------------------------------
# Queue and key-value map


async def test_deque_queue() -> None:
    queue: DequeBasedQueue[str] = DequeBasedQueue(str, ["a"])
    assert await queue.enqueue(["b", "c", "a"]) == ["b", "c", "a"]
    assert await queue.size() == 4
    assert await queue.peek(2) == ["a", "b"]
    assert await queue.peek(0) == []
    assert await queue.has("c") and not await queue.has("z")
    assert await queue.dequeue(3) == ["a", "b", "c"]
    assert await queue.has("a")  # the second "a" is still queued
    assert await queue.dequeue(5) == ["a"]
    assert await queue.dequeue() == []
    assert not await queue.has("a")
    with pytest.raises(TypeError):
        await queue.enqueue([1])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        await queue.has(1)  # type: ignore[arg-type]
    assert queue.item_type() is str


async def test_dict_key_value() -> None:
    kv: DictBasedKeyValue[str, int] = DictBasedKeyValue({"a": 1})
    assert await kv.has("a") and not await kv.has("b")
    assert await kv.get("b", 7) == 7
    assert await kv.inc("a", 2) == 3
    assert await kv.inc("new", 5) == 5
    assert await kv.chmax("a", 2) == 3
    assert await kv.chmax("a", 10) == 10
    assert await kv.chmax("fresh", 4) == 4
    await kv.set("s", 1)
    assert await kv.size() == 4
    assert await kv.pop("s") == 1 and await kv.pop("s", -1) == -1
    with pytest.raises(TypeError):
        await kv.inc("a", True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await kv.chmax("a", "9")  # type: ignore[arg-type]
    await kv.set("text", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await kv.inc("text", 1)
    assert await kv.get("a") == 10


# ---------------------------------------------------------------------------------------------------------------------
# Locks and atomic sections


async def test_loop_aware_lock_semantics() -> None:
    lock = _LoopAwareAsyncLock()
    with pytest.raises(RuntimeError):
        lock.release()
    async with lock:
        assert lock.locked()
    assert not lock.locked()
    clone = pickle.loads(pickle.dumps(lock))
    async with clone:
        assert clone.locked()

    # The same object works from another thread's event loop.
    def other_loop() -> bool:
        async def use() -> bool:
            async with lock:
                return lock.locked()

        return asyncio.run(use())

    assert await asyncio.to_thread(other_loop)


async def test_thread_safe_lock_excludes_other_threads() -> None:
    lock = _ThreadSafeAsyncLock()
    with pytest.raises(RuntimeError):
        lock.release()
    inside = 0
    overlaps = 0
    guard = threading.Lock()

    async def critical() -> None:
        nonlocal inside, overlaps
        async with lock:
            with guard:
                inside += 1
                overlaps += inside > 1
            await asyncio.sleep(0.001)
            with guard:
                inside -= 1

    def worker() -> None:
        async def run() -> None:
            await asyncio.gather(*(critical() for _ in range(20)))

        asyncio.run(run())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    await asyncio.gather(*(critical() for _ in range(20)))
    for thread in threads:
        await asyncio.to_thread(thread.join)
    assert overlaps == 0 and inside == 0


@pytest.mark.parametrize("lock_type", ["asyncio", "thread"])
async def test_atomic_sections_serialise_writers(lock_type: str) -> None:
    collections = InMemoryLightningCollections(lock_type)  # type: ignore[arg-type]
    order: List[str] = []

    async def writer(name: str) -> None:
        async with collections.atomic(mode="rw", labels=["rollouts", "attempts"]):
            order.append(f"{name}-in")
            await asyncio.sleep(0.005)
            order.append(f"{name}-out")

    async def reader() -> None:
        await asyncio.sleep(0.001)
        async with collections.atomic(mode="r"):
            order.append("reader")

    await asyncio.gather(writer("a"), writer("b"), reader())
    assert order.index("a-out") < order.index("b-in")
    if lock_type == "asyncio":  # plain reads take no lock: nothing else runs while one walks the collections
        assert order.index("reader") < order.index("a-out")
    else:  # another thread could change a collection while a read walks it ("deque mutated during iteration")
        assert order.index("reader") > order.index("a-out")
    with pytest.raises(ValueError, match="label"):
        async with collections.atomic(labels=["bogus"]):  # type: ignore[list-item]
            pass
    async with collections.atomic(labels=["rollouts"]):  # locks were released after the error
        pass


def test_collections_pickle_without_locks() -> None:
    collections = InMemoryLightningCollections("thread")
    clone = pickle.loads(pickle.dumps(collections))
    assert clone.collection_name == "router"

    async def use() -> int:
        await clone.rollouts.insert([Rollout(rollout_id="ro-1", input=None, start_time=0.0)])
        async with clone.atomic(labels=["rollouts"]):
            return await clone.rollouts.size()

    assert asyncio.run(use()) == 1
    with pytest.raises(ValueError, match="lock_type"):
        InMemoryLightningCollections("process")  # type: ignore[arg-type]


async def test_the_in_memory_store_shares_only_what_cannot_be_copied() -> None:
    # A task input the SQL stores would refuse (it is no JSON) still works in memory: what cannot be copied (a lock,
    # a client...) is shared, everything around it is copied.
    from agentbolt.store.memory import InMemoryLightningStore

    lock = threading.Lock()
    task = {"history": [1], "lock": lock}
    store = InMemoryLightningStore()
    await store.enqueue_rollout(task)
    claimed = await store.dequeue_rollout()
    assert claimed is not None and claimed.input["lock"] is lock
    claimed.input["history"].append(2)
    stored = await store.get_rollout_by_id(claimed.rollout_id)
    assert stored is not None and stored.input["history"] == [1] and stored.input["lock"] is lock
