"""docs/grpo.md lists every option of ``GRPOConfig``, with the default the config has."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from agentbolt.algorithm.grpo.config import GRPOConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "grpo.md"


def _rows() -> List[Tuple[List[str], str]]:
    """``(option names, default cell)`` of each row of the options table."""
    table = DOC.read_text(encoding="utf-8").split("## Options (`GRPOConfig`)")[1].split("\n## ")[0]
    rows = []
    for line in table.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows.append((re.findall(r"`([a-z_0-9]+)`", cells[0]), cells[1]))
    return rows


def _literal(text: str) -> Any:
    """A default written as a number, ``true``/``false``/``none`` or a quoted name; ``...`` when it is prose."""
    words = {"true": True, "false": False, "none": None, "None": None}
    if text in words:
        return words[text]
    if re.fullmatch(r'`"[a-z_-]+"`', text):
        return text.strip('`"')
    try:
        return float(text)
    except ValueError:
        return ...


def _documented_defaults() -> Dict[str, Any]:
    defaults: Dict[str, Any] = {}
    for names, cell in _rows():
        values = [_literal(part.strip()) for part in cell.split(", ")]
        if len(values) == len(names):
            defaults.update({name: value for name, value in zip(names, values, strict=True) if value is not ...})
    return defaults


def test_every_option_is_documented_and_every_documented_option_exists() -> None:
    documented = {name for names, _ in _rows() for name in names}
    assert documented - set(GRPOConfig.model_fields) == set()
    assert set(GRPOConfig.model_fields) - documented == set()


@pytest.mark.parametrize(("name", "default"), sorted(_documented_defaults().items()))
def test_a_documented_default_is_the_configs(name: str, default: Any) -> None:
    assert getattr(GRPOConfig(), name) == default
