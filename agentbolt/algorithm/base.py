"""The algorithm interface: what drives training from the store's side."""

from __future__ import annotations

import contextvars
import inspect
import weakref
from typing import TYPE_CHECKING, Any, Collection, Dict, Optional

from agentbolt.types import Dataset, NamedResources
from agentbolt.utils.weak import TrainerReference, deref

if TYPE_CHECKING:
    from agentbolt.adapter import TraceAdapter
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.store.base import LightningStore

__all__ = ["Algorithm", "dataset_arguments", "refuse_data_parallel_launch", "running_algorithm"]

_DATASET_PARAMETERS = ("train_dataset", "val_dataset")

_running_algorithm: contextvars.ContextVar[Optional[Algorithm]] = contextvars.ContextVar(
    "agentbolt_running_algorithm", default=None
)


def refuse_data_parallel_launch(algorithm: Algorithm) -> None:
    """Refuse a ``torchrun`` launch of several ranks for an algorithm that trains in one process.

    Without this, every rank would run the whole algorithm: N stores, N sets of runners and N copies of the same
    training, competing for the same ports and files.

    Raises:
        ValueError: This process is one of several ranks (``WORLD_SIZE`` > 1), or the variables are malformed.
    """
    from agentbolt.algorithm.grpo.distributed import launched_rank

    rank, world_size = launched_rank()
    if world_size > 1:
        raise ValueError(
            f"{type(algorithm).__name__} trains in one process, but this is rank {rank} of {world_size} of a "
            "torchrun launch: run the script as one process (data-parallel training is available for GRPO)"
        )


def running_algorithm() -> Optional[Algorithm]:
    """The algorithm whose :meth:`Algorithm.run` is executing here (started by a trainer), or None.

    Lets what an algorithm's run uses (its metrics loggers, say) reach the algorithm's store without being handed it.
    """
    return _running_algorithm.get()


def dataset_arguments(
    owner: str, accepted: Collection[str], train_dataset: Optional[Dataset[Any]], val_dataset: Optional[Dataset[Any]]
) -> Dict[str, Any]:
    """Keyword arguments handing the datasets to a callable that accepts the parameters named in ``accepted``.

    A dataset whose parameter is not accepted is left out when it is None.

    Raises:
        TypeError: A dataset is given but ``owner`` has no parameter to receive it.
    """
    kwargs: Dict[str, Any] = {}
    for name, dataset in zip(_DATASET_PARAMETERS, (train_dataset, val_dataset), strict=True):
        if name in accepted:
            kwargs[name] = dataset
        elif dataset is not None:
            raise TypeError(f"{owner} got a {name} but has no `{name}` parameter to receive it.")
    return kwargs


class Algorithm(TrainerReference):
    """Base class of training algorithms.

    An algorithm enqueues rollouts into the store, publishes resources (prompt templates, LLM endpoints) for the
    runners, reads back spans (through its adapter) and improves the resources. The trainer wires in the store,
    adapter, LLM proxy and initial resources before calling :meth:`run`. ``run`` may be a coroutine or a plain method.
    """

    _llm_proxy_ref: Optional[weakref.ReferenceType[Any]] = None
    _adapter_ref: Optional[weakref.ReferenceType[Any]] = None
    _store: Optional[LightningStore] = None
    _initial_resources: Optional[NamedResources] = None

    def is_async(self) -> bool:
        """Whether :meth:`run` is a coroutine function."""
        return inspect.iscoroutinefunction(self.run)

    @property
    def reports_progress(self) -> bool:
        """Whether the algorithm shows its own progress on the console; :meth:`Trainer.fit` then adds no
        per-rollout lines of its own."""
        return False

    def _run_as_follower(self) -> bool:
        """On a follower rank of a data-parallel run (``torchrun`` rank > 0), take part in the leader's updates until
        its run ends and return True; :meth:`Trainer.fit` then starts nothing else in this process. False (the
        default, and on rank 0): this process runs the algorithm itself."""
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Same as :meth:`run`."""
        return self.run(*args, **kwargs)

    def _run_with_datasets(self, train_dataset: Optional[Dataset[Any]], val_dataset: Optional[Dataset[Any]]) -> Any:
        """Call :meth:`run` with the datasets its signature accepts (by name, or through ``**kwargs``).

        Raises:
            TypeError: A dataset is given but ``run`` has no parameter to receive it.
        """
        parameters = inspect.signature(self.run).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            accepted: Collection[str] = _DATASET_PARAMETERS
        else:
            accepted = {p.name for p in parameters}
        kwargs = dataset_arguments(f"{type(self).__name__}.run()", accepted, train_dataset, val_dataset)
        if self.is_async():
            return self._run_async_as_current(kwargs)
        token = _running_algorithm.set(self)
        try:
            return self.run(**kwargs)
        finally:
            _running_algorithm.reset(token)

    async def _run_async_as_current(self, kwargs: Dict[str, Any]) -> Any:
        token = _running_algorithm.set(self)
        try:
            return await self.run(**kwargs)
        finally:
            _running_algorithm.reset(token)

    def run(self, train_dataset: Optional[Dataset[Any]] = None, val_dataset: Optional[Dataset[Any]] = None) -> Any:
        """Train on ``train_dataset``, validating on ``val_dataset``.

        Args:
            train_dataset: Task inputs used for training.
            val_dataset: Task inputs used for validation.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement run().")

    def get_client(self) -> Any:
        """Deprecated (v0.1 server client); algorithms talk to the store instead."""
        raise NotImplementedError("get_client() is no longer supported; use get_store().")

    # -- weakly held collaborators -------------------------------------------------------------------------------

    def set_llm_proxy(self, llm_proxy: Optional[LLMProxy]) -> None:
        """Remember the LLM proxy serving the trained model (weakly referenced); None clears it."""
        self._llm_proxy_ref = weakref.ref(llm_proxy) if llm_proxy is not None else None

    def get_llm_proxy(self) -> Optional[LLMProxy]:
        """The LLM proxy, or None when none was set.

        Raises:
            ValueError: If the proxy has been garbage-collected.
        """
        if self._llm_proxy_ref is None:
            return None
        return deref(self._llm_proxy_ref, "LLM proxy", "algorithm")

    def set_adapter(self, adapter: TraceAdapter[Any]) -> None:
        """Remember the adapter turning spans into training data (weakly referenced)."""
        self._adapter_ref = weakref.ref(adapter)

    def get_adapter(self) -> TraceAdapter[Any]:
        """The adapter.

        Raises:
            ValueError: If no adapter was set or it has been garbage-collected.
        """
        return deref(self._adapter_ref, "Adapter", "algorithm")

    # -- strongly held state -------------------------------------------------------------------------------------

    def set_store(self, store: LightningStore) -> None:
        """Set the store this algorithm works against."""
        self._store = store

    def get_store(self) -> LightningStore:
        """The store.

        Raises:
            ValueError: If no store was set.
        """
        if self._store is None:
            raise ValueError("Store has not been set for this algorithm.")
        return self._store

    def set_initial_resources(self, resources: NamedResources) -> None:
        """Set the resources the first rollouts use."""
        self._initial_resources = resources

    def get_initial_resources(self) -> Optional[NamedResources]:
        """The initial resources, or None."""
        return self._initial_resources
