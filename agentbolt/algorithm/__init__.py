"""Algorithms: the training side that enqueues rollouts, publishes resources and learns from spans.

``APO``, ``VERL`` and ``GRPO`` are factory functions that import their implementation (and its heavy dependencies)
only when called.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Algorithm
from .decorator import algo
from .fast import Baseline, FastAlgorithm

__all__ = ["Algorithm", "algo", "FastAlgorithm", "Baseline", "APO", "VERL", "GRPO"]


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


def GRPO(*args: Any, **kwargs: Any) -> Any:
    """GRPO on CPU or GPU with torch (:class:`agentbolt.algorithm.grpo.GRPO`), imported on first use."""
    return _instantiate("agentbolt.algorithm.grpo", "GRPO", args, kwargs)
