"""Rewards: emit them as annotation spans and find them again in a trace."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import numbers
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar, Union

from agentbolt.emitter.annotation import emit_annotation
from agentbolt.semconv import LightningSpanAttributes
from agentbolt.types.tracer import SpanCoreFields, SpanLike
from agentbolt.utils.reward_spans import find_final_reward, get_reward_value, get_rewards_from_span

__all__ = [
    "reward",
    "emit_reward",
    "get_reward_value",
    "get_rewards_from_span",
    "is_reward_span",
    "find_reward_spans",
    "find_final_reward",
]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_REWARD_PREFIX = LightningSpanAttributes.REWARD.value


def _is_scalar_number(value: Any) -> bool:
    """A real number or a bool, including NumPy's scalars (``np.float32``, ``np.int64``, ``np.bool_``...)."""
    if isinstance(value, numbers.Real):
        return True
    dtype = getattr(value, "dtype", None)  # NumPy's bool scalar is not registered as a number
    return getattr(dtype, "kind", None) == "b" and getattr(value, "shape", None) == ()


def _as_number(value: Any, what: str, error: type[Exception]) -> float:
    if not _is_scalar_number(value):
        raise error(f"{what} must be a number (int, float or bool), got {type(value).__name__}: {value!r}")
    try:
        return float(value)
    except OverflowError as exc:
        raise error(f"{what} is too large for a float: {value!r}") from exc


def emit_reward(
    reward: Union[float, Dict[str, Any]],
    *,
    primary_key: Optional[str] = None,
    attributes: Optional[Dict[str, Any]] = None,
    propagate: bool = True,
) -> SpanCoreFields:
    """Record a reward as an ``agentlightning.annotation`` span with ``agentlightning.reward.<i>.name/value``.

    Args:
        reward: One number (an int, float or bool, NumPy scalars included; stored as a float), or several named
            dimensions (``{"accuracy": 1.0, "length": 0.2}``).
        primary_key: With several dimensions, the one that is the reward (stored first). A single number is
            always the ``primary`` dimension: ``primary_key`` is then ignored, with a warning.
        attributes: Extra span attributes.
        propagate: Send the span to the active tracer; False only builds the core fields.

    Returns:
        The span's core fields.

    Raises:
        TypeError: A scalar reward is not a number (or too large for a float).
        ValueError: A dimension is not a number or its name not a string, ``primary_key`` is missing / not a
            dimension, or ``attributes`` sets a key of the reward's own (under ``agentlightning.reward``).
        RuntimeError: No active tracer (with ``propagate=True``).
    """
    if isinstance(reward, dict):
        for name in reward:
            if not isinstance(name, str):
                raise ValueError(f"Reward dimension names must be strings, got {type(name).__name__}: {name!r}")
        values = {name: _as_number(value, f"Reward dimension {name!r}", ValueError) for name, value in reward.items()}
        if primary_key is None:
            raise ValueError("primary_key is required when the reward is a dict of dimensions.")
        if primary_key not in values:
            raise ValueError(f"primary_key {primary_key!r} is not one of the reward dimensions {list(values)}.")
        order = [primary_key, *(name for name in values if name != primary_key)]
        dimensions = [{"name": name, "value": values[name]} for name in order]
    else:
        dimensions = [{"name": "primary", "value": _as_number(reward, "Reward", TypeError)}]
        if primary_key is not None:
            logger.warning(
                "primary_key %r is ignored: it applies only to a dict of rewards; a single reward is recorded as %r.",
                primary_key,
                "primary",
            )
    primary, *secondary = dimensions
    if not math.isfinite(primary["value"]):
        logger.warning(
            "Reward %s is %r: it is recorded, and training reads it as no reward.", primary["name"], primary["value"]
        )
    for dimension in secondary:
        if not math.isfinite(dimension["value"]):
            logger.warning("Reward dimension %r is %r: it is recorded.", dimension["name"], dimension["value"])
    for key in attributes or {}:
        if key == _REWARD_PREFIX or str(key).startswith(_REWARD_PREFIX + "."):
            raise ValueError(
                f"attributes may not set {key!r}: the reward's own attributes are under {_REWARD_PREFIX!r}"
            )
    return emit_annotation({_REWARD_PREFIX: dimensions, **(attributes or {})}, propagate=propagate)


def is_reward_span(span: SpanLike) -> bool:
    """Whether the span carries a reward."""
    return get_reward_value(span) is not None


def find_reward_spans(spans: Sequence[SpanLike]) -> List[SpanLike]:
    """The spans that carry a reward, in order."""
    return [span for span in spans if is_reward_span(span)]


def reward(fn: F) -> F:
    """Deprecated decorator: emit the (numeric) return value of ``fn`` as a reward. Use :func:`emit_reward`."""
    warnings.warn("@reward is deprecated; call emit_reward() with the value instead.", DeprecationWarning, stacklevel=2)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            emit_reward(result)
            return result

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        emit_reward(result)
        return result

    return wrapper  # type: ignore[return-value]
