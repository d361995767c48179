"""Emit rewards, messages, objects, exceptions, annotations and operations into the current trace."""

from .annotation import *  # noqa: F403
from .annotation import __all__ as _annotation_all
from .exception import *  # noqa: F403
from .exception import __all__ as _exception_all
from .message import *  # noqa: F403
from .message import __all__ as _message_all
from .object import *  # noqa: F403
from .object import __all__ as _object_all
from .reward import *  # noqa: F403
from .reward import __all__ as _reward_all

__all__ = [*_annotation_all, *_exception_all, *_message_all, *_object_all, *_reward_all]
