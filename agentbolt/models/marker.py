"""The marker file of a model directory that agentbolt wrote (a converted registry model, a tiny test model).

The marker is written last, so its presence means the directory is complete. This module imports nothing of
agentbolt's: the registry, the converter and the tiny-model builder all use it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

__all__ = ["MARKER_FILE", "is_complete", "write_marker"]

MARKER_FILE = "agentbolt_model.json"
_FORMAT = 1


def write_marker(directory: Path, fields: Mapping[str, Any]) -> None:
    """Write the marker into ``directory`` (call it after every other file): ``{"format": 1, **fields}``."""
    (directory / MARKER_FILE).write_text(json.dumps({"format": _FORMAT, **fields}, indent=2))


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` holds a model agentbolt finished writing (marker and ``config.json`` present)."""
    return (directory / MARKER_FILE).is_file() and (directory / "config.json").is_file()
