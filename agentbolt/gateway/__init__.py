"""The agentbolt LLM gateway: an OpenAI-compatible proxy that records every call as a span with token ids.

:class:`agentbolt.llm_proxy.LLMProxy` is the public facade; this package holds the parts: routing
(:mod:`~agentbolt.gateway.routing`), the pooled upstream client (:mod:`~agentbolt.gateway.upstream`), the FastAPI app
(:mod:`~agentbolt.gateway.app`), span building (:mod:`~agentbolt.gateway.recording`) and sequence ids
(:mod:`~agentbolt.gateway.sequence`). Spans are written by the store's
:class:`~agentbolt.store.span_writer.SpanWriter`, the writer the tracer uses too.
"""

from agentbolt.gateway.app import Gateway, GatewaySettings, create_app
from agentbolt.gateway.routing import Deployment, ModelRouter, UnknownModelError
from agentbolt.gateway.upstream import GatewayError

__all__ = [
    "Deployment",
    "Gateway",
    "GatewayError",
    "GatewaySettings",
    "ModelRouter",
    "UnknownModelError",
    "create_app",
]
