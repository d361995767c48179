"""Runners execute rollouts from the store with an agent."""

from .agent import LitAgentRunner
from .base import Runner
from .legacy import LegacyAgentRunner

__all__ = ["Runner", "LegacyAgentRunner", "LitAgentRunner"]
