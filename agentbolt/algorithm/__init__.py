"""Algorithms: the training side that enqueues rollouts, publishes resources and learns from spans.

``VERL`` is a factory function that imports its implementation (and its heavy dependencies) only when called.
``APO`` (and the other prompt optimizers, ``ParetoAPO`` and ``FewShotAPO``), ``GRPO`` and ``SFT`` are the classes
themselves, imported on first access (importing them loads no torch, no openai and no poml until used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import Algorithm
from .decorator import algo
from .fast import Baseline, FastAlgorithm

if TYPE_CHECKING:
    from .apo import APO, FewShotAPO, ParetoAPO
    from .grpo import GRPO
    from .sft import SFT

__all__ = ["Algorithm", "algo", "FastAlgorithm", "Baseline", "APO", "VERL", "GRPO", "ParetoAPO", "FewShotAPO", "SFT"]

# Classes loaded on first access: name -> module.
_LAZY_CLASSES = {
    "APO": "agentbolt.algorithm.apo",
    "ParetoAPO": "agentbolt.algorithm.apo",
    "FewShotAPO": "agentbolt.algorithm.apo",
    "GRPO": "agentbolt.algorithm.grpo",
    "SFT": "agentbolt.algorithm.sft",
}


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


def VERL(*args: Any, **kwargs: Any) -> Any:
    """The VERL reinforcement-learning bridge (:class:`agentbolt.algorithm.verl.VERL`), imported on first use."""
    return _instantiate("agentbolt.algorithm.verl", "VERL", args, kwargs)


def __getattr__(name: str) -> Any:
    module = _LAZY_CLASSES.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
