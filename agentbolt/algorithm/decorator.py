"""Turn a plain function into an :class:`~agentbolt.algorithm.Algorithm`."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Generic, Optional, TypeVar

from agentbolt.types import Dataset

from .base import Algorithm, dataset_arguments

__all__ = ["FunctionalAlgorithm", "algo"]

AF = TypeVar("AF", bound=Callable[..., Any])

_INJECTABLE = ("store", "adapter", "llm_proxy", "initial_resources")


class FunctionalAlgorithm(Algorithm, Generic[AF]):
    """An algorithm backed by a function (sync or async).

    The function declares what it needs by parameter name: ``store``, ``adapter``, ``llm_proxy``,
    ``initial_resources``, ``train_dataset`` and ``val_dataset``; only declared ones are passed.

    Args:
        algorithm_func: The function.
    """

    def __init__(self, algorithm_func: AF) -> None:
        self._algorithm_func = algorithm_func
        self._parameters = set(inspect.signature(algorithm_func).parameters)
        functools.update_wrapper(self, algorithm_func)  # type: ignore[arg-type]

    def is_async(self) -> bool:
        """Whether the wrapped function is a coroutine function."""
        return inspect.iscoroutinefunction(self._algorithm_func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly."""
        return self._algorithm_func(*args, **kwargs)

    def run(self, train_dataset: Optional[Dataset[Any]] = None, val_dataset: Optional[Dataset[Any]] = None) -> Any:
        """Call the function with the collaborators and datasets it declares.

        Returns:
            The awaitable for an async function (await it), else None.

        Raises:
            TypeError: If a dataset is given but the function has no parameter for it.
        """
        getters: Dict[str, Callable[[], Any]] = {
            "store": self.get_store,
            "adapter": self.get_adapter,
            "llm_proxy": self.get_llm_proxy,
            "initial_resources": self.get_initial_resources,
        }
        kwargs: Dict[str, Any] = {name: getters[name]() for name in _INJECTABLE if name in self._parameters}
        owner = getattr(self._algorithm_func, "__name__", None) or repr(self._algorithm_func)
        kwargs.update(dataset_arguments(owner, self._parameters, train_dataset, val_dataset))
        result = self._algorithm_func(**kwargs)
        return result if self.is_async() else None


def algo(func: AF) -> FunctionalAlgorithm[AF]:
    """Decorator making an algorithm from a function; see :class:`FunctionalAlgorithm`.

    Args:
        func: The algorithm function, sync or async.

    Returns:
        The algorithm.
    """
    return FunctionalAlgorithm(func)
