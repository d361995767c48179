"""Tracers: collect the spans of a rollout attempt and write them to the store."""

from .agentops import AgentOpsTracer
from .base import Tracer, clear_active_tracer, get_active_tracer, set_active_tracer
from .dummy import DummyTracer
from .otel import OtelTracer

__all__ = [
    "AgentOpsTracer",
    "Tracer",
    "OtelTracer",
    "DummyTracer",
    "get_active_tracer",
    "set_active_tracer",
    "clear_active_tracer",
]
