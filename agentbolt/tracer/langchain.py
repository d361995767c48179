"""A LangChain callback handler that records chains, model calls and tools as OpenTelemetry spans.

Spans go to the global tracer provider (the active agentbolt tracer's), nested like LangChain's runs. OpenAI
calls made underneath (e.g. by ``langchain-openai``) are additionally recorded by the OpenAI instrumentation.
Needs ``langchain-core`` (``pip install 'agentbolt[agents]'``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.trace import Status, StatusCode

from agentbolt.utils.otel import make_tag_attributes

try:
    from langchain_core.callbacks import BaseCallbackHandler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "The LangChain callback handler needs the 'langchain-core' package: pip install 'agentbolt[agents]'"
    ) from exc

__all__ = ["LangchainCallbackHandler"]

logger = logging.getLogger(__name__)

_SCOPE = "agentbolt.langchain"


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _run_name(serialized: Optional[Dict[str, Any]], kwargs: Dict[str, Any], default: str) -> str:
    name = kwargs.get("name")
    if not name and serialized:
        name = serialized.get("name") or (serialized.get("id") or [None])[-1]
    return str(name or default)


def _message_dict(message: Any) -> Dict[str, Any]:
    role = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}.get(
        getattr(message, "type", ""), getattr(message, "type", "user")
    )
    return {"role": role, "content": getattr(message, "content", message)}


class LangchainCallbackHandler(BaseCallbackHandler):
    """Turns LangChain runs into spans: ``langchain.Chain.<name>``, ``langchain.llm.<name>``, ``tool.<name>``.

    Args:
        tags: Tags recorded on every span (``agentlightning.tag.<i>``).
    """

    def __init__(self, tags: Optional[List[str]] = None) -> None:
        super().__init__()
        self.tags = list(tags or [])
        self._spans: Dict[UUID, trace_api.Span] = {}
        self._lock = threading.Lock()

    def _start(self, name: str, run_id: UUID, parent_run_id: Optional[UUID], attributes: Dict[str, Any]) -> None:
        with self._lock:
            parent = self._spans.get(parent_run_id) if parent_run_id is not None else None
        context = trace_api.set_span_in_context(parent) if parent is not None else otel_context.get_current()
        tracer = trace_api.get_tracer(_SCOPE)
        span = tracer.start_span(name, context=context, attributes={**make_tag_attributes(self.tags), **attributes})
        with self._lock:
            self._spans[run_id] = span

    def _end(
        self, run_id: UUID, attributes: Optional[Dict[str, Any]] = None, error: Optional[BaseException] = None
    ) -> None:
        with self._lock:
            span = self._spans.pop(run_id, None)
        if span is None:
            return
        if attributes:
            span.set_attributes(attributes)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)))
        else:
            span.set_status(Status(StatusCode.OK))
        span.end()

    # ---- chains ----

    def on_chain_start(
        self,
        serialized: Optional[Dict[str, Any]],
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        """Open a chain span."""
        name = _run_name(serialized, kwargs, "chain")
        self._start(
            f"langchain.Chain.{name}",
            run_id,
            parent_run_id,
            {"lc_name": name, "langchain.chain.inputs": _json(inputs)},
        )

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a chain span with its outputs."""
        self._end(run_id, {"langchain.chain.outputs": _json(outputs)})

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a chain span as failed."""
        self._end(run_id, error=error)

    # ---- models ----

    def _llm_start(
        self,
        serialized: Optional[Dict[str, Any]],
        messages: Sequence[Dict[str, Any]],
        run_id: UUID,
        parent_run_id: Optional[UUID],
        kwargs: Dict[str, Any],
    ) -> None:
        name = _run_name(serialized, kwargs, "llm")
        attributes: Dict[str, Any] = {"gen_ai.system": "langchain"}
        model = (kwargs.get("invocation_params") or {}).get("model") or (kwargs.get("metadata") or {}).get(
            "ls_model_name"
        )
        if model:
            attributes["gen_ai.request.model"] = str(model)
        for i, message in enumerate(messages):
            attributes[f"gen_ai.prompt.{i}.role"] = str(message["role"])
            attributes[f"gen_ai.prompt.{i}.content"] = _json(message["content"])
        self._start(f"langchain.llm.{name}", run_id, parent_run_id, attributes)

    def on_llm_start(
        self,
        serialized: Optional[Dict[str, Any]],
        prompts: List[str],
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        """Open a model span for a text-completion call."""
        self._llm_start(serialized, [{"role": "user", "content": p} for p in prompts], run_id, parent_run_id, kwargs)

    def on_chat_model_start(
        self,
        serialized: Optional[Dict[str, Any]],
        messages: List[List[Any]],
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        """Open a model span for a chat call."""
        flat = [_message_dict(m) for batch in messages for m in batch]
        self._llm_start(serialized, flat, run_id, parent_run_id, kwargs)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a model span with the generated text."""
        attributes: Dict[str, Any] = {}
        generations = getattr(response, "generations", None) or []
        for i, generation in enumerate(g for batch in generations for g in batch):
            attributes[f"gen_ai.completion.{i}.role"] = "assistant"
            attributes[f"gen_ai.completion.{i}.content"] = str(getattr(generation, "text", ""))
        self._end(run_id, attributes)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a model span as failed."""
        self._end(run_id, error=error)

    # ---- tools ----

    def on_tool_start(
        self,
        serialized: Optional[Dict[str, Any]],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        inputs: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        """Open a tool span (``tool.name``, ``tool.parameters``, ``tool.call.id`` when known)."""
        name = _run_name(serialized, kwargs, "tool")
        attributes: Dict[str, Any] = {
            "tool.name": name,
            "tool.parameters": _json(inputs if inputs is not None else input_str),
            "tool.call.type": "function",
        }
        call_id = kwargs.get("tool_call_id") or (kwargs.get("metadata") or {}).get("tool_call_id")
        if call_id:
            attributes["tool.call.id"] = str(call_id)
        self._start(f"tool.{name}", run_id, parent_run_id, attributes)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a tool span with its output."""
        content = getattr(output, "content", output)
        self._end(run_id, {"tool.output": _json(content)})

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a tool span as failed."""
        self._end(run_id, error=error)
