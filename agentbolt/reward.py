"""Deprecated location of the reward helpers: import them from :mod:`agentbolt.emitter` instead.

Importing this module makes Python bind ``agentbolt.reward`` to it, in place of the ``reward`` decorator the package
exports under that name; the module is therefore callable and forwards calls to that decorator, so ``agl.reward``
keeps working after ``import agentbolt.reward``.
"""

import sys
import types
import warnings
from typing import Any

from agentbolt.emitter.reward import *  # noqa: F403
from agentbolt.emitter.reward import __all__ as _reward_all

warnings.warn(
    "agentbolt.reward is deprecated; import the reward helpers from agentbolt.emitter instead.",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = list(_reward_all)


class _CallableRewardModule(types.ModuleType):
    """This module, callable as :func:`agentbolt.emitter.reward.reward`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return reward(*args, **kwargs)  # noqa: F405


sys.modules[__name__].__class__ = _CallableRewardModule
