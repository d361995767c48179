"""The example's options, read from ``config.yaml`` (the one place they are written), and ``KEY=VALUE`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

import yaml  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from agentbolt.cli.train import RunnerConfig

__all__ = ["CONFIG_FILE", "check_options", "load_options", "parse_options", "run_options"]

CONFIG_FILE = Path(__file__).resolve().parent / "config.yaml"
"""The example's configuration, also run by ``agentbolt train examples/sft/config.yaml``."""

_PATH_OPTIONS = ("checkpoint_dir", "log_dir", "adapter_dir")


def load_options(path: Path = CONFIG_FILE) -> Tuple[Dict[str, Any], RunnerConfig]:
    """The SFT options of a run config file (paths made absolute) and its ``trainer`` section (runners, polling).

    Raises:
        ValueError: The file is not a valid run config.
    """
    from agentbolt.cli.errors import CliError
    from agentbolt.cli.train import load_run_config

    try:
        config = load_run_config(path)
    except CliError as exc:
        raise ValueError(str(exc)) from None
    options = dict(config.options)
    for key in _PATH_OPTIONS:
        if isinstance(options.get(key), str):
            options[key] = str((path.resolve().parent / options[key]).resolve())
    return options, config.trainer


def parse_options(pairs: Sequence[str]) -> Dict[str, Any]:
    """``["max_steps=2", "model=/m"]`` -> ``{"max_steps": 2, "model": "/m"}`` (values read as YAML).

    Raises:
        ValueError: A pair without ``=``.
    """
    options: Dict[str, Any] = {}
    bad: List[str] = [pair for pair in pairs if "=" not in pair]
    if bad:
        raise ValueError(f"options must be KEY=VALUE, got {bad[0]!r}")
    for pair in pairs:
        key, _, value = pair.partition("=")
        options[key.strip()] = yaml.safe_load(value)
    return options


def check_options(options: Dict[str, Any]) -> None:
    """Return when ``options`` are valid :class:`agentbolt.algorithm.sft.SFTConfig` fields (checked before any model
    loads).

    Raises:
        ValueError: One line naming the first option refused and why (an unknown key, a value out of range).
    """
    from pydantic import ValidationError

    from agentbolt.algorithm.sft.config import SFTConfig

    try:
        SFTConfig(**options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "options"
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "not an option of SFT"
        raise ValueError(f"option {where}: {message}, got {first.get('input')!r}") from None


def run_options(path: Path, overrides: Sequence[str]) -> Tuple[Dict[str, Any], RunnerConfig]:
    """The checked SFT options of the config file ``path`` with the ``KEY=VALUE`` ``overrides``, and its ``trainer``
    section (:func:`load_options`, :func:`parse_options`, :func:`check_options`).

    Raises:
        ValueError: The file, an override or an option is refused (one line naming it).
    """
    options, trainer = load_options(path)
    options.update(parse_options(overrides))
    check_options(options)
    return options, trainer
