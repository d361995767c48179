"""The VERL configuration of agent mode: ``config.yaml`` composed with Hydra, then the user's overrides."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["compose_config"]

_LEVELS = ("transition", "trajectory")


def compose_config(overrides: Optional[Mapping[str, Any]] = None, cli_overrides: Sequence[str] = ()) -> Any:
    """VERL's PPO configuration with agentbolt's ``config.yaml``, then ``cli_overrides``, then ``overrides``.

    Args:
        overrides: A nested dict merged over the configuration (new keys allowed). An ``agentlightning`` section
            (the reference's name) is merged into ``agentbolt``.
        cli_overrides: Hydra command-line overrides (``data.train_batch_size=32``).

    Returns:
        An ``omegaconf.DictConfig`` (struct mode off).

    Raises:
        TypeError: ``overrides`` is not a mapping.
        ValueError: The rollout engine is not vLLM, or an unknown trace aggregation level.
    """
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
    level = config.agentbolt.trace_aggregator.level
    if level not in _LEVELS:
        raise ValueError(f"agentbolt.trace_aggregator.level must be one of {_LEVELS}, got {level!r}")
    return config
