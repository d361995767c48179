"""Adapters: turn the spans of a rollout into training data (triplets, chat messages)."""

from .base import Adapter, OtelTraceAdapter, TraceAdapter, TraceToTripletBase
from .messages import TraceToMessages
from .triplet import LlmProxyTraceToTriplet, TracerTraceToTriplet

__all__ = [
    "TraceAdapter",
    "OtelTraceAdapter",
    "Adapter",
    "TraceToTripletBase",
    "TracerTraceToTriplet",
    "LlmProxyTraceToTriplet",
    "TraceToMessages",
]
