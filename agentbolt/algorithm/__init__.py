"""Algorithms: the training side that enqueues rollouts, publishes resources and learns from spans.

``APO`` and ``VERL`` are factory functions that import their implementation (and its heavy dependencies) only when
called. ``GRPO`` and ``SFT`` are the classes themselves, imported on first access (importing them loads no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import Algorithm
from .decorator import algo
from .fast import Baseline, FastAlgorithm

if TYPE_CHECKING:
    from .grpo import GRPO
    from .sft import SFT

__all__ = ["Algorithm", "algo", "FastAlgorithm", "Baseline", "APO", "VERL", "GRPO", "SFT"]


def _instantiate(module_name: str, class_name: str, args: Any, kwargs: Any) -> Any:
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("agentbolt"):
            raise ImportError(
                f"{class_name} is not available: the module {module_name} is not part of this agentbolt installation."
            ) from exc
        raise  # the implementation exists but one of its dependencies is missing: keep that message
    return cls(*args, **kwargs)


def APO(*args: Any, **kwargs: Any) -> Any:
    """Automatic prompt optimization (:class:`agentbolt.algorithm.apo.APO`), imported on first use."""
    return _instantiate("agentbolt.algorithm.apo", "APO", args, kwargs)


def VERL(*args: Any, **kwargs: Any) -> Any:
    """The VERL reinforcement-learning bridge (:class:`agentbolt.algorithm.verl.VERL`), imported on first use."""
    return _instantiate("agentbolt.algorithm.verl", "VERL", args, kwargs)


def __getattr__(name: str) -> Any:
    if name == "GRPO":
        from .grpo import GRPO

        return GRPO
    if name == "SFT":
        from .sft import SFT

        return SFT
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
