"""Typed data model shared by every agentbolt component."""

from .core import *  # noqa: F403
from .core import __all__ as _core_all
from .metrics import *  # noqa: F403
from .metrics import __all__ as _metrics_all
from .resources import *  # noqa: F403
from .resources import __all__ as _resources_all
from .tracer import *  # noqa: F403
from .tracer import __all__ as _tracer_all

__all__ = [*_core_all, *_metrics_all, *_resources_all, *_tracer_all]
