"""VERL reinforcement learning in agent mode (needs the ``verl`` extra): :class:`VERL`."""

from .interface import VERL

__all__ = ["VERL"]
