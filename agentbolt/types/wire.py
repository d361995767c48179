"""The base of the models agentbolt writes as JSON: into the store's files and tables, and over HTTP."""

from __future__ import annotations

import math
from typing import Dict

from pydantic import BaseModel, ConfigDict

__all__ = ["INF_NAN_MODE", "NON_FINITE_FLOATS", "WIRE_CONFIG", "WireModel"]

INF_NAN_MODE = "strings"
"""How non-finite floats are written as JSON: ``pydantic_core.to_json(..., inf_nan_mode=INF_NAN_MODE)`` writes plain
values (dicts, lists) as :class:`WireModel` writes models."""

NON_FINITE_FLOATS: Dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""The strings :class:`WireModel` writes for non-finite floats, and the float each stands for."""

WIRE_CONFIG = ConfigDict(ser_json_inf_nan=INF_NAN_MODE)
"""Model configuration writing non-finite floats as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``."""


class WireModel(BaseModel):
    """A pydantic model whose JSON keeps non-finite floats.

    JSON has no NaN or infinity, and pydantic writes them as ``null`` by default: the value is lost and, in span
    attributes (where ``null`` is not allowed), the stored span could no longer be read. These models write them as
    the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, as the JSON forms of protobuf and OTLP do: a float field
    reads them back as the same float, and a free-form value (a task input, metadata, a span attribute) keeps the
    string. A JSON string never holds a float, so a store that keeps items in memory returns the float itself.
    """

    model_config = WIRE_CONFIG
