"""Execution strategies decide where the algorithm and the runners run (threads, processes, machines)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable, Protocol

from .events import ExecutionEvent

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = ["AlgorithmBundle", "RunnerBundle", "ExecutionStrategy"]


class AlgorithmBundle(Protocol):
    """The algorithm side, ready to run against a store until done (then it returns)."""

    def __call__(self, store: LightningStore, event: ExecutionEvent) -> Awaitable[None]: ...


class RunnerBundle(Protocol):
    """One runner worker, ready to run against a store until ``event`` is set."""

    def __call__(self, store: LightningStore, worker_id: int, event: ExecutionEvent) -> Awaitable[None]: ...


class ExecutionStrategy:
    """Runs one algorithm bundle and one or more runner bundles that share a store."""

    alias: str = ""

    def execute(self, algorithm: AlgorithmBundle, runner: RunnerBundle, store: LightningStore) -> None:
        """Run both sides until the algorithm finishes (or a side fails, or the user interrupts)."""
        raise NotImplementedError()
