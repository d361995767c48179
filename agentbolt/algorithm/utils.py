"""Helpers shared by algorithm implementations: batching over datasets, task keys, injecting the store / LLM proxy."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, List, Sequence, TypeVar

from agentbolt.types import Dataset

if TYPE_CHECKING:
    from .base import Algorithm

__all__ = ["batch_iter_over_dataset", "task_key", "with_store", "with_llm_proxy"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A", bound="Algorithm")
R = TypeVar("R")


def batch_iter_over_dataset(dataset: Dataset[T], batch_size: int) -> Iterator[Sequence[T]]:
    """Endless stream of shuffled batches of ``batch_size`` items, with no item twice in one batch.

    When ``batch_size`` covers the dataset, every batch is a shuffled copy of the whole dataset. Otherwise indices are
    reshuffled each epoch and consumed in order; a batch that straddles two epochs skips indices it already holds.

    Args:
        dataset: An indexable dataset.
        batch_size: Items per batch (>= 1).

    Yields:
        Batches of items.

    Raises:
        ValueError: If the dataset is empty or ``batch_size`` < 1.
    """
    size = len(dataset)
    if size == 0:
        raise ValueError("Cannot iterate over an empty dataset.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if batch_size >= size:
        while True:
            items = [dataset[i] for i in range(size)]
            random.shuffle(items)
            yield items
    batch: List[int] = []
    while True:
        order = list(range(size))
        random.shuffle(order)
        for index in order:
            if index in batch:
                continue
            batch.append(index)
            if len(batch) == batch_size:
                yield [dataset[i] for i in batch]
                batch = []


def task_key(task: Any) -> str:
    """A short stable id of a task (a rollout input): the hash of its canonical JSON.

    Equal tasks have equal keys wherever they sit in a dataset, and a changed task gets a new key.
    """
    text = json.dumps(task, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def with_store(func: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Decorate ``async def method(self, store, *args, **kwargs)`` so callers omit ``store``.

    The algorithm's :meth:`~agentbolt.algorithm.Algorithm.get_store` is passed in.
    """

    @functools.wraps(func)
    async def wrapper(self: Algorithm, *args: Any, **kwargs: Any) -> R:
        return await func(self, self.get_store(), *args, **kwargs)

    return wrapper


def with_llm_proxy(
    required: bool = False, auto_start: bool = True
) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Decorate ``async def method(self, llm_proxy, *args, **kwargs)`` so callers omit ``llm_proxy``.

    Stacked over :func:`with_store` the method signature is ``(self, store, llm_proxy, *args)``.

    Args:
        required: Raise ``ValueError`` when the algorithm has no LLM proxy (else None is passed).
        auto_start: Start a proxy that is not running before the call and stop it afterwards.
    """

    def decorator(func: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(func)
        async def wrapper(self: Algorithm, *args: Any, **kwargs: Any) -> R:
            proxy = self.get_llm_proxy()
            if proxy is None and required:
                raise ValueError(f"{type(self).__name__}.{func.__name__} needs an LLM proxy; none was set.")
            started = False
            if proxy is not None and auto_start and not proxy.is_running():
                logger.info("Starting the LLM proxy for %s.", type(self).__name__)
                await proxy.start()
                started = True
            try:
                return await func(self, proxy, *args, **kwargs)
            finally:
                if started and proxy is not None:
                    logger.info("Stopping the LLM proxy started for %s.", type(self).__name__)
                    await proxy.stop()

        return wrapper

    return decorator
