"""Build trainer components from instances, classes, factories, import paths or dicts."""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Type, TypeVar, Union

__all__ = ["OptionalDefaults", "build_component", "instantiate_component", "instantiate_from_spec", "load_class"]

T = TypeVar("T")

OptionalDefaults = Mapping[str, Union[Any, Callable[[], Any]]]
"""Keyword arguments given to a component's constructor when it accepts them and the user did not set them.
Callables are called to produce the value."""


def load_class(path: str) -> Any:
    """Import ``"package.module.Name"`` and return ``Name``."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{path!r} is not a full import path such as 'package.module.ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"Cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"Module {module_name!r} has no attribute {attribute!r}") from None


def _init_parameters(cls: Any) -> Optional[Dict[str, inspect.Parameter]]:
    try:
        params = dict(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return None
    params.pop("self", None)
    return params


def instantiate_component(
    cls: Type[T], provided_kwargs: Optional[Dict[str, Any]] = None, optional_defaults: Optional[OptionalDefaults] = None
) -> T:
    """Instantiate ``cls`` with ``provided_kwargs`` plus the optional defaults its constructor accepts."""
    kwargs = dict(provided_kwargs or {})
    params = _init_parameters(cls)
    for name, default in (optional_defaults or {}).items():
        if name in kwargs or params is None or name not in params:
            continue
        kwargs[name] = default() if callable(default) else default
    return cls(**kwargs)


def instantiate_from_spec(
    spec: Union[str, Dict[str, Any]],
    *,
    spec_name: str,
    optional_defaults: Optional[OptionalDefaults] = None,
    dict_requires_type: bool = True,
    dict_default_cls: Optional[Type[Any]] = None,
    registry: Optional[Mapping[str, str]] = None,
) -> Any:
    """Instantiate from an import path / registry key, or from a dict with a ``"type"`` key and kwargs."""
    if isinstance(spec, str):
        if registry and spec not in registry and "." not in spec:
            known = ", ".join(repr(key) for key in registry)
            raise ValueError(f"Unknown {spec_name} {spec!r}: use one of {known} or a full import path.")
        path = registry.get(spec, spec) if registry else spec
        return instantiate_component(load_class(path), None, optional_defaults)
    if isinstance(spec, dict):
        kwargs = dict(spec)
        type_spec = kwargs.pop("type", None)
        if type_spec is None and registry is not None and "name" in kwargs and kwargs["name"] in registry:
            type_spec = kwargs.pop("name")
        if type_spec is None:
            if dict_requires_type:
                raise ValueError(f"{spec_name} dict must have a 'type' key with the class full name")
            if dict_default_cls is None:
                raise ValueError(f"{spec_name} dict has no 'type' key and no default class is available")
            cls: Any = dict_default_cls
        elif isinstance(type_spec, str):
            cls = load_class(registry.get(type_spec, type_spec) if registry else type_spec)
        elif inspect.isclass(type_spec):
            cls = type_spec
        else:
            raise ValueError(
                f"{spec_name} dict 'type' must be a class or its import path, got {type(type_spec)}: {type_spec!r}"
            )
        return instantiate_component(cls, kwargs, optional_defaults)
    raise TypeError(f"{spec_name} spec must be a str or a dict, got {type(spec).__name__}")


def build_component(
    spec: Any,
    *,
    expected_type: Type[T],
    spec_name: str,
    default_factory: Optional[Callable[[], T]] = None,
    allow_none: bool = False,
    optional_defaults: Optional[OptionalDefaults] = None,
    dict_requires_type: bool = True,
    dict_default_cls: Optional[Type[Any]] = None,
    type_error_fmt: Optional[str] = None,
    invalid_spec_error_fmt: Optional[str] = None,
    registry: Optional[Mapping[str, str]] = None,
) -> Optional[T]:
    """Turn a user's component spec into an instance of ``expected_type``.

    Accepts an instance (returned as is), a subclass (instantiated with the optional defaults it accepts), a zero-
    argument factory, an import path or registry key, a ``{"type": ..., **kwargs}`` dict, or ``None`` (default
    factory, or ``None`` when ``allow_none``).

    A factory is a function, method or ``functools.partial``: other callable objects (an agent, an algorithm given
    in the wrong place) are rejected, not called.

    Raises:
        ValueError: The spec is of none of these kinds; the message names its type (the class itself for a class).
        TypeError: The spec produced an object that is not an ``expected_type``.
    """

    def check(obj: Any) -> T:
        if not isinstance(obj, expected_type):
            if type_error_fmt:
                raise TypeError(type_error_fmt.format(type_name=str(type(obj)), expected_type=expected_type.__name__))
            raise TypeError(
                f"{spec_name} factory returned {type(obj)}, which is not a {expected_type.__name__} subclass."
            )
        return obj

    def invalid() -> ValueError:
        actual_type = spec if inspect.isclass(spec) else type(spec)
        if invalid_spec_error_fmt:
            return ValueError(
                invalid_spec_error_fmt.format(actual_type=actual_type, expected_type=expected_type.__name__)
            )
        return ValueError(
            f"Invalid {spec_name} type: {actual_type}. Expected {expected_type.__name__}, str, dict, or None."
        )

    if isinstance(spec, expected_type):
        return spec
    if spec is None:
        if default_factory is not None:
            return check(default_factory())
        if allow_none:
            return None
        if invalid_spec_error_fmt:
            raise invalid()
        raise ValueError(f"{spec_name} cannot be None.")
    if inspect.isclass(spec):
        if issubclass(spec, expected_type):
            return check(instantiate_component(spec, None, optional_defaults))
        raise invalid()
    if isinstance(spec, (str, dict)):
        return check(
            instantiate_from_spec(
                spec,
                spec_name=spec_name,
                optional_defaults=optional_defaults,
                dict_requires_type=dict_requires_type,
                dict_default_cls=dict_default_cls,
                registry=registry,
            )
        )
    if inspect.isroutine(spec) or isinstance(spec, functools.partial):
        return check(spec())
    raise invalid()
