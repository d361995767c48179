"""Dataclasses of integer counters: what a data step saw, kept and skipped, summed over steps and reported."""

from __future__ import annotations

from typing import Dict

__all__ = ["Counters"]


class Counters:
    """A dataclass of integer counters that add up and turn into a flat metrics record."""

    def add(self, other: Counters) -> None:
        """Accumulate another counter set of the same kind into this one."""
        for name in self.__dataclass_fields__:  # type: ignore[attr-defined]
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_metrics(self, prefix: str) -> Dict[str, float]:
        """The counters as ``{prefix + name: value}``."""
        return {prefix + name: float(getattr(self, name)) for name in self.__dataclass_fields__}  # type: ignore[attr-defined]
