"""The Agents SDK trace provider that records each agent run as an OpenTelemetry span (see
:mod:`agentbolt.tracer.openai_agents`, which installs it). Needs ``openai-agents`` (``pip install 'agentbolt[agents]'``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.trace import Status, StatusCode

try:
    from agents.tracing import (
        AgentSpanData,
        Span,
        SpanError,
        TraceProvider,
        get_trace_provider,
        set_trace_provider,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "Recording OpenAI Agents SDK agents needs the 'openai-agents' package: pip install 'agentbolt[agents]'"
    ) from exc

__all__ = ["AgentSpanRecorder", "RecordedAgentSpan", "AGENT_SPAN_PREFIX", "install_provider", "uninstall_provider"]

logger = logging.getLogger(__name__)

_SCOPE = "agentbolt.openai_agents"
AGENT_SPAN_PREFIX = "openai_agents.agent."
"""An agent run's span is named ``openai_agents.agent.<agent name>``."""

_lock = threading.Lock()
_installed: Optional[AgentSpanRecorder] = None


class RecordedAgentSpan(Span[AgentSpanData]):
    """The SDK's span of one agent run (real, or a no-op one while the SDK's tracing is disabled), plus its
    OpenTelemetry span.

    Everything the SDK asks of the span goes to the SDK's own span, so its trace processors see what they saw before.
    The OpenTelemetry span opens and becomes current (in the run's execution context) when the SDK starts the span,
    and ends when the SDK finishes it.
    """

    def __init__(self, span: Span[AgentSpanData]) -> None:
        self._span = span
        self._otel_span: Optional[trace_api.Span] = None
        self._otel_context: Optional[otel_context.Context] = None
        self._token: Optional[object] = None
        self._error: Optional[SpanError] = None

    # ---- recording ----

    def _open(self) -> None:
        data = self._span.span_data
        name = str(getattr(data, "name", "") or "agent")
        try:
            span = trace_api.get_tracer(_SCOPE).start_span(AGENT_SPAN_PREFIX + name, attributes={"agent.name": name})
            self._otel_span = span
            self._otel_context = trace_api.set_span_in_context(span)
            self._token = otel_context.attach(self._otel_context)
        except Exception:  # recording must never break the agent
            logger.exception("Failed to open the span of OpenAI Agents SDK agent %r", name)

    def _close(self) -> None:
        span, token = self._otel_span, self._token
        if span is None:
            return
        self._otel_span = self._token = None
        try:
            data = self._span.span_data
            attributes: Dict[str, Any] = {}
            for key in ("handoffs", "tools"):
                values: Optional[List[Any]] = getattr(data, key, None)
                if values:
                    attributes[f"agent.{key}"] = [str(value) for value in values]
            output_type = getattr(data, "output_type", None)
            if output_type:
                attributes["agent.output_type"] = str(output_type)
            span.set_attributes(attributes)
            if self._error is not None:
                span.set_status(Status(StatusCode.ERROR, str(self._error.get("message") or "")))
            else:
                span.set_status(Status(StatusCode.OK))
            span.end()
        except Exception:
            logger.exception("Failed to close the span of an OpenAI Agents SDK agent")
        # Only where the span is still current: an abandoned streamed run finalized by another task must not reset
        # (or fail to reset) a context it does not own.
        if token is not None and otel_context.get_current() is self._otel_context:
            otel_context.detach(token)  # type: ignore[arg-type]

    # ---- the SDK's span interface ----

    def start(self, mark_as_current: bool = False) -> None:
        """Start the SDK's span and open the agent's OpenTelemetry span as the current one."""
        self._span.start(mark_as_current=mark_as_current)
        if self._otel_span is None:
            self._open()

    def finish(self, reset_current: bool = False) -> None:
        """End the agent's OpenTelemetry span, then finish the SDK's span."""
        self._close()
        self._span.finish(reset_current=reset_current)

    def __enter__(self) -> RecordedAgentSpan:
        self.start(mark_as_current=True)
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        self._close()
        return self._span.__exit__(exc_type, exc_val, exc_tb)

    def set_error(self, error: SpanError) -> None:
        """Keep the error (the OpenTelemetry span ends failed) and give it to the SDK's span."""
        self._error = error
        self._span.set_error(error)

    @property
    def error(self) -> Optional[SpanError]:
        """The error set on the span, if any."""
        return self._span.error or self._error

    @property
    def trace_id(self) -> str:
        """The SDK span's trace id."""
        return self._span.trace_id

    @property
    def span_id(self) -> str:
        """The SDK span's id."""
        return self._span.span_id

    @property
    def span_data(self) -> AgentSpanData:
        """The SDK span's data (the agent's name, handoffs, tools, output type)."""
        return self._span.span_data

    @property
    def parent_id(self) -> Optional[str]:
        """The SDK span's parent id."""
        return self._span.parent_id

    def export(self) -> Optional[Dict[str, Any]]:
        """The SDK span's export."""
        return self._span.export()

    @property
    def started_at(self) -> Optional[str]:
        """When the SDK span started."""
        return self._span.started_at

    @property
    def ended_at(self) -> Optional[str]:
        """When the SDK span ended."""
        return self._span.ended_at

    @property
    def tracing_api_key(self) -> Optional[str]:
        """The SDK span's tracing API key."""
        return self._span.tracing_api_key

    @property
    def trace_metadata(self) -> Optional[Dict[str, Any]]:
        """The SDK span's trace metadata."""
        return self._span.trace_metadata


class AgentSpanRecorder(TraceProvider):
    """A trace provider that hands every call to the provider it wraps and records agent spans.

    The SDK's disabled flag, processors, traces and spans all stay the wrapped provider's; only the agent spans it
    creates come back wrapped in a :class:`RecordedAgentSpan` (while :attr:`active`).
    """

    def __init__(self, inner: TraceProvider) -> None:
        self.inner = inner
        self.active = True

    def register_processor(self, processor: Any) -> None:
        """Add a processor to the wrapped provider."""
        self.inner.register_processor(processor)

    def set_processors(self, processors: List[Any]) -> None:
        """Replace the wrapped provider's processors."""
        self.inner.set_processors(processors)

    def get_current_trace(self) -> Any:
        """The wrapped provider's current trace."""
        return self.inner.get_current_trace()

    def get_current_span(self) -> Any:
        """The wrapped provider's current span."""
        return self.inner.get_current_span()

    def set_disabled(self, disabled: bool) -> None:
        """Enable or disable the SDK's tracing (agent runs are recorded either way)."""
        self.inner.set_disabled(disabled)

    def time_iso(self) -> str:
        """The wrapped provider's time."""
        return self.inner.time_iso()

    def gen_trace_id(self) -> str:
        """A trace id of the wrapped provider."""
        return self.inner.gen_trace_id()

    def gen_span_id(self) -> str:
        """A span id of the wrapped provider."""
        return self.inner.gen_span_id()

    def gen_group_id(self) -> str:
        """A group id of the wrapped provider."""
        return self.inner.gen_group_id()

    def create_trace(self, *args: Any, **kwargs: Any) -> Any:
        """A trace of the wrapped provider."""
        return self.inner.create_trace(*args, **kwargs)

    def create_span(self, span_data: Any, *args: Any, **kwargs: Any) -> Any:
        """A span of the wrapped provider; an agent span is wrapped to be recorded too."""
        span = self.inner.create_span(span_data, *args, **kwargs)
        if self.active and isinstance(span_data, AgentSpanData):
            return RecordedAgentSpan(span)
        return span

    def force_flush(self) -> None:
        """Flush the wrapped provider's processors."""
        self.inner.force_flush()

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        """Shut the wrapped provider down."""
        self.inner.shutdown(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Anything else a provider offers (a custom provider's own methods) is the wrapped provider's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def install_provider() -> None:
    """Wrap the SDK's trace provider in an :class:`AgentSpanRecorder` (once)."""
    global _installed
    with _lock:
        current = get_trace_provider()
        if isinstance(current, AgentSpanRecorder) and current.active:
            return
        if _installed is not None:
            _installed.active = False  # a provider set over it since keeps it; it passes everything through
        _installed = AgentSpanRecorder(current)
        set_trace_provider(_installed)


def uninstall_provider() -> None:
    """Give the SDK back the provider :func:`install_provider` wrapped (unless another one was set since)."""
    global _installed
    with _lock:
        recorder, _installed = _installed, None
        if recorder is None:
            return
        recorder.active = False
        if get_trace_provider() is recorder:
            set_trace_provider(recorder.inner)
