"""Annotations (arbitrary key/values attached to the trace) and operations (spans around a block or a function)."""

from __future__ import annotations

import functools
import inspect
import logging
from types import TracebackType
from typing import Any, Callable, Dict, Generator, List, Optional, Type, TypeVar, Union, overload

from pydantic import BaseModel

from agentbolt.semconv import AGL_ANNOTATION, AGL_OPERATION, LightningSpanAttributes
from agentbolt.tracer.base import Tracer, get_active_tracer
from agentbolt.tracer.dummy import DummyTracer
from agentbolt.types.tracer import Attributes, SpanCoreFields, SpanRecordingContext
from agentbolt.utils.otel import check_attributes_sanity, flatten_attributes, sanitize_attributes

__all__ = ["emit_annotation", "operation", "OperationContext"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_INPUT = LightningSpanAttributes.OPERATION_INPUT.value
_OUTPUT = LightningSpanAttributes.OPERATION_OUTPUT.value
_NAME = LightningSpanAttributes.OPERATION_NAME.value


def resolve_tracer(propagate: bool, what: str, getter: Callable[[], Optional[Tracer]]) -> Tracer:
    """The tracer an emitter should use.

    Args:
        propagate: Use the active tracer (True) or a throw-away :class:`DummyTracer` that records nothing (False).
        what: What is being emitted, for the error message.
        getter: The active-tracer lookup of the calling module.

    Raises:
        RuntimeError: ``propagate`` is True and no tracer is active.
    """
    if not propagate:
        return DummyTracer()
    tracer = getter()
    if tracer is None:
        raise RuntimeError(
            f"No active tracer found. Cannot emit {what}: run the agent inside a tracer's trace_context() "
            "(runners do this), or pass propagate=False. While several rollouts are traced in this process, a "
            "thread the agent starts sees its trace context only if started with asyncio.to_thread() or "
            "contextvars.copy_context().run()."
        )
    return tracer


def to_attributes(value: Any, prefix: str) -> Attributes:
    """Flatten ``value`` under ``prefix`` and sanitise it into span attributes (pydantic models are dumped)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return sanitize_attributes(flatten_attributes({prefix: value} if prefix else value))


def emit_span(
    name: str, what: str, own_attributes: Attributes, extra_attributes: Optional[Dict[str, Any]], propagate: bool
) -> SpanCoreFields:
    """Record an instantaneous span (status OK) carrying an emitter's attributes over the caller's extra ones.

    Args:
        name: Span name.
        what: What is being emitted, for the error message.
        own_attributes: The emitter's span attributes; they win over extra attributes of the same key.
        extra_attributes: The caller's extra attributes (nested values are flattened).
        propagate: Send the span to the active tracer; False only builds the core fields.

    Returns:
        The span's core fields.

    Raises:
        RuntimeError: ``propagate`` is True and no tracer is active.
    """
    span_attributes = {**to_attributes(extra_attributes or {}, ""), **own_attributes}
    tracer = resolve_tracer(propagate, what, get_active_tracer)
    return tracer.create_span(name=name, attributes=span_attributes)


def emit_annotation(annotation: Dict[str, Any], propagate: bool = True) -> SpanCoreFields:
    """Record an ``agentlightning.annotation`` span carrying ``annotation`` as (flattened) attributes.

    Args:
        annotation: Key/values; nested dicts and lists become dotted keys.
        propagate: Send the span to the active tracer; False only builds the core fields.

    Returns:
        The span's core fields.

    Raises:
        ValueError: The annotation cannot be expressed as span attributes (e.g. ``None`` values, mixed lists).
        RuntimeError: No active tracer (with ``propagate=True``).
    """
    flat = flatten_attributes(annotation)
    check_attributes_sanity(flat)
    return emit_span(AGL_ANNOTATION, "an annotation", sanitize_attributes(flat), None, propagate)


def _indexed(values: Any) -> Dict[str, Any]:
    """Positional values keyed by index, so they flatten to ``.<i>`` keys even when they are all primitives."""
    return {str(i): value for i, value in enumerate(values)}


def _argument_attributes(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Dict[str, Any]) -> Attributes:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        # The call does not match the signature (or it has none): record raw positions and names.
        return to_attributes({"args": _indexed(args), "kwargs": kwargs}, _INPUT)
    bound.apply_defaults()
    values: Dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        values[name] = _indexed(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
    return to_attributes(values, _INPUT)


class OperationContext:
    """An ``agentlightning.operation`` span, usable as a context manager or as a decorator.

    Args:
        name: Span name.
        attributes: Initial attributes (flattened).
        propagate: Use the active tracer (resolved now) or, when False, a :class:`DummyTracer`.

    Raises:
        RuntimeError: ``propagate`` is True and no tracer is active.
    """

    def __init__(self, name: str, attributes: Optional[Dict[str, Any]] = None, propagate: bool = True) -> None:
        self.name = name
        self.initial_attributes: Dict[str, Any] = flatten_attributes(attributes or {})
        self.propagate = propagate
        self.tracer = resolve_tracer(propagate, "an operation", get_active_tracer)
        self._context_manager: Any = None
        self._recording: Optional[SpanRecordingContext] = None
        self._span: Optional[SpanCoreFields] = None

    # ---- context manager ----

    def __enter__(self) -> OperationContext:
        self._context_manager = self.tracer.operation_context(self.name, sanitize_attributes(self.initial_attributes))
        self._recording = self._context_manager.__enter__()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> Optional[bool]:
        assert self._context_manager is not None and self._recording is not None
        try:
            return self._context_manager.__exit__(exc_type, exc, tb)
        finally:
            self._span = self._recording.get_recorded_span()
            self._context_manager = None
            self._recording = None

    def _require_open(self) -> SpanRecordingContext:
        if self._recording is None:
            raise RuntimeError("The operation is not open: use it inside a `with` block.")
        return self._recording

    def set_input(self, *args: Any, **kwargs: Any) -> None:
        """Record inputs: positional ones under ``...input.args.<i>``, keyword ones under ``...input.<name>``."""
        recording = self._require_open()
        values: Dict[str, Any] = dict(kwargs)
        if args:
            values["args"] = _indexed(args)
        recording.record_attributes(to_attributes(values, _INPUT))

    def set_output(self, output: Any) -> None:
        """Record the output under ``agentlightning.operation.output``."""
        self._require_open().record_attributes(to_attributes(output, _OUTPUT))

    def span(self) -> SpanCoreFields:
        """The finished span.

        Raises:
            RuntimeError: The block has not exited yet.
        """
        if self._span is None:
            raise RuntimeError("Span is not ready yet.")
        return self._span

    # ---- decorator ----

    def __call__(self, fn: F) -> F:
        """Wrap ``fn`` so that each call records an operation span with its arguments and return value."""
        return _wrap_function(fn, self.name, self.initial_attributes, self.propagate)


def _wrap_function(fn: F, span_name: str, attributes: Dict[str, Any], propagate: bool) -> F:
    def open_context(args: tuple[Any, ...], kwargs: Dict[str, Any]) -> OperationContext:
        context = OperationContext(span_name, {_NAME: getattr(fn, "__name__", repr(fn)), **attributes}, propagate)
        context.__enter__()
        assert context._recording is not None
        context._recording.record_attributes(_argument_attributes(fn, args, kwargs))
        return context

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator_wrapper(*args: Any, **kwargs: Any) -> Any:
            context = open_context(args, kwargs)  # when iteration starts: the span covers the body's run
            with _Closing(context):
                produced: List[Any] = []
                try:
                    return (yield from _recording_items(fn(*args, **kwargs), produced))
                finally:  # also when the caller stops early or the body fails: what it yielded so far
                    context.set_output(produced)

        return generator_wrapper  # type: ignore[return-value]

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def async_generator_wrapper(*args: Any, **kwargs: Any) -> Any:
            context = open_context(args, kwargs)
            with _Closing(context):
                produced: List[Any] = []
                generator = fn(*args, **kwargs)
                try:
                    item = await generator.__anext__()
                    while True:
                        produced.append(item)
                        try:
                            sent = yield item
                        except GeneratorExit:
                            await generator.aclose()
                            raise
                        except BaseException as exc:  # thrown in by the caller: hand it to the body
                            item = await generator.athrow(exc)
                        else:
                            item = await generator.asend(sent)
                except StopAsyncIteration:
                    pass
                finally:  # also when the caller stops early or the body fails: what it yielded so far
                    context.set_output(produced)

        return async_generator_wrapper  # type: ignore[return-value]

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            context = open_context(args, kwargs)
            with _Closing(context):
                result = await fn(*args, **kwargs)
                context.set_output(result)
                return result

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        context = open_context(args, kwargs)
        with _Closing(context):
            result = fn(*args, **kwargs)
            context.set_output(result)
            return result

    return wrapper  # type: ignore[return-value]


def _recording_items(generator: Generator[Any, Any, Any], produced: List[Any]) -> Generator[Any, Any, Any]:
    """Delegate to ``generator`` (values sent and exceptions thrown in included), appending each item it yields."""
    try:
        item = next(generator)
        while True:
            produced.append(item)
            try:
                sent = yield item
            except GeneratorExit:
                generator.close()
                raise
            except BaseException as exc:  # thrown in by the caller: hand it to the body
                item = generator.throw(exc)
            else:
                item = generator.send(sent)
    except StopIteration as stop:
        return stop.value


class _Closing:
    """Exit an already-entered :class:`OperationContext` when the block ends (recording any exception)."""

    def __init__(self, context: OperationContext) -> None:
        self._context = context

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> Optional[bool]:
        return self._context.__exit__(exc_type, exc, tb)


@overload
def operation(fn: F, *, propagate: bool = True, name: Optional[str] = None, **additional_attributes: Any) -> F: ...


@overload
def operation(
    fn: None = None, *, propagate: bool = True, name: Optional[str] = None, **additional_attributes: Any
) -> OperationContext: ...


def operation(
    fn: Optional[Callable[..., Any]] = None,
    *,
    propagate: bool = True,
    name: Optional[str] = None,
    **additional_attributes: Any,
) -> Union[Callable[..., Any], OperationContext]:
    """Trace an operation, as a decorator (``@operation``) or a context manager (``with operation(...) as op``).

    The span is named ``agentlightning.operation``; as a decorator it records the bound arguments under
    ``agentlightning.operation.input.<param>`` and the return value under ``agentlightning.operation.output``.

    Args:
        fn: The function to decorate (sync or async).
        propagate: Use the active tracer (False: record nothing).
        name: Operation name (``agentlightning.operation.name``); defaults to the function name when decorating.
        **additional_attributes: Extra attributes of the span.

    Returns:
        The wrapped function, or an :class:`OperationContext` when called without ``fn``.

    Raises:
        ValueError: ``fn`` is not callable, or ``name`` is given twice.
        RuntimeError: Used as a context manager with ``propagate=True`` and no active tracer.
    """
    attributes = dict(additional_attributes)
    if name is not None:
        if _NAME in attributes:
            raise ValueError(f"Pass the operation name either as `name` or as {_NAME!r}, not both.")
        attributes[_NAME] = name
    if fn is None:
        if _has_active_or_not_needed(propagate):
            return OperationContext(AGL_OPERATION, attributes, propagate)
        # As a decorator factory (`@operation(name=...)`) no tracer is needed until the function is called.
        return _DeferredOperation(attributes, propagate)
    if not callable(fn):
        raise ValueError(f"operation() expects a callable or keyword arguments, got {type(fn).__name__}.")
    return _wrap_function(fn, AGL_OPERATION, attributes, propagate)


def _has_active_or_not_needed(propagate: bool) -> bool:
    return not propagate or get_active_tracer() is not None


class _DeferredOperation:
    """``operation(...)`` created while no tracer is active: the tracer is resolved when it is used."""

    def __init__(self, attributes: Dict[str, Any], propagate: bool) -> None:
        self._attributes = attributes
        self._propagate = propagate
        self._context: Optional[OperationContext] = None

    def __call__(self, fn: F) -> F:
        return _wrap_function(fn, AGL_OPERATION, self._attributes, self._propagate)

    def __enter__(self) -> OperationContext:
        self._context = OperationContext(AGL_OPERATION, self._attributes, self._propagate)
        return self._context.__enter__()

    def __exit__(
        self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> Optional[bool]:
        assert self._context is not None
        return self._context.__exit__(exc_type, exc, tb)
