"""The Trainer and component-building helpers."""

from .init_utils import build_component
from .trainer import Trainer

__all__ = ["Trainer", "build_component"]
