"""The gateway's metrics: requests, errors, latency, time to first token, and tokens in and out.

Recorded to a :class:`~agentbolt.utils.metrics.MetricsBackend` (Prometheus, console) when the gateway has one; the
names are listed in :data:`GATEWAY_METRICS` and ``docs/metrics.md``. Each call costs a few counter and histogram
updates after its answer is ready, nothing before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["GATEWAY_METRICS", "CallOutcome", "GatewayMetrics"]

GATEWAY_METRICS = {
    "agentbolt.gateway.requests": "counter (endpoint, model, status): completion requests answered, by HTTP status",
    "agentbolt.gateway.errors": "counter (endpoint, model, error_type): requests answered with an error",
    "agentbolt.gateway.latency": "histogram (endpoint, model): seconds from request to the end of the answer",
    "agentbolt.gateway.time_to_first_token": "histogram (endpoint, model): seconds to the first streamed event",
    "agentbolt.gateway.tokens": "counter (endpoint, model, direction=input|output): tokens the backends reported",
}

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_LABELS = ["endpoint", "model"]


@dataclass
class CallOutcome:
    """What one completion request turned out to be, filled in while it is handled."""

    endpoint: str
    started: float
    model: str = "unknown"
    status: int = 0
    error_type: Optional[str] = None
    usage: Optional[Dict[str, Any]] = None
    first_token: Optional[float] = None


def _tokens(usage: Optional[Dict[str, Any]], *keys: str) -> float:
    if not isinstance(usage, dict):
        return 0.0
    for key in keys:
        value = usage.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 0.0


class GatewayMetrics:
    """Registers the gateway's metrics on ``tracker`` and records each call's outcome."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        tracker.register_counter("agentbolt.gateway.requests", [*_LABELS, "status"])
        tracker.register_counter("agentbolt.gateway.errors", [*_LABELS, "error_type"])
        tracker.register_counter("agentbolt.gateway.tokens", [*_LABELS, "direction"])
        tracker.register_histogram("agentbolt.gateway.latency", _LABELS, buckets=_LATENCY_BUCKETS)
        tracker.register_histogram("agentbolt.gateway.time_to_first_token", _LABELS, buckets=_LATENCY_BUCKETS)

    async def record(self, outcome: CallOutcome, finished: float) -> None:
        """Record one answered call (``finished``: ``time.perf_counter()`` when its answer ended)."""
        tracker = self.tracker
        labels = {"endpoint": outcome.endpoint, "model": outcome.model}
        await tracker.inc_counter("agentbolt.gateway.requests", labels={**labels, "status": str(outcome.status)})
        if outcome.status >= 400 or outcome.error_type is not None:
            error = outcome.error_type or f"http_{outcome.status}"
            await tracker.inc_counter("agentbolt.gateway.errors", labels={**labels, "error_type": error})
        await tracker.observe_histogram("agentbolt.gateway.latency", finished - outcome.started, labels)
        if outcome.first_token is not None:
            await tracker.observe_histogram(
                "agentbolt.gateway.time_to_first_token", outcome.first_token - outcome.started, labels
            )
        if outcome.usage:
            tokens_in = _tokens(outcome.usage, "prompt_tokens", "input_tokens")
            tokens_out = _tokens(outcome.usage, "completion_tokens", "output_tokens")
            if tokens_in:
                await tracker.inc_counter("agentbolt.gateway.tokens", tokens_in, {**labels, "direction": "input"})
            if tokens_out:
                await tracker.inc_counter("agentbolt.gateway.tokens", tokens_out, {**labels, "direction": "output"})
