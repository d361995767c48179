"""The VERL configuration of agent mode: ``config.yaml`` composed with Hydra, then the user's overrides."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from agentbolt.adapter.agent_match import compile_agent_match
from agentbolt.utils.checks import check_bool, check_count, check_finite, check_port
from agentbolt.utils.imports import import_extra
from agentbolt.verl import require_verl

__all__ = ["check_agentbolt_settings", "compose_config"]

_LEVELS = ("transition", "trajectory")
_SETTINGS = (
    "port",
    "gateway_host",
    "rollout_timeout",
    "reward_fillna_value",
    "agent_match",
    "instrument_vllm",
    "store",
    "trace_aggregator",
)
_AGGREGATOR_SETTINGS = (
    "level",
    "trajectory_max_prompt_length",
    "trajectory_max_response_length",
    "debug",
    "mismatch_log_dir",
)


def _check_keys(section: Any, name: str, known: Sequence[str]) -> None:
    if not isinstance(section, Mapping):
        raise TypeError(f"{name} must be a mapping, got {type(section).__name__} {section!r}")
    unknown = sorted(str(key) for key in section if key not in known)
    if unknown:
        raise ValueError(
            f"unknown key {', '.join(f'{name}.{key}' for key in unknown)}; {name} takes {', '.join(known)}"
        )


def _check_text(value: Any, name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string{' or null' if optional else ''}, got {value!r}")


def check_agentbolt_settings(settings: Any) -> None:
    """Check the ``agentbolt`` section of the configuration (a plain mapping): known keys, types and ranges.

    Raises:
        TypeError: The section or a value has the wrong type; the message names the key (``agentbolt.port``).
        ValueError: An unknown key, or a value out of range (a port above 65535, a non-positive timeout, a level
            other than ``transition`` / ``trajectory``, a regex that does not compile, a store that is not a URL).
    """
    if not isinstance(settings, Mapping):
        raise TypeError(f"the agentbolt section must be a mapping, got {type(settings).__name__}")
    _check_keys(settings, "agentbolt", _SETTINGS)
    if "port" in settings:
        check_port(settings["port"], "agentbolt.port")
    if "gateway_host" in settings:
        _check_text(settings["gateway_host"], "agentbolt.gateway_host")
    timeout = check_finite(settings.get("rollout_timeout", 1), "agentbolt.rollout_timeout")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"agentbolt.rollout_timeout must be positive, got {timeout!r}")
    if "reward_fillna_value" in settings:
        check_finite(settings["reward_fillna_value"], "agentbolt.reward_fillna_value")
    pattern = settings.get("agent_match")
    if pattern is not None:
        _check_text(pattern, "agentbolt.agent_match", optional=True)
        compile_agent_match(pattern, "agentbolt.agent_match")
    if "instrument_vllm" in settings:
        check_bool(settings["instrument_vllm"], "agentbolt.instrument_vllm")
    store = settings.get("store")
    if store is not None and not (isinstance(store, str) and re.match(r"https?://[^/\s]", store)):
        raise ValueError(f"agentbolt.store must be an http:// or https:// URL (or null), got {store!r}")
    aggregator = settings.get("trace_aggregator", {})
    _check_keys(aggregator, "agentbolt.trace_aggregator", _AGGREGATOR_SETTINGS)
    level = aggregator.get("level", _LEVELS[0])
    if level not in _LEVELS:
        raise ValueError(f"agentbolt.trace_aggregator.level must be one of {_LEVELS}, got {level!r}")
    for length in ("trajectory_max_prompt_length", "trajectory_max_response_length"):
        if length in aggregator:
            check_count(aggregator[length], f"agentbolt.trace_aggregator.{length}")
    if "debug" in aggregator:
        check_bool(aggregator["debug"], "agentbolt.trace_aggregator.debug")
    if "mismatch_log_dir" in aggregator:
        _check_text(aggregator["mismatch_log_dir"], "agentbolt.trace_aggregator.mismatch_log_dir")


def compose_config(overrides: Optional[Mapping[str, Any]] = None, cli_overrides: Sequence[str] = ()) -> Any:
    """VERL's PPO configuration with agentbolt's ``config.yaml``, then ``cli_overrides``, then ``overrides``.

    Args:
        overrides: A nested dict merged over the configuration (new keys allowed). An ``agentlightning`` section
            (the reference's name) is merged into ``agentbolt``.
        cli_overrides: Hydra command-line overrides (``data.train_batch_size=32``).

    Returns:
        An ``omegaconf.DictConfig`` (struct mode off).

    Raises:
        ImportError: The ``verl`` extra is not installed.
        TypeError: ``overrides`` is not a mapping, or an ``agentbolt`` setting has the wrong type.
        ValueError: The rollout engine is not vLLM, or an ``agentbolt`` setting is unknown or out of range (see
            :func:`check_agentbolt_settings`).
    """
    require_verl("The VERL configuration")
    import_extra("hydra", feature="The VERL configuration", extra="verl", package="hydra-core")
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"the VERL config must be a dict, got {type(overrides).__name__}")
    values = dict(overrides or {})
    alias = values.pop("agentlightning", None)
    if alias is not None:
        values["agentbolt"] = OmegaConf.to_container(OmegaConf.merge(alias, values.get("agentbolt") or {}))
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module(config_module="agentbolt.verl", version_base=None):
        config = compose(config_name="config", overrides=list(cli_overrides))
    OmegaConf.set_struct(config, False)
    config = OmegaConf.merge(config, OmegaConf.create(values))
    OmegaConf.set_struct(config, False)
    engine = config.actor_rollout_ref.rollout.name
    if engine != "vllm":
        raise ValueError(
            f"actor_rollout_ref.rollout.name must be 'vllm' in agent mode (agents call vLLM's OpenAI server, which "
            f"returns token ids), got {engine!r}"
        )
    check_agentbolt_settings(OmegaConf.to_container(config.agentbolt, resolve=True))
    return config
