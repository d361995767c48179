"""Training metrics kept by the store: one record per training step of a run, read back by the dashboard."""

from __future__ import annotations

import math
from typing import Dict, Optional

from pydantic import BaseModel, Field, field_validator
from typing_extensions import Annotated

__all__ = ["MetricsRecord"]


class MetricsRecord(BaseModel):
    """The metrics of one step of one training run (loss, reward, KL, validation accuracy...).

    A run writes one record per step; writing a record for a ``(run_id, step)`` already stored replaces it (a resumed
    run logs its steps again).

    ``time`` and the values are numbers (integers or floats, read as floats), never converted from anything else: a
    string such as ``"1.5"`` or a boolean is refused, whether a record is built, posted or read back. Values that are
    not finite numbers are stored as ``None``.

    Attributes:
        run_id: Name of the training run (for example ``grpo-20260101-120000``).
        step: Training step (0 for a validation before training; at most 2^53, exact in every JSON reader).
        time: When the step ended (seconds since the epoch; a finite number).
        values: Metric name -> value (a number, or None), e.g. ``{"train/reward_mean": 0.4, "val/accuracy": 0.5}``.
    """

    run_id: str = Field(min_length=1, max_length=200)
    step: int = Field(ge=0, le=2**53)
    time: float = Field(strict=True, allow_inf_nan=False)
    values: Dict[str, Optional[Annotated[float, Field(strict=True)]]] = Field(default_factory=dict)

    @field_validator("values")
    @classmethod
    def _finite_or_none(cls, values: Dict[str, Optional[float]]) -> Dict[str, Optional[float]]:
        return {name: (value if value is not None and math.isfinite(value) else None) for name, value in values.items()}
