"""Algorithms by name, for configuration files (``agentbolt train CONFIG.yaml``).

Each name maps to a constructor taking keyword arguments (the algorithm's options). Constructors are written as
``"module:attribute"`` strings and imported only when that algorithm is built, so listing the names loads nothing
heavy. Another algorithm plugs in with one call (or one line in :data:`ALGORITHMS`)::

    from agentbolt.algorithm.registry import register_algorithm

    register_algorithm("my-algo", "my_package.algo:MyAlgorithm")  # or the class / a factory itself
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

__all__ = [
    "ALGORITHMS",
    "UnknownAlgorithmError",
    "algorithm_names",
    "build_algorithm",
    "check_algorithm_name",
    "register_algorithm",
]

AlgorithmFactory = Union[str, Callable[..., Any]]

ALGORITHMS: Dict[str, AlgorithmFactory] = {
    "grpo": "agentbolt.algorithm.grpo:GRPO",
    "sft": "agentbolt.algorithm.sft:SFT",
}
"""Algorithm names and their constructors (``"module:attribute"`` or a callable)."""


class UnknownAlgorithmError(ValueError):
    """No algorithm is registered under the requested name."""


def register_algorithm(name: str, factory: AlgorithmFactory, *, replace: bool = False) -> None:
    """Register ``factory`` (a ``"module:attribute"`` string or a callable taking keyword options) as ``name``.

    Raises:
        ValueError: ``name`` is empty or already registered (and ``replace`` is False), or ``factory`` is neither a
            ``"module:attribute"`` string nor callable.
    """
    if not name or not isinstance(name, str):
        raise ValueError("an algorithm name must be a non-empty string")
    if isinstance(factory, str):
        if factory.count(":") != 1 or not all(factory.split(":")):
            raise ValueError(f"an algorithm constructor string must be 'module:attribute', got {factory!r}")
    elif not callable(factory):
        raise ValueError(f"an algorithm constructor must be callable or 'module:attribute', got {factory!r}")
    if name in ALGORITHMS and not replace:
        raise ValueError(f"an algorithm named {name!r} is already registered")
    ALGORITHMS[name] = factory


def algorithm_names() -> List[str]:
    """The registered names, sorted."""
    return sorted(ALGORITHMS)


def check_algorithm_name(name: str) -> None:
    """Refuse a name no algorithm is registered under (nothing is imported).

    Raises:
        UnknownAlgorithmError: No such name; the message lists the registered ones.
    """
    if name not in ALGORITHMS:
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; registered: {', '.join(algorithm_names())}")


def _constructor(name: str) -> Callable[..., Any]:
    check_algorithm_name(name)
    factory = ALGORITHMS[name]
    if callable(factory):
        return factory
    module_name, attribute = factory.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("agentbolt"):
            raise ImportError(f"algorithm {name!r} ({factory}) is not part of this agentbolt installation") from exc
        raise
    return getattr(module, attribute)  # type: ignore[no-any-return]


def build_algorithm(name: str, options: Optional[Mapping[str, Any]] = None) -> Any:
    """Construct the algorithm registered as ``name`` with ``options`` as keyword arguments.

    Raises:
        UnknownAlgorithmError: No such name.
        ImportError: The algorithm's module or one of its dependencies is not installed.
        pydantic.ValidationError, TypeError, ValueError: The options are invalid (the algorithm's own error).
    """
    return _constructor(name)(**dict(options or {}))
