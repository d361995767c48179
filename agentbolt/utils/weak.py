"""Weak back-references between components (agent -> trainer/runner, algorithm -> trainer/adapter/proxy)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Optional, TypeVar

if TYPE_CHECKING:
    from agentbolt.trainer import Trainer

__all__ = ["deref", "TrainerReference"]

T = TypeVar("T")


def deref(ref: Optional[weakref.ReferenceType[T]], label: str, owner: str) -> T:
    """The object behind ``ref``.

    Raises:
        ValueError: ``"<label> has not been set for this <owner>."`` when ``ref`` is None, or a message saying the
            object was garbage-collected.
    """
    if ref is None:
        raise ValueError(f"{label} has not been set for this {owner}.")
    obj = ref()
    if obj is None:
        noun = label.split()[-1].lower()
        raise ValueError(f"{label} reference is no longer valid (the {noun} was garbage-collected).")
    return obj


class TrainerReference:
    """``set_trainer`` / ``get_trainer`` of the components a trainer drives (agents, algorithms): a weak reference."""

    _trainer_ref: Optional[weakref.ReferenceType[Trainer]] = None

    def set_trainer(self, trainer: Trainer) -> None:
        """Remember the trainer driving this component (weakly referenced)."""
        self._trainer_ref = weakref.ref(trainer)

    def get_trainer(self) -> Trainer:
        """The trainer driving this component.

        Raises:
            ValueError: If no trainer was set or it has been garbage-collected.
        """
        return deref(self._trainer_ref, "Trainer", "agent")
