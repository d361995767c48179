"""Build a command line from the ``__init__`` signatures of component classes.

``lightning_cli(Trainer, MyAgent)`` adds one option per constructor parameter (``--trainer.n-runners``,
``--myagent.model`` ...), parses ``sys.argv`` and returns the instances.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any, Dict, List, Optional, Tuple, Type, TypeVar, Union, get_args, get_origin, get_type_hints

from agentbolt.env_var import parse_bool_word

__all__ = ["lightning_cli"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_NULL_WORDS = {"none", "null", "~", "nil"}
_TRUE_WORDS = {"yes", "true", "t", "y", "1"}
_FALSE_WORDS = {"no", "false", "f", "n", "0"}


def nullable_str(value: str) -> Optional[str]:
    """``None`` for ``none``/``null``/``~``/``nil`` (any case), else the string."""
    return None if value.strip().lower() in _NULL_WORDS else value


def _nullable_number(value: str, parse: Callable[[str], T], kind: str) -> Optional[T]:
    """``None`` for null words, else ``parse(value)``; a ``ValueError`` becomes an argparse error naming ``kind``."""
    if value.strip().lower() in _NULL_WORDS:
        return None
    try:
        return parse(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {kind} value: {value!r}") from None


def nullable_int(value: str) -> Optional[int]:
    """``None`` for null words, else an int.

    Raises:
        argparse.ArgumentTypeError: Not an integer.
    """
    return _nullable_number(value, int, "integer")


def nullable_float(value: str) -> Optional[float]:
    """``None`` for null words, else a float.

    Raises:
        argparse.ArgumentTypeError: Not a number.
    """
    return _nullable_number(value, float, "float")


def _str_to_bool(value: Union[str, bool]) -> bool:
    """Parse a boolean command-line value (yes/true/t/y/1, no/false/f/n/0).

    Raises:
        argparse.ArgumentTypeError: Not a boolean word.
    """
    if isinstance(value, bool):
        return value
    parsed = parse_bool_word(value, _TRUE_WORDS, _FALSE_WORDS)
    if parsed is not None:
        return parsed
    raise argparse.ArgumentTypeError(f"Boolean value expected, got {value!r}.")


def _get_param_type_details(annotation: Any) -> Tuple[Any, bool, bool]:
    """Split an annotation into ``(core_type, is_optional, is_list)``; ``Optional[T]`` is unwrapped first."""
    core = annotation
    is_optional = False
    if get_origin(annotation) is Union or type(annotation).__name__ == "UnionType":
        args = get_args(annotation)
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and len(non_none) < len(args):
            core = non_none[0]
            is_optional = True
    is_list = core is list or get_origin(core) in (list, List)
    return core, is_optional, is_list


def _determine_argparse_type(annotation: Any) -> Any:
    """The argparse ``type`` callable for an annotation."""
    core, is_optional, _ = _get_param_type_details(annotation)
    if is_optional:
        nullable = {str: nullable_str, int: nullable_int, float: nullable_float}.get(core)
        if nullable is not None:
            return nullable
    if core is bool:
        return _str_to_bool
    if core in (int, float, str):
        return core
    return str


def _determine_argparse_type_and_nargs(core_type: Any, is_list: bool) -> Dict[str, Any]:
    """argparse keyword arguments for the value type (``nargs="*"`` for lists)."""
    if is_list:
        item_args = get_args(core_type)
        item_type = _determine_argparse_type(item_args[0]) if item_args else str
        return {"nargs": "*", "type": item_type}
    return {"type": _determine_argparse_type(core_type)}


def _type_display_name(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "Any"
    core, is_optional, _ = _get_param_type_details(annotation)
    name = getattr(core, "__name__", None) or str(core)
    return f"Optional[{name}]" if is_optional else name


def _build_help_string(cls_name: str, param_name: str, core_type: Any, is_optional: bool, is_list: bool) -> str:
    """Help text of one option: class, parameter and inferred type."""
    if core_type is inspect.Parameter.empty:
        type_name = "Any"
    elif is_list:
        item_args = get_args(core_type)
        type_name = f"List[{_type_display_name(item_args[0])}]" if item_args else "List[str]"
    else:
        type_name = getattr(core_type, "__name__", None) or str(core_type)
    if is_optional:
        type_name = f"Optional[{type_name}]"
    return f"For {cls_name}: '{param_name}'. Inferred type: {type_name}."


def _add_argument_for_parameter(
    parser: argparse.ArgumentParser,
    cls: type,
    param_name: str,
    param_obj: inspect.Parameter,
    dest_name: str,
    resolved_param_annotation: Any = None,
) -> None:
    """Add the ``--{class}.{param}`` option for one constructor parameter."""
    annotation = resolved_param_annotation if resolved_param_annotation is not None else param_obj.annotation
    core, is_optional, is_list = (
        _get_param_type_details(annotation)
        if annotation is not inspect.Parameter.empty
        else (inspect.Parameter.empty, False, False)
    )
    kwargs: Dict[str, Any] = {"dest": dest_name}
    if annotation is not inspect.Parameter.empty:
        kwargs.update(_determine_argparse_type_and_nargs(core, is_list))
        if is_optional and not is_list and core in (str, int, float):
            kwargs["type"] = _determine_argparse_type(annotation)
    if param_obj.default is not inspect.Parameter.empty:
        kwargs["default"] = param_obj.default
    elif is_optional:
        kwargs["default"] = None
    else:
        kwargs["required"] = True
    kwargs["help"] = _build_help_string(cls.__name__, param_name, core, is_optional, is_list)
    option = f"--{cls.__name__.lower()}.{param_name.replace('_', '-')}"
    parser.add_argument(option, **kwargs)


def _add_arguments_for_class(
    parser: argparse.ArgumentParser, cls: type, class_arg_configs_maps: Dict[type, Dict[str, str]]
) -> None:
    """Add options for every ``__init__`` parameter of ``cls``; records ``param -> dest`` in the map."""
    init = cls.__init__  # type: ignore[misc]
    signature = inspect.signature(init)
    try:
        hints = get_type_hints(init)
    except Exception as exc:
        logger.warning("Cannot resolve type hints of %s.__init__ (%s); using raw annotations.", cls.__name__, exc)
        hints = {}
    mapping: Dict[str, str] = {}
    for name, param in signature.parameters.items():
        if name == "self" or param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        dest = f"{cls.__name__.lower()}_{name}"
        _add_argument_for_parameter(parser, cls, name, param, dest, hints.get(name))
        mapping[name] = dest
    class_arg_configs_maps[cls] = mapping


def _create_argument_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        description="CLI configurator for application components.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


def _instantiate_classes(
    parsed_args: argparse.Namespace, classes: Tuple[type, ...], class_arg_configs_maps: Dict[type, Dict[str, str]]
) -> Tuple[Any, ...]:
    """Instantiate each class with its parsed options."""
    instances: List[Any] = []
    for cls in classes:
        kwargs = {param: getattr(parsed_args, dest) for param, dest in class_arg_configs_maps.get(cls, {}).items()}
        try:
            instances.append(cls(**kwargs))
        except Exception:
            logger.exception("Failed to instantiate %s with %s", cls.__name__, kwargs)
            raise
    return tuple(instances)


def _check_classes(classes: Tuple[Any, ...]) -> None:
    """Raise unless every item is a class and no two classes map to the same ``--{name}.`` option prefix."""
    seen: Dict[str, type] = {}
    for cls in classes:
        if not inspect.isclass(cls):
            raise TypeError(f"lightning_cli expects classes, got {type(cls).__name__} {cls!r}")
        prefix = cls.__name__.lower()
        if prefix in seen:
            raise ValueError(
                f"lightning_cli got {seen[prefix].__qualname__} and {cls.__qualname__}, which share the option "
                f"prefix --{prefix}.; pass each class once, and rename one of two classes with the same name"
            )
        seen[prefix] = cls


def lightning_cli(*classes: Type[Any]) -> Any:
    """Parse ``sys.argv`` into instances of the given classes.

    Args:
        *classes: The component classes.

    Returns:
        The instance for one class, a tuple of instances for several, ``()`` for none.

    Raises:
        TypeError: If an argument is not a class.
        ValueError: If two classes share an option prefix (the same lower-cased name).
    """
    _check_classes(classes)
    parser = _create_argument_parser()
    maps: Dict[type, Dict[str, str]] = {}
    for cls in classes:
        _add_arguments_for_class(parser, cls, maps)
    parsed = parser.parse_args(sys.argv[1:])
    instances = _instantiate_classes(parsed, tuple(classes), maps)
    if len(instances) == 1:
        return instances[0]
    return instances
