"""Agents: the :class:`LitAgent` interface and decorators that turn functions into agents."""

from .decorator import llm_rollout, prompt_rollout, rollout
from .litagent import LitAgent

__all__ = ["LitAgent", "llm_rollout", "prompt_rollout", "rollout"]
