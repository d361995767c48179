"""A LangChain callback handler that records chains, model calls and tools as OpenTelemetry spans.

Spans go to the global tracer provider (the active agentbolt tracer's), nested like LangChain's runs. A chat model
call is recorded with the same attribute keys as the OpenAI SDK instrumentation and the LLM gateway (built by
:mod:`agentbolt.llm_call_attributes` from the OpenAI form of LangChain's messages): the assistant's tool calls with
their ids, tool messages with their ``tool_call_id``, the tools offered, the response id, finish reasons and usage.
OpenAI calls made underneath (e.g. by ``langchain-openai``) are additionally recorded by the OpenAI
instrumentation, and by the gateway when they go through it; the adapters keep one record per call (see
:mod:`agentbolt.adapter.calls`). Needs ``langchain-core`` (``pip install 'agentbolt[agents]'``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.trace import Status, StatusCode

from agentbolt.llm_call_attributes import CompletionRecord, request_attributes
from agentbolt.semconv import LANGGRAPH_NODE_PATH
from agentbolt.utils.otel import make_tag_attributes, record_exception_event

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import BaseMessage, convert_to_openai_messages
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


def _langgraph_node_path(name: str, kwargs: Dict[str, Any]) -> Optional[str]:
    """For the run of a LangGraph node, the names of the nodes leading to it (``"researcher/agent"``); else None.

    LangGraph gives every run inside a node the node's name (``langgraph_node``) and its checkpoint namespace, the
    nodes from the outermost graph down, each with its task id (``"researcher:<id>|agent:<id>"``). The node's own run
    is the one named after the node.
    """
    metadata = kwargs.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("langgraph_node") != name:
        return None
    namespace = metadata.get("langgraph_checkpoint_ns")
    nodes = [part.split(":", 1)[0] for part in namespace.split("|")] if isinstance(namespace, str) else []
    if not nodes or nodes[-1] != name:
        nodes.append(name)
    return "/".join(node for node in nodes if node)


def _openai_message(message: Any) -> Dict[str, Any]:
    """A LangChain message in the OpenAI chat format (tool calls with ids, ``tool_call_id`` of tool results)."""
    if isinstance(message, BaseMessage):
        return convert_to_openai_messages(message)  # type: ignore[return-value]
    return {"role": "user", "content": message if isinstance(message, str) else _json(message)}


def _completion(response: Any) -> Dict[str, Any]:
    """An LLM run's result (``LLMResult``) in the layout of an OpenAI completion: id, model, usage, choices."""
    output = getattr(response, "llm_output", None) or {}
    generations = [g for batch in getattr(response, "generations", None) or [] for g in batch]
    choices: List[Dict[str, Any]] = []
    metadata: Dict[str, Any] = {}
    for index, generation in enumerate(generations):
        info = getattr(generation, "generation_info", None) or {}
        message = getattr(generation, "message", None)
        choice: Dict[str, Any] = {"index": index, "finish_reason": info.get("finish_reason")}
        if message is not None:
            choice["message"] = _openai_message(message)
            metadata = metadata or dict(getattr(message, "response_metadata", None) or {})
            choice["finish_reason"] = choice["finish_reason"] or metadata.get("finish_reason")
        else:
            choice["text"] = getattr(generation, "text", "")
        choices.append(choice)
    return {
        "id": output.get("id") or metadata.get("id"),
        "model": output.get("model_name") or metadata.get("model_name"),
        "usage": output.get("token_usage") or metadata.get("token_usage"),
        "choices": choices,
    }


def _where() -> Tuple[int, Optional[int]]:
    """The running thread and asyncio task: a context attached here can be detached only from the same place."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        task = None
    return threading.get_ident(), id(task) if task is not None else None


class _CurrentWhileOpen(trace_api.Span):
    """The current span during a model run: the run's span while it is open, then the span current before it.

    What a run's start makes current in a context it cannot restore (see
    :meth:`LangchainCallbackHandler._restore_context`) thus never parents spans started there after the run.
    """

    def __init__(self, span: trace_api.Span, before: trace_api.Span) -> None:
        self._span = span
        self._before = before

    def _target(self) -> trace_api.Span:
        return self._span if self._span.is_recording() else self._before

    def get_span_context(self) -> trace_api.SpanContext:
        return self._target().get_span_context()

    def is_recording(self) -> bool:
        return self._target().is_recording()

    def set_attributes(self, attributes: Dict[str, Any]) -> None:
        self._target().set_attributes(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self._target().set_attribute(key, value)

    def add_event(self, name: str, attributes: Any = None, timestamp: Optional[int] = None) -> None:
        self._target().add_event(name, attributes, timestamp)

    def add_link(self, context: trace_api.SpanContext, attributes: Any = None) -> None:
        self._target().add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self._target().update_name(name)

    def set_status(self, status: Any, description: Optional[str] = None) -> None:
        self._target().set_status(status, description)

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: Optional[int] = None, escaped: bool = False
    ) -> None:
        self._target().record_exception(exception, attributes, timestamp, escaped)

    def end(self, end_time: Optional[int] = None) -> None:
        self._target().end(end_time)


class LangchainCallbackHandler(BaseCallbackHandler):
    """Turns LangChain runs into spans: ``langchain.Chain.<name>``, ``langchain.llm.<name>``, ``tool.<name>``.

    Args:
        tags: Tags recorded on every span (``agentlightning.tag.<i>``).
    """

    run_inline = True
    """Called in the run's own context, asynchronous runs included (LangChain otherwise calls a synchronous handler
    of an asynchronous run in a thread pool): a model run's span can then be the current span while the model's
    client calls the LLM."""

    def __init__(self, tags: Optional[List[str]] = None) -> None:
        super().__init__()
        self.tags = list(tags or [])
        self._spans: Dict[UUID, trace_api.Span] = {}
        self._parents: Dict[UUID, Optional[UUID]] = {}
        self._current: Dict[UUID, Tuple[object, _CurrentWhileOpen, Tuple[int, Optional[int]]]] = {}
        self._lock = threading.Lock()

    def _start(
        self, name: str, run_id: UUID, parent_run_id: Optional[UUID], attributes: Dict[str, Any]
    ) -> trace_api.Span:
        with self._lock:
            parent = self._spans.get(parent_run_id) if parent_run_id is not None else None
        context = trace_api.set_span_in_context(parent) if parent is not None else otel_context.get_current()
        tracer = trace_api.get_tracer(_SCOPE)
        span = tracer.start_span(name, context=context, attributes={**make_tag_attributes(self.tags), **attributes})
        with self._lock:
            self._spans[run_id] = span
            self._parents[run_id] = parent_run_id
        return span

    def _make_current(self, run_id: UUID, span: trace_api.Span) -> None:
        """Make ``span`` the current span of this context while its run is open.

        The model's client (the OpenAI SDK, instrumented) records the LLM call inside the model run: its span then
        nests under the run's, and so under the graph nodes and agents around it, which name the call's agent.
        """
        stand_in = _CurrentWhileOpen(span, trace_api.get_current_span())
        token = otel_context.attach(trace_api.set_span_in_context(stand_in))
        with self._lock:
            self._current[run_id] = (token, stand_in, _where())

    def _restore_context(self, run_ids: Sequence[UUID]) -> None:
        """Undo :meth:`_make_current` for the runs that ended, where the run ends in the context it started in.

        LangChain ends an asynchronous run in a copy of that context, where it cannot be undone; the stand-in left
        in the start's context then stands for the span that was current before.
        """
        with self._lock:
            current = [self._current.pop(run_id) for run_id in run_ids if run_id in self._current]
        for token, stand_in, where in current:  # deepest first
            if where == _where() and trace_api.get_current_span() is stand_in:
                otel_context.detach(token)  # type: ignore[arg-type]

    def _open_descendants(self, run_id: UUID) -> List[UUID]:
        """The runs still open below ``run_id``, deepest first (the caller holds the lock)."""
        found: List[UUID] = []
        frontier = [run_id]
        while frontier:
            parent = frontier.pop()
            children = [child for child, of in self._parents.items() if of == parent]
            found.extend(children)
            frontier.extend(children)
        return found[::-1]

    def _end(
        self, run_id: UUID, attributes: Optional[Dict[str, Any]] = None, error: Optional[BaseException] = None
    ) -> None:
        """End the span of ``run_id``, and before it those of its runs LangChain never reported the end of.

        A cancelled run (``asyncio.CancelledError``) reports its error on the chain it cancelled but not on the model
        call awaited inside it; that call's span ends with the chain's error instead of staying open forever.
        """
        with self._lock:
            orphans = [(child, self._spans.pop(child)) for child in self._open_descendants(run_id)]
            for child, _ in orphans:
                del self._parents[child]
            span = self._spans.pop(run_id, None)
            self._parents.pop(run_id, None)
        self._restore_context([child for child, _ in orphans] + [run_id])
        for _, orphan in orphans:  # their outcome is unknown unless the parent failed
            self._close(orphan, None, error, reported=False)
        if span is not None:
            self._close(span, attributes, error)

    @staticmethod
    def _close(
        span: trace_api.Span,
        attributes: Optional[Dict[str, Any]],
        error: Optional[BaseException],
        *,
        reported: bool = True,
    ) -> None:
        if attributes:
            span.set_attributes(attributes)
        if error is not None:
            message = record_exception_event(span, error)  # lone surrogates replaced, as in the call's attributes
            span.set_status(Status(StatusCode.ERROR, message))
        elif reported:
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
        attributes = {"lc_name": name, "langchain.chain.inputs": _json(inputs)}
        node_path = _langgraph_node_path(name, kwargs)
        if node_path is not None:
            attributes[LANGGRAPH_NODE_PATH] = node_path
        self._start(f"langchain.Chain.{name}", run_id, parent_run_id, attributes)

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
        operation: str,
    ) -> None:
        name = _run_name(serialized, kwargs, "llm")
        # The invocation parameters are the model's request settings (model, temperature, tools bound...).
        request = dict(kwargs.get("invocation_params") or {})
        model = request.get("model") or request.get("model_name") or (kwargs.get("metadata") or {}).get("ls_model_name")
        request.update(model=str(model) if model else None, messages=list(messages))
        try:
            attributes = request_attributes(request, operation=operation, provider="langchain")
        except Exception:  # recording must never break the agent
            logger.exception("Failed to record the LangChain model request on the span")
            attributes = {}
        self._make_current(run_id, self._start(f"langchain.llm.{name}", run_id, parent_run_id, attributes))

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
        self._llm_start(
            serialized,
            [{"role": "user", "content": p} for p in prompts],
            run_id,
            parent_run_id,
            kwargs,
            "text_completion",
        )

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
        flat = [_openai_message(m) for batch in messages for m in batch]
        self._llm_start(serialized, flat, run_id, parent_run_id, kwargs, "chat")

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close a model span with the response: messages with their tool calls, response id, usage."""
        try:
            attributes = CompletionRecord.from_completion(_completion(response)).attributes()
        except Exception:  # recording must never break the agent
            logger.exception("Failed to record the LangChain model response on the span")
            attributes = {}
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
