"""GRPO: group-relative policy optimisation of the LLM calls captured in rollouts.

``GRPO`` and the torch trainer are imported on first access, so importing this package does not pull torch.
"""

from __future__ import annotations

from typing import Any

from agentbolt.algorithm.grpo.config import GRPOConfig

__all__ = ["GRPO", "GRPOConfig", "PolicyTrainer"]


def __getattr__(name: str) -> Any:
    if name in ("GRPO", "PolicyTrainer"):
        # Before torch loads: idle OpenMP threads must sleep, since engine, trainer and runners share the CPUs.
        from agentbolt.serving.transformers_engine import configure_openmp

        configure_openmp()
    if name == "GRPO":
        from agentbolt.algorithm.grpo.algorithm import GRPO

        return GRPO
    if name == "PolicyTrainer":
        from agentbolt.algorithm.grpo.trainer import PolicyTrainer

        return PolicyTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
