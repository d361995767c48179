"""Semantic conventions: span names and attribute keys shared by emitters, tracers and adapters.

The ``agentlightning.*`` keys are kept verbatim so traces are interchangeable with Agent Lightning.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel

AGL_ANNOTATION = "agentlightning.annotation"
AGL_MESSAGE = "agentlightning.message"
AGL_OBJECT = "agentlightning.object"
AGL_EXCEPTION = "agentlightning.exception"
AGL_OPERATION = "agentlightning.operation"
AGL_REWARD = "agentlightning.reward"
AGL_VIRTUAL = "agentlightning.virtual"


class LightningResourceAttributes(Enum):
    """Resource attributes binding spans to a rollout."""

    ROLLOUT_ID = "agentlightning.rollout_id"
    ATTEMPT_ID = "agentlightning.attempt_id"
    SPAN_SEQUENCE_ID = "agentlightning.span_sequence_id"
    TRACER_NAME = "agentlightning.tracer.name"


class LightningSpanAttributes(Enum):
    """Span attribute keys (and prefixes) written by agentbolt emitters."""

    REWARD = "agentlightning.reward"
    LINK = "agentlightning.link"
    TAG = "agentlightning.tag"
    MESSAGE_BODY = "agentlightning.message.body"
    OBJECT_TYPE = "agentlightning.object.type"
    OBJECT_LITERAL = "agentlightning.object.literal"
    OBJECT_JSON = "agentlightning.object.json"
    OPERATION_NAME = "agentlightning.operation.name"
    OPERATION_INPUT = "agentlightning.operation.input"
    OPERATION_OUTPUT = "agentlightning.operation.output"


class RewardAttributes(Enum):
    """Keys of one reward dimension: ``agentlightning.reward.<i>.name`` / ``.value``."""

    REWARD_NAME = "name"
    REWARD_VALUE = "value"


class LinkAttributes(Enum):
    """Keys of one link: ``agentlightning.link.<i>.key_match`` / ``.value_match``."""

    KEY_MATCH = "key_match"
    VALUE_MATCH = "value_match"


class RewardPydanticModel(BaseModel):
    """One reward dimension; index 0 on a span is the primary reward."""

    name: str
    value: float


class LinkPydanticModel(BaseModel):
    """A link condition: spans whose ``key_match`` equals ``value_match``."""

    key_match: str
    value_match: str
