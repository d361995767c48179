"""Argument checks shared by constructors and public functions: one message for each rule."""

from __future__ import annotations

import math
import typing
from typing import Any, Callable, List, Optional, Sequence

__all__ = [
    "check_bool",
    "check_choices",
    "check_count",
    "check_finite",
    "check_list_of",
    "check_list_of_str",
    "check_port",
    "check_positive",
]


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is ``True`` or ``False``; a truthy string such as ``"no"`` is refused, not read as true.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_count(value: Any, name: str, *, minimum: int = 1, optional: bool = False) -> Optional[int]:
    """``value`` if it is an integer of at least ``minimum`` (or None when ``optional``).

    Raises:
        TypeError: ``value`` is not an integer (a bool is not one).
        ValueError: ``value`` is below ``minimum``.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        expected = "an integer or None" if optional else "an integer"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}{' (or None)' if optional else ''}, got {value}")
    return value


def check_port(value: Any, name: str = "port") -> Optional[int]:
    """``value`` if it is None or a TCP port number (0 asks the system for a free port).

    Raises:
        TypeError: ``value`` is not an integer.
        ValueError: ``value`` is outside 0-65535.
    """
    if check_count(value, name, minimum=0, optional=True) is not None and value > 65535:
        raise ValueError(f"{name} must be at most 65535, got {value}")
    return value


def check_finite(value: Any, name: str, *, minimum: Optional[float] = None, optional: bool = False) -> Optional[float]:
    """``value`` if it is a finite number, at least ``minimum`` when given (or None when ``optional``).

    Raises:
        TypeError: ``value`` is not a number (a bool is not one).
        ValueError: ``value`` is NaN, infinite (an integer too large for a float counts as infinite) or below
            ``minimum``.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number{' or None' if optional else ''}, got {type(value).__name__} {value!r}"
        )
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond the float range
        finite = False
    if not finite:
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
    return value


def check_positive(value: Any, name: str) -> float:
    """``value`` if it is a finite number greater than 0.

    Raises:
        TypeError: ``value`` is not a number (a bool is not one).
        ValueError: ``value`` is NaN, infinite, 0 or negative.
    """
    if check_finite(value, name) <= 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be greater than 0, got {value!r}")
    return value


def check_list_of(value: Any, name: str, accepts: Callable[[Any], bool], expected: str) -> List[Any]:
    """``value`` as a list if it is a sequence of items that ``accepts`` takes.

    A lone item (or string) is refused, not read as a sequence: character by character, or field by field.

    Raises:
        TypeError: ``value`` is one item or a string, not iterable, or holds an item ``accepts`` refuses; the message
            names ``name`` and the ``expected`` items.
    """
    if isinstance(value, (str, bytes)) or accepts(value):
        raise TypeError(f"{name} must be a list of {expected}, got one {type(value).__name__} (wrap it in a list)")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a list of {expected}, got {type(value).__name__}") from None
    for item in items:
        if not accepts(item):
            raise TypeError(f"{name} must be a list of {expected}, got an item of type {type(item).__name__}")
    return items


def check_list_of_str(value: Any, name: str) -> List[str]:
    """``value`` as a list if it is a sequence of strings (see :func:`check_list_of`)."""
    return check_list_of(value, name, lambda item: isinstance(item, str), "strings")


def check_choices(values: Optional[Sequence[Any]], name: str, allowed: Optional[Any] = None) -> Optional[List[Any]]:
    """``values`` as a list of strings, each among the ``Literal`` type ``allowed`` when given; ``None`` stays ``None``.

    Raises:
        TypeError: ``values`` is a lone string or holds something other than strings.
        ValueError: A value is not among ``allowed``.
    """
    if values is None:
        return None
    listed = check_list_of_str(values, name)
    if allowed is not None:
        choices = typing.get_args(allowed)
        for value in listed:
            if value not in choices:
                raise ValueError(f"{name} holds {value!r}, which is not one of {', '.join(choices)}")
    return listed
