"""Deprecated location of the reward helpers: import them from :mod:`agentbolt.emitter` instead."""

import warnings

from agentbolt.emitter.reward import *  # noqa: F403
from agentbolt.emitter.reward import __all__ as _reward_all

warnings.warn(
    "agentbolt.reward is deprecated; import the reward helpers from agentbolt.emitter instead.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = list(_reward_all)
