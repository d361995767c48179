"""The default tracer: OpenTelemetry plus automatic instrumentation of LLM SDKs.

The name ``AgentOpsTracer`` is kept for compatibility with Agent Lightning, where this tracer was powered by
AgentOps. Here it is powered by agentbolt's own instrumentation (:mod:`agentbolt.instrumentation`) and needs no
AgentOps installation or account. Each trace context is wrapped in a root span named after the trace, so the
spans of one rollout attempt form a single tree.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Set

from opentelemetry import trace as trace_api
from opentelemetry.trace import Status, StatusCode

from agentbolt.instrumentation import instrument_all, uninstrument_all
from agentbolt.semconv import LightningResourceAttributes
from agentbolt.tracer.openai_agents import instrument_openai_agents, uninstrument_openai_agents
from agentbolt.tracer.otel import DEFAULT_MAX_BUFFERED_SPANS, STORE_WRITE_TIMEOUT_SECONDS, OtelTracer

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = ["AgentOpsTracer"]

logger = logging.getLogger(__name__)

ROOT_SPAN_KIND_ATTRIBUTE = "agentbolt.trace.root"

_instrumentation_lock = threading.Lock()
"""Guards instrumenting and uninstrumenting SDKs, which patch them for the whole process."""


class AgentOpsTracer(OtelTracer):
    """OpenTelemetry tracer that instruments the OpenAI SDK (and records OpenAI Agents SDK agents) while workers run.

    Args:
        agentops_managed: Accepted for compatibility; AgentOps is not used.
        instrument_managed: Instrument SDKs in :meth:`init_worker` and undo it in :meth:`teardown_worker`: the
            OpenAI SDK's calls, and the OpenAI Agents SDK's agent runs (:mod:`agentbolt.tracer.openai_agents`).
            When False, call :func:`agentbolt.instrumentation.instrument_all` (and
            :func:`~agentbolt.tracer.openai_agents.instrument_openai_agents`) yourself.
        daemon: Accepted for compatibility; there is no background AgentOps service to run.
        max_buffered_spans: See :class:`~agentbolt.tracer.otel.LightningSpanProcessor`.
        write_timeout: See :class:`~agentbolt.tracer.otel.LightningSpanProcessor`.
    """

    def __init__(
        self,
        *,
        agentops_managed: bool = True,
        instrument_managed: bool = True,
        daemon: bool = True,
        max_buffered_spans: int = DEFAULT_MAX_BUFFERED_SPANS,
        write_timeout: float = STORE_WRITE_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(max_buffered_spans=max_buffered_spans, write_timeout=write_timeout)
        self.agentops_managed = agentops_managed
        self.instrument_managed = instrument_managed
        self.daemon = daemon
        self._instrumented_workers: Set[int] = set()
        if not instrument_managed:
            logger.warning(
                "instrument_managed=False: LLM SDK calls are traced only after you call "
                "agentbolt.instrumentation.instrument_all()."
            )

    def instrument(self, worker_id: int) -> None:
        """Instrument the supported SDKs (OpenAI) and record OpenAI Agents SDK agents as spans."""
        instrument_all()
        instrument_openai_agents()

    def uninstrument(self, worker_id: int) -> None:
        """Remove the SDK instrumentation and the agent recording."""
        uninstrument_openai_agents()
        uninstrument_all()

    def init_worker(self, worker_id: int, store: Optional[LightningStore] = None) -> None:
        """Install the tracer provider and instrument SDKs (when managed)."""
        super().init_worker(worker_id, store)
        if self.instrument_managed:
            with _instrumentation_lock:
                self._instrumented_workers.add(worker_id)
                self.instrument(worker_id)

    def teardown_worker(self, worker_id: int) -> None:
        """Flush spans and remove the instrumentation (when managed) once no worker of this tracer runs.

        Runner threads of one process share the tracer: the instrumentation stays while another one still runs.
        """
        super().teardown_worker(worker_id)
        if self.instrument_managed:
            with _instrumentation_lock:
                self._instrumented_workers.discard(worker_id)
                if not self._instrumented_workers:
                    self.uninstrument(worker_id)

    def _resolve_store(
        self, store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> Optional[LightningStore]:
        effective = self._effective_store(store)
        given = [effective is not None, rollout_id is not None, attempt_id is not None]
        if any(given) and not all(given):
            raise ValueError(
                "store, rollout_id and attempt_id must be either all provided or all None "
                f"(store given: {given[0]}, rollout_id: {rollout_id!r}, attempt_id: {attempt_id!r})"
            )
        return effective

    @contextmanager
    def _root_span(
        self, tracer: trace_api.Tracer, name: Optional[str], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> Iterator[None]:
        attributes: Dict[str, Any] = {ROOT_SPAN_KIND_ATTRIBUTE: True}
        if rollout_id is not None and attempt_id is not None:
            attributes[LightningResourceAttributes.ROLLOUT_ID.value] = rollout_id
            attributes[LightningResourceAttributes.ATTEMPT_ID.value] = attempt_id
        with tracer.start_as_current_span(
            name or rollout_id or "agentbolt.trace",
            attributes=attributes,
            record_exception=True,
            set_status_on_exception=True,
        ) as root:
            yield
            root.set_status(Status(StatusCode.OK))

    def get_langchain_handler(self, tags: Optional[List[str]] = None) -> Any:
        """A LangChain callback handler that records chains, LLM calls and tools as spans of this tracer.

        Args:
            tags: Tags added to every span of the handler.

        Raises:
            ImportError: ``langchain-core`` is not installed.
        """
        from agentbolt.tracer.langchain import LangchainCallbackHandler

        return LangchainCallbackHandler(tags=tags)

    get_langchain_callback_handler = get_langchain_handler
