"""Tracing through W&B Weave, entirely in this process.

:class:`WeaveTracer` records what the Weave SDK records (``@weave.op`` functions and the integrations Weave patches)
and turns every finished Weave call into a :class:`~agentbolt.types.Span` of the current rollout attempt. Weave
normally sends calls to W&B's trace server; here its client talks to an :class:`InMemoryWeaveTraceServer` in the
same process instead, so nothing goes over the network and no W&B account or login is needed (``weave.init`` is
not called: the tracer builds the Weave client itself).

A call becomes a span named after its op's function (``weave:///entity/project/op/<name>:<digest>`` gives
``<name>``) with these attributes: ``agentlightning.operation.name``, the call's own attributes, its inputs under
``agentlightning.operation.input`` and its output under ``agentlightning.operation.output`` (flattened), its summary
under ``weave.summary`` and, for a failed call, ``exception.type`` / ``exception.message`` (the span status is then
ERROR). The span's resource carries the rollout, attempt and sequence ids and ``agentlightning.tracer.name`` =
``"weave"``. Spans are stored when the trace context ends, in the order the calls finished.

Needs the ``weave`` package: ``pip install 'agentbolt[weave]'``.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncContextManager, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Tuple

try:
    from weave.trace import weave_client
    from weave.trace.context import weave_client_context
    from weave.trace.settings import UserSettings, parse_and_apply_settings
    from weave.vendor.weave_server_sdk.types import CallStartResponse, FileCreateResponse
    from weave.vendor.weave_server_sdk.types.object_create_response import ObjectCreateResponse
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "WeaveTracer needs the 'weave' package (version 0.51 or later): pip install 'agentbolt[weave]'. "
        f"Importing it failed: {exc}"
    ) from exc

from agentbolt.semconv import LightningResourceAttributes, LightningSpanAttributes
from agentbolt.store.base import LightningStore
from agentbolt.tracer.base import Tracer
from agentbolt.types import OtelResource, Span, SpanContext, SpanCoreFields, TraceStatus
from agentbolt.types.tracer import Attributes, StatusCode
from agentbolt.utils.id import generate_id
from agentbolt.utils.otel import flatten_attributes, sanitize_attributes

__all__ = [
    "InMemoryWeaveTraceServer",
    "WeaveTracer",
    "WeaveSpanRecordingContext",
    "op_name_to_func_name",
    "random_project_name",
]

logger = logging.getLogger(__name__)

_ENTITY = "agl"
_SUMMARY_KEY = "weave.summary"


def op_name_to_func_name(op_name: str) -> str:
    """The function name in a Weave op reference (``weave:///entity/project/op/<name>:<digest>`` -> ``<name>``).

    A plain name (no ``/`` and no ``:``) is returned unchanged.
    """
    last = op_name.rstrip("/").rsplit("/", 1)[-1]
    return last.split(":", 1)[0] or op_name


def random_project_name() -> str:
    """A fresh project name, ``weave-`` followed by 12 hex digits."""
    return "weave-" + generate_id(12)


def _field(obj: Any, name: str) -> Any:
    """A field of a Weave request: requests are dicts in recent versions of the SDK, pydantic models in older ones."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _hex_id(weave_id: str, length: int) -> str:
    """An OpenTelemetry-style hex id (``length`` digits) for a Weave id (usually a UUID)."""
    compact = weave_id.replace("-", "").lower()
    if len(compact) == length and all(c in "0123456789abcdef" for c in compact):
        return compact
    return hashlib.sha256(weave_id.encode()).hexdigest()[:length]


def _timestamp(value: Any) -> Optional[float]:
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


class InMemoryWeaveTraceServer:
    """The trace server a Weave client talks to, in this process.

    Keeps the ops and files the client publishes (by digest, so references resolve) and pairs the start and end of
    each call: a call whose start and end both arrived is finished and waits in :meth:`pop_finished`. The client
    sends from background threads, and may send a call's end before its start; every method is thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: Dict[str, Any] = {}
        self._ends: Dict[str, Any] = {}
        self._finished: List[Tuple[Any, Any]] = []
        self.objects: Dict[str, Any] = {}
        self.files: Dict[str, bytes] = {}

    def call_start(self, req: Any) -> Any:
        """Record the start of a call."""
        start = _field(req, "start")
        call_id = self._arrived(self._starts, start)
        return CallStartResponse(id=call_id, trace_id=str(_field(start, "trace_id")))

    def call_end(self, req: Any) -> None:
        """Record the end of a call; the call is finished once its start is known too."""
        self._arrived(self._ends, _field(req, "end"))

    def _arrived(self, records: Dict[str, Any], record: Any) -> str:
        """Keep the start or end ``record`` of a call in ``records``; a call with both is finished. Returns its id."""
        call_id = str(_field(record, "id"))
        with self._lock:
            records[call_id] = record
            if call_id in self._starts and call_id in self._ends:
                self._finished.append((self._starts.pop(call_id), self._ends.pop(call_id)))
        return call_id

    def pop_finished(self) -> List[Tuple[Any, Any]]:
        """The ``(start, end)`` records of the calls finished since the last call, in the order they finished."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def obj_create(self, req: Any) -> Any:
        """Keep a published object (an op, a dataset...) under the digest of its value."""
        obj = _field(req, "obj")
        payload = json.dumps(_field(obj, "val"), sort_keys=True, default=str).encode()
        digest = hashlib.sha256(payload).hexdigest()
        with self._lock:
            self.objects[digest] = obj
        return ObjectCreateResponse(digest=digest, object_id=_field(obj, "object_id"))

    def file_create(self, req: Any) -> Any:
        """Keep a published file (an op's source code) under its digest."""
        file_field = _field(req, "file")
        content = file_field[1] if isinstance(file_field, (tuple, list)) else _field(req, "content")
        data = content if isinstance(content, bytes) else str(content).encode()
        digest = _field(req, "expected_digest") or hashlib.sha256(data).hexdigest()
        with self._lock:
            self.files[str(digest)] = data
        return FileCreateResponse(digest=str(digest))


class WeaveSpanRecordingContext:
    """Handle on a Weave call opened by :meth:`WeaveTracer.operation_context`.

    What is recorded here is applied to the call's span when the call is converted.
    """

    def __init__(self, name: str, call: Any, recorded: Dict[str, Any], attributes: Optional[Attributes]) -> None:
        self._name = name
        self._call = call
        self._recorded = recorded
        self._recorded.setdefault("attributes", dict(attributes or {}))
        self._start = time.time()
        self._end: Optional[float] = None

    def record_exception(self, exception: BaseException) -> None:
        """Mark the span failed with the exception's message."""
        self.record_status("ERROR", str(exception))
        self.record_attributes({"exception.type": type(exception).__name__, "exception.message": str(exception)})

    def record_attributes(self, attributes: Attributes) -> None:
        """Add or overwrite attributes."""
        self._recorded["attributes"].update(attributes)

    def record_status(self, status_code: StatusCode, description: Optional[str] = None) -> None:
        """Set the span status."""
        self._recorded["status"] = TraceStatus(status_code=status_code, description=description)

    def get_weave_call(self) -> Any:
        """The underlying Weave call."""
        return self._call

    def get_recorded_span(self) -> SpanCoreFields:
        """The span's core fields (``end_time`` is None while it is open)."""
        return SpanCoreFields(
            name=self._name,
            attributes=dict(self._recorded["attributes"]),
            status=self._recorded.get("status", TraceStatus(status_code="OK")),
            start_time=self._start,
            end_time=self._end,
        )

    def _finalize(self) -> None:
        self._end = time.time()


class WeaveTracer(Tracer):
    """Tracer built on the Weave SDK: every finished Weave call of a trace context becomes a stored span.

    Args:
        project_name: Weave project the calls are logged under (default: :func:`random_project_name`).
        weave_user_settings: Weave settings applied when the worker starts (default: no server cache, which only
            matters for a remote server).
        instrument_managed: Accepted for compatibility: the tracer always installs its own in-memory Weave client.
    """

    def __init__(
        self,
        *,
        project_name: Optional[str] = None,
        weave_user_settings: Optional[UserSettings] = None,
        instrument_managed: bool = True,
    ) -> None:
        super().__init__()
        self.project_name = project_name or random_project_name()
        self.weave_user_settings = weave_user_settings or UserSettings(use_server_cache=False)
        self.instrument_managed = instrument_managed
        if not instrument_managed:
            logger.warning(
                "WeaveTracer always installs its in-memory Weave client; instrument_managed=False is ignored."
            )
        self.trace_server = InMemoryWeaveTraceServer()
        self._client: Optional[Any] = None
        self._last_trace: List[Span] = []
        self._recorded: Dict[str, Dict[str, Any]] = {}  # call id -> attributes/status recorded by operation_context

    # ---- lifecycle ----

    def init_worker(self, worker_id: int, store: Optional[LightningStore] = None) -> None:
        """Install a Weave client that logs to this tracer's in-memory trace server.

        Raises:
            RuntimeError: Weave could not be initialised.
        """
        super().init_worker(worker_id, store)
        if self._client is not None:
            weave_client_context.set_weave_client_global(self._client)
            return
        try:
            parse_and_apply_settings(self.weave_user_settings)
            entity, _, project = self.project_name.rpartition("/")
            # The in-memory server implements the part of Weave's server interface that tracing uses.
            server: Any = self.trace_server
            client = weave_client.WeaveClient(entity or _ENTITY, project, server, ensure_project_exists=False)
            weave_client_context.set_weave_client_global(client)
        except Exception as exc:
            raise RuntimeError(f"Could not initialise Weave for project {self.project_name!r}: {exc}") from exc
        self._client = client

    def teardown_worker(self, worker_id: int) -> None:
        """Flush the Weave client and uninstall it."""
        super().teardown_worker(worker_id)
        if self._client is not None:
            self._client.flush()
            if weave_client_context.get_weave_client() is self._client:
                weave_client_context.set_weave_client_global(None)
            self._client = None

    def _require_client(self) -> Any:
        if self._client is None:
            raise RuntimeError("WeaveTracer is not initialized: call init_worker() first.")
        return self._client

    # ---- trace contexts ----

    def trace_context(self, name: Optional[str] = None, **kwargs: Any) -> AsyncContextManager[Any]:
        """:meth:`Tracer.trace_context` (keywords ``store``, ``rollout_id``, ``attempt_id``; others are ignored).

        The block is recorded under one root Weave call (named ``name``, default: the project name) and every call
        that finished in it is stored. Yields the Weave client.
        """
        return super().trace_context(
            name, store=kwargs.get("store"), rollout_id=kwargs.get("rollout_id"), attempt_id=kwargs.get("attempt_id")
        )

    def _open_root(self, name: Optional[str], rollout_id: Optional[str], attempt_id: Optional[str]) -> Any:
        client = self._require_client()
        self._check_ids(rollout_id, attempt_id)
        self.trace_server.pop_finished()  # calls made outside a trace context belong to no rollout
        inputs = {"rollout_id": rollout_id, "attempt_id": attempt_id} if rollout_id is not None else {}
        return client.create_call(name or self.project_name.rsplit("/", 1)[-1], inputs)

    @asynccontextmanager
    async def _trace(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> AsyncIterator[Any]:
        root = self._open_root(name, rollout_id, attempt_id)
        try:
            with self._finishing(root):
                yield self._client
        finally:
            await asyncio.to_thread(self._require_client().flush)
            await self._store_finished(store, rollout_id, attempt_id)

    @contextmanager
    def _trace_sync(
        self, name: Optional[str], store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> Iterator[Any]:
        root = self._open_root(name, rollout_id, attempt_id)
        try:
            with self._finishing(root):
                yield self._client
        finally:
            self._require_client().flush()
            asyncio.run(self._store_finished(store, rollout_id, attempt_id))

    @contextmanager
    def _finishing(self, root: Any) -> Iterator[None]:
        """Finish the root call when the block exits, with the block's exception if it raised one."""
        try:
            yield
        except BaseException as exc:
            self._require_client().finish_call(root, exception=exc)
            raise
        self._require_client().finish_call(root, exception=None)

    async def _store_finished(
        self, store: Optional[LightningStore], rollout_id: Optional[str], attempt_id: Optional[str]
    ) -> None:
        finished = sorted(
            self.trace_server.pop_finished(), key=lambda pair: _timestamp(_field(pair[1], "ended_at")) or 0
        )
        spans: List[Span] = []
        bound = store is not None and rollout_id is not None and attempt_id is not None
        for index, (start, end) in enumerate(finished):
            rid, aid = rollout_id or "rollout-dummy", attempt_id or "attempt-dummy"
            if bound:
                assert store is not None and rollout_id is not None and attempt_id is not None
                sequence_id = await store.get_next_span_sequence_id(rollout_id, attempt_id)
            else:
                sequence_id = index
            span = self._call_to_span(start, end, rid, aid, sequence_id)
            if bound:
                assert store is not None
                await store.add_span(span)
            spans.append(span)
        self._last_trace = spans

    def _call_to_span(self, start: Any, end: Any, rollout_id: str, attempt_id: str, sequence_id: int) -> Span:
        call_id = str(_field(start, "id"))
        recorded = self._recorded.pop(call_id, {})
        op_name = str(_field(start, "op_name") or "")
        name = op_name_to_func_name(op_name)
        attributes: Dict[str, Any] = {
            LightningSpanAttributes.OPERATION_NAME.value: _field(start, "display_name") or name
        }
        attributes.update(flatten_attributes(dict(_field(start, "attributes") or {})))
        attributes.update(flatten_attributes({LightningSpanAttributes.OPERATION_INPUT.value: _field(start, "inputs")}))
        output = _field(end, "output")
        if output is not None:
            attributes.update(flatten_attributes({LightningSpanAttributes.OPERATION_OUTPUT.value: output}))
        summary = _field(end, "summary")
        if summary:
            attributes.update(flatten_attributes({_SUMMARY_KEY: summary}))
        status = TraceStatus(status_code="OK")
        exception = _field(end, "exception")
        if exception:
            try:
                details = json.loads(exception)
            except (TypeError, ValueError):
                details = {"message": str(exception)}
            message = str(details.get("message", exception)) if isinstance(details, dict) else str(exception)
            if isinstance(details, dict) and details.get("type"):
                attributes["exception.type"] = str(details["type"])
            attributes["exception.message"] = message
            status = TraceStatus(status_code="ERROR", description=message)
        attributes.update(recorded.get("attributes", {}))
        status = recorded.get("status", status)

        trace_id = _hex_id(str(_field(start, "trace_id")), 32)
        span_id = _hex_id(call_id, 16)
        parent = _field(start, "parent_id")
        parent_id = _hex_id(str(parent), 16) if parent else None
        return Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            trace_id=trace_id,
            span_id=span_id,
            parent_id=parent_id,
            name=name,
            status=status,
            attributes=sanitize_attributes({k: v for k, v in attributes.items() if v is not None}),
            events=[],
            links=[],
            start_time=_timestamp(_field(start, "started_at")),
            end_time=_timestamp(_field(end, "ended_at")),
            context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
            parent=SpanContext(trace_id=trace_id, span_id=parent_id, is_remote=False, trace_state={})
            if parent_id
            else None,
            resource=OtelResource(
                attributes={
                    LightningResourceAttributes.ROLLOUT_ID.value: rollout_id,
                    LightningResourceAttributes.ATTEMPT_ID.value: attempt_id,
                    LightningResourceAttributes.SPAN_SEQUENCE_ID.value: sequence_id,
                    LightningResourceAttributes.TRACER_NAME.value: "weave",
                },
                schema_url="",
            ),
        )

    def get_last_trace(self) -> List[Span]:
        """Spans of the most recent trace context, in the order their calls finished."""
        return list(self._last_trace)

    # ---- spans recorded by hand (emitters) ----

    def _record_instant_span(
        self, name: str, attributes: Attributes, timestamp: Optional[float], status: TraceStatus
    ) -> Tuple[float, Attributes]:
        """Record a finished Weave call (a child of the current call, if any); ``timestamp`` is ignored."""
        client = self._require_client()
        if timestamp is not None:
            logger.warning("WeaveTracer.create_span ignores timestamp; Weave records the time of the call.")
        call = client.create_call(name, {}, attributes=dict(attributes))
        self._recorded[str(call.id)] = {"attributes": dict(attributes), "status": status}
        client.finish_call(call)
        return time.time(), attributes

    @contextmanager
    def _open_operation(
        self, name: str, attributes: Optional[Attributes], start_time: Optional[float], end_time: Optional[float]
    ) -> Iterator[WeaveSpanRecordingContext]:
        """Record a Weave call as the current call; ``start_time`` and ``end_time`` are ignored."""
        if start_time is not None or end_time is not None:
            logger.warning("WeaveTracer.operation_context ignores start_time/end_time; Weave times the call itself.")
        client = self._require_client()
        call = client.create_call(name, {}, attributes=dict(attributes or {}))
        recorded: Dict[str, Any] = {}
        self._recorded[str(call.id)] = recorded
        recording = WeaveSpanRecordingContext(name, call, recorded, attributes)
        error: Optional[BaseException] = None
        try:
            yield recording
        except BaseException as exc:
            error = exc
            raise
        finally:
            recording._finalize()
            client.finish_call(call, exception=error)
