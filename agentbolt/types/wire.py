"""The base of the models agentbolt writes as JSON: into the store's files and tables, and over HTTP."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, TypeVar, Union

import pydantic_core
from pydantic import BaseModel, ConfigDict

__all__ = [
    "INF_NAN_MODE",
    "JSON_MAX_DEPTH",
    "NON_FINITE_FLOATS",
    "WIRE_CONFIG",
    "WireModel",
    "decode_json",
    "encode_json",
    "encode_json_repairing",
    "encode_repairing",
    "without_lone_surrogates",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

INF_NAN_MODE = "strings"
"""How non-finite floats are written as JSON (:func:`encode_json` writes plain values as :class:`WireModel` writes
models)."""

NON_FINITE_FLOATS: Dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""The strings :class:`WireModel` writes for non-finite floats, and the float each stands for."""

WIRE_CONFIG = ConfigDict(ser_json_inf_nan=INF_NAN_MODE)
"""Model configuration writing non-finite floats as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``."""


class WireModel(BaseModel):
    """A pydantic model whose JSON keeps non-finite floats.

    JSON has no NaN or infinity, and pydantic writes them as ``null`` by default: the value is lost and, in span
    attributes (where ``null`` is not allowed), the stored span could no longer be read. These models write them as
    the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, as the JSON forms of protobuf and OTLP do: a float field
    reads them back as the same float, and a free-form value (a task input, metadata, a span attribute) keeps the
    string. A JSON string never holds a float, so a store that keeps items in memory returns the float itself.
    """

    model_config = WIRE_CONFIG


JSON_MAX_DEPTH = 201
"""Deepest nesting of arrays and objects that pydantic's JSON parser (the client's and the server's) reads."""


def decode_json(data: Union[bytes, bytearray, str], *, headroom: int = 0) -> Any:
    """Decode JSON that the store wrote or received, keeping every integer exact.

    orjson, faster by about a third, reads an integer beyond 64 bits as a float (``2**70`` comes back as
    ``1.1805916207174113e+21``); a stored task input, metadata value or span attribute must come back as written. The
    bare tokens ``NaN`` and ``Infinity`` are refused, as JSON refuses them.

    Args:
        data: The JSON text.
        headroom: Refuse ``data`` nested deeper than :data:`JSON_MAX_DEPTH` minus this many levels. A server keeps
            what it accepts readable when its answers put the value this many levels deeper (a page of rollouts
            holds each task input three levels down). It costs no second parse: ``data`` is parsed inside
            ``headroom`` extra arrays.

    Raises:
        ValueError: ``data`` is not valid JSON (the message says where), or is nested too deep.
    """
    if headroom <= 0:
        return pydantic_core.from_json(data, allow_inf_nan=False)
    raw = data.encode() if isinstance(data, str) else bytes(data)
    try:
        value = pydantic_core.from_json(b"[" * headroom + raw + b"]" * headroom, allow_inf_nan=False)
    except ValueError as exc:
        if "recursion limit" in str(exc):
            raise ValueError(f"JSON nested more than {JSON_MAX_DEPTH - headroom} levels deep") from None
        value = None  # invalid: parsed again below, for the message of the text as sent
    for _ in range(headroom):
        if not (isinstance(value, list) and len(value) == 1):
            return pydantic_core.from_json(raw, allow_inf_nan=False)  # raises: the text is not one JSON value
        value = value[0]
    return value


def encode_json(value: Any) -> bytes:
    """Encode ``value`` (models, dicts, lists, scalars) as JSON the way :class:`WireModel` writes models: non-finite
    floats as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, integers of any size exact.

    Raises:
        pydantic_core.PydanticSerializationError: ``value`` holds something JSON cannot carry.
    """
    return pydantic_core.to_json(value, inf_nan_mode=INF_NAN_MODE)


def without_lone_surrogates(value: Any) -> Any:
    """``value`` with its strings (dict keys included, in nested dicts, lists, tuples, sets and pydantic models) made
    writable as JSON.

    A Python string may hold surrogate code points, which have no UTF-8 form: bytes decoded with
    ``errors="surrogateescape"`` produce them, and so does ``json.loads`` of a ``"\\ud83d"`` escape without its pair. JSON
    writers refuse such strings. Here a high and low surrogate that stand next to each other become the character
    they encode and every other surrogate becomes U+FFFD (the replacement character); all else is kept. Values
    without such strings come back unchanged (the same objects); a model with some comes back as a copy of its type,
    validated again.
    """
    if isinstance(value, str):
        if value.isascii():
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, dict):
        items = [(without_lone_surrogates(k), without_lone_surrogates(v)) for k, v in value.items()]
        if all(k is old_k and v is old_v for (k, v), (old_k, old_v) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, (list, tuple, set, frozenset)):
        cleaned = [without_lone_surrogates(item) for item in value]
        if all(new is old for new, old in zip(cleaned, value, strict=True)):
            return value
        if isinstance(value, list):
            return cleaned
        if hasattr(value, "_fields"):  # a named tuple takes its fields as arguments
            return type(value)(*cleaned)
        return type(value)(cleaned)
    if isinstance(value, BaseModel):
        fields = value.model_dump()
        repaired = without_lone_surrogates(fields)
        return value if repaired is fields else type(value).model_validate(repaired)
    return value


def encode_repairing(encode: Callable[[T], R], value: T, what: str) -> R:
    """``encode(value)``; when ``value`` holds lone surrogates, which have no UTF-8 form, ``encode`` of it repaired.

    The repair is :func:`without_lone_surrogates`' (U+FFFD in their place) and a warning naming ``what`` is logged;
    ``value`` itself is not changed. Used wherever a value must get through rather than be refused: requests and
    answers over HTTP (:func:`encode_json_repairing`), rows of the SQL stores.

    Raises:
        TypeError: ``value`` holds something JSON cannot carry (an object of a class of one's own, say); the message
            names ``what`` and the type.
        UnicodeEncodeError: ``value`` holds a string ``encode`` refuses for another reason.
    """
    try:
        return encode(value)
    except (UnicodeEncodeError, pydantic_core.PydanticSerializationError) as exc:
        repaired = without_lone_surrogates(value)
        if repaired is value:
            if isinstance(exc, pydantic_core.PydanticSerializationError):
                raise TypeError(f"{what} holds a value JSON cannot carry: {exc}") from exc
            raise
    try:
        encoded = encode(repaired)
    except pydantic_core.PydanticSerializationError as exc:  # something else too, besides the lone surrogates
        raise TypeError(f"{what} holds a value JSON cannot carry: {exc}") from exc
    logger.warning("%s held strings with lone surrogates, which UTF-8 cannot carry; wrote U+FFFD in their place", what)
    return encoded


def encode_json_repairing(value: Any) -> bytes:
    """Encode ``value`` like :func:`encode_json`, for a request or an answer that must get through.

    A value may hold strings no JSON can carry: lone surrogates (see :func:`without_lone_surrogates`), which a store
    keeping items in memory holds as they were written. Rather than failing the request or every read of such an
    item, the JSON carries U+FFFD in their place and a warning is logged (see :func:`encode_repairing`).

    Raises:
        TypeError: ``value`` holds something else JSON cannot carry.
    """
    return encode_repairing(encode_json, value, "A value sent as JSON")
