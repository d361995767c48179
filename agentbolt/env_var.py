"""Environment variables understood by agentbolt and helpers to read them."""

from __future__ import annotations

import os
from enum import Enum
from typing import AbstractSet, Callable, Optional, TypeVar

__all__ = ["LightningEnvVar", "resolve_bool_env_var", "resolve_int_env_var", "resolve_str_env_var"]

API_KEY_ENV_VAR = "AGENTBOLT_API_KEY"
"""Bearer token protecting a store server; read by the server, its clients and the store's OTLP exporter."""

STORE_SERVER_ID_ENV_VAR = "AGENTBOLT_STORE_SERVER_ID"
"""The identity of a run's store server when the algorithm and the runners are started separately
(``AGL_CURRENT_ROLE``): the algorithm's store server reports it, and runners given it work only for that server."""

METRICS_ENV_VAR = "AGENTBOLT_METRICS"
"""Metrics backends (``prometheus``, ``console``, comma-separated) that the gateway, runners and trainers record to
when they are given no tracker (see ``docs/metrics.md``)."""

T = TypeVar("T")

_TRUTHY = {"1", "true", "yes", "on"}
_FALSY = {"0", "false", "no", "off"}


class LightningEnvVar(Enum):
    """Names of the environment variables that configure execution strategies and emitters."""

    AGL_EMITTER_DEBUG = "AGL_EMITTER_DEBUG"
    AGL_MANAGED_STORE = "AGL_MANAGED_STORE"
    AGL_CURRENT_ROLE = "AGL_CURRENT_ROLE"
    AGL_SERVER_HOST = "AGL_SERVER_HOST"
    AGL_SERVER_PORT = "AGL_SERVER_PORT"


def _name(env_var: LightningEnvVar | str) -> str:
    return env_var.value if isinstance(env_var, LightningEnvVar) else env_var


def parse_bool_word(value: str, true_words: AbstractSet[str], false_words: AbstractSet[str]) -> Optional[bool]:
    """``True``/``False`` for a word of ``true_words``/``false_words`` (after stripping, any case), else ``None``."""
    word = value.strip().lower()
    if word in true_words:
        return True
    if word in false_words:
        return False
    return None


def _resolve(
    env_var: LightningEnvVar | str, override: Optional[T], fallback: Optional[T], parse: Callable[[str], T]
) -> Optional[T]:
    """``override`` if given, else the variable's value read by ``parse``, else ``fallback``."""
    if override is not None:
        return override
    raw = os.environ.get(_name(env_var))
    return fallback if raw is None else parse(raw)


def setting_source(env_var: LightningEnvVar | str, override: object, argument: str) -> str:
    """The name an error about a setting should give: the variable's when its value came from the variable (no
    ``override`` given and the variable set), else ``argument`` (the constructor argument's name)."""
    if override is None and _name(env_var) in os.environ:
        return _name(env_var)
    return argument


def resolve_bool_env_var(
    env_var: LightningEnvVar | str, override: Optional[bool] = None, fallback: Optional[bool] = None
) -> Optional[bool]:
    """``override`` if given, else the variable parsed as a boolean, else ``fallback``."""

    def parse(raw: str) -> bool:
        value = parse_bool_word(raw, _TRUTHY, _FALSY)
        if value is None:
            raise ValueError(f"{_name(env_var)} must be a boolean (one of {sorted(_TRUTHY | _FALSY)}), got {raw!r}")
        return value

    return _resolve(env_var, override, fallback, parse)


def resolve_int_env_var(
    env_var: LightningEnvVar | str, override: Optional[int] = None, fallback: Optional[int] = None
) -> Optional[int]:
    """``override`` if given, else the variable parsed as an integer, else ``fallback``."""

    def parse(raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{_name(env_var)} must be an integer") from None

    return _resolve(env_var, override, fallback, parse)


def resolve_str_env_var(
    env_var: LightningEnvVar | str, override: Optional[str] = None, fallback: Optional[str] = None
) -> Optional[str]:
    """``override`` if given, else the variable's raw value, else ``fallback``."""
    return _resolve(env_var, override, fallback, str)
