"""Storage primitives the store lifecycle is written against, and their in-memory implementation."""

from .base import *  # noqa: F403
from .base import __all__ as _base_all
from .memory import *  # noqa: F403
from .memory import __all__ as _memory_all

__all__ = [*_base_all, *_memory_all]
