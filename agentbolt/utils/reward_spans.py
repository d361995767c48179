"""Reading rewards back from spans: the one rule shared by emitters, adapters, algorithms and the store's dashboard.

Rewards are recorded as ``agentlightning.annotation`` spans carrying ``agentlightning.reward.<i>.name/value``
(index 0 is the primary reward); two legacy formats are still understood.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, List, Optional, Sequence

from pydantic import TypeAdapter

from agentbolt.semconv import AGL_ANNOTATION, AGL_OPERATION, AGL_REWARD, LightningSpanAttributes, RewardPydanticModel
from agentbolt.types.tracer import SpanLike
from agentbolt.utils.otel import filter_and_unflatten_attributes, filter_attributes

__all__ = [
    "REWARD_SPAN_NAME",
    "candidate_score",
    "get_rewards_from_span",
    "get_reward_value",
    "find_final_reward",
    "is_reward_operation",
    "recorded_reward",
    "training_reward",
]

logger = logging.getLogger("agentbolt.emitter.reward")

REWARD_SPAN_NAME = AGL_ANNOTATION
"""Name of the spans ``emit_reward`` records (annotation spans)."""

_REWARD_PREFIX = LightningSpanAttributes.REWARD.value
_REWARD_LIST: TypeAdapter[List[RewardPydanticModel]] = TypeAdapter(List[RewardPydanticModel])
_LEGACY_OUTPUT_KEYS = ("agentops.task.output", "agentops.entity.output")
_OPERATION_NAME = LightningSpanAttributes.OPERATION_NAME.value
_OPERATION_OUTPUT = LightningSpanAttributes.OPERATION_OUTPUT.value


def get_rewards_from_span(span: SpanLike) -> List[RewardPydanticModel]:
    """All reward dimensions stored on a span (primary first); empty when it has none."""
    attributes = span.attributes or {}
    if not filter_attributes(attributes, _REWARD_PREFIX):
        return []
    return _REWARD_LIST.validate_python(filter_and_unflatten_attributes(attributes, _REWARD_PREFIX))


def _legacy_agentops_reward(attributes: Any) -> Optional[float]:
    for key in _LEGACY_OUTPUT_KEYS:
        raw = attributes.get(key)
        if raw is None:
            continue
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                continue
        if isinstance(raw, dict) and raw.get("type") == "reward":
            logger.warning("Reading a reward in the legacy AgentOps format; emit rewards with emit_reward().")
            value = raw.get("value")
            return None if value is None else float(value)
    return None


def get_reward_value(span: SpanLike) -> Optional[float]:
    """The primary reward of a span, or None when the span carries no reward.

    Understands the current format (``agentlightning.reward.0.value``) and two legacy ones (AgentOps
    ``{"type": "reward", "value": v}`` outputs, and annotation spans with a ``reward`` attribute).
    """
    rewards = get_rewards_from_span(span)
    if rewards:
        return rewards[0].value
    attributes = span.attributes or {}
    legacy = _legacy_agentops_reward(attributes)
    if legacy is not None:
        return legacy
    if span.name == AGL_ANNOTATION and "reward" in attributes:
        value = attributes["reward"]
        return float(value) if isinstance(value, (int, float)) else None
    return None


def find_final_reward(spans: Sequence[SpanLike]) -> Optional[float]:
    """The reward of the last span that has one, or None."""
    for span in reversed(spans):
        value = get_reward_value(span)
        if value is not None:
            return value
    return None


def recorded_reward(span: SpanLike) -> Optional[float]:
    """The reward a span records for training: :func:`get_reward_value`'s, or the number a legacy
    ``agentlightning.operation`` span named ``agentlightning.reward`` outputs, which the adapters take for a reward
    span too (``TraceTree.is_reward_span``), so that a rollout's final reward and its calls' rewards agree.

    Raises:
        ValueError: A reward recorded as something that is not a number (as :func:`get_reward_value`).
    """
    value = get_reward_value(span)
    if value is None and is_reward_operation(span):
        output = (span.attributes or {}).get(_OPERATION_OUTPUT)
        if isinstance(output, (int, float)) and not isinstance(output, bool):
            value = float(output)
    return value


def is_reward_operation(span: SpanLike) -> bool:
    """Whether ``span`` is a legacy ``agentlightning.operation`` span named ``agentlightning.reward``."""
    return span.name == AGL_OPERATION and (span.attributes or {}).get(_OPERATION_NAME) == AGL_REWARD


def training_reward(spans: Sequence[SpanLike], rollout_id: str, *, warn: bool = True) -> Optional[float]:
    """The final reward an algorithm trains or selects on: that of the last span recording one
    (:func:`recorded_reward`, so :func:`find_final_reward`'s, legacy reward operations included), except that a
    reward which is not a finite number (NaN, an infinity) counts as none, with a warning (unless ``warn`` is False: a
    reader that only shows scores, such as the dashboard, which reads the same rollouts at every refresh). One NaN in
    a group would turn every advantage of the group, or a prompt's mean score, into NaN."""
    reward = next((value for span in reversed(spans) if (value := recorded_reward(span)) is not None), None)
    if reward is not None and not math.isfinite(reward):
        if warn:
            logger.warning("Rollout %s reported the reward %s: counted as a rollout without one", rollout_id, reward)
        return None
    return reward


def candidate_score(status: str, reward: Optional[float]) -> float:
    """What one rollout adds to a prompt candidate's score: its training reward (:func:`training_reward`) when it
    succeeded; 0 when it failed, was cancelled or has no finite reward. The prompt optimizers score candidates by
    it, and the dashboard shows their scores with it."""
    return float(reward) if status == "succeeded" and reward is not None else 0.0
