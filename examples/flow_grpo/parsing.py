"""Tolerant parsing of the roles' JSON answers.

Small models get JSON almost right: the object is wrapped in prose or a code fence, keys are unquoted or spelled
``"Tool Name"``, strings use single quotes, Python's ``True``/``None`` appear, a trailing comma is left, or the answer
stops at ``max_tokens`` before the closing brace. :func:`parse_output` repairs these and validates the result with
the role's pydantic schema; when nothing usable is found it returns the role's fallback value and says why, so a
caller never receives a raw string where it expects a model.

Order of attempts: JSON objects found in the text (code fences first, then every ``{``), each as-is and then
repaired; finally ``Key: value`` lines (``Tool Name: search``), the format models fall back to when they ignore the
JSON instruction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Dict, Generic, Iterator, List, Optional, Type, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["ParseResult", "extract_json_objects", "normalize_key", "parse_output", "repair_json"]

M = TypeVar("M", bound=BaseModel)

_KEY_ALIASES: Dict[str, str] = {
    "tool": "tool_name",
    "toolname": "tool_name",
    "selectedtool": "tool_name",
    "action": "tool_name",
    "subgoal": "sub_goal",
    "goal": "sub_goal",
    "input": "tool_input",
    "command": "tool_input",
    "toolinput": "tool_input",
    "stopsignal": "stop",
    "finalanswer": "answer",
    "correct": "true_false",
    "truefalse": "true_false",
    "concisesummary": "summary",
    "relevanttools": "tools",
    "reason": "justification",
}
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)(?:```|$)", re.DOTALL)
_KEY_LINE = re.compile(r"^\s*(?:\d+[.)]\s*)?[*_#\s]*([A-Za-z][A-Za-z _-]{0,30}?)[*_\s]*[:=]\s*(.*?)\s*$")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": "true", "false": "false", "null": "null", "True": "true", "False": "false", "None": "null"}


@dataclass
class ParseResult(Generic[M]):
    """Outcome of :func:`parse_output`.

    Attributes:
        value: The validated model, or the fallback when parsing failed.
        ok: True when ``value`` came from the text (possibly after repair), False when it is the fallback.
        repaired: True when the text needed a repair (or the ``Key: value`` reading) to validate.
        error: Why parsing failed (None when ``ok``).
    """

    value: M
    ok: bool
    repaired: bool = False
    error: Optional[str] = None


def normalize_key(key: str) -> str:
    """Lower-case a key and drop everything but letters and digits (``"Sub-Goal"`` -> ``"subgoal"``)."""
    return re.sub(r"[^a-z0-9]", "", key.lower())


def _scan_object(text: str, start: int) -> int:
    """Index just past the ``}`` closing the object opened at ``text[start]``, or ``len(text)`` if it never closes."""
    depth = 0
    quote: Optional[str] = None
    index = start
    while index < len(text):
        char = text[index]
        if quote is not None:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return len(text)


def extract_json_objects(text: str) -> Iterator[str]:
    """Candidate JSON object texts in ``text``: fenced blocks first, then each top-level ``{...}`` (maybe unclosed)."""
    seen: set[str] = set()
    for match in _FENCE.finditer(text):
        body = match.group(1).strip()
        if body.startswith("{") and body not in seen:
            seen.add(body)
            yield body
    index = text.find("{")
    while index != -1:
        end = _scan_object(text, index)
        candidate = text[index:end]
        if candidate not in seen:
            seen.add(candidate)
            yield candidate
        index = text.find("{", end if end > index else index + 1)


def repair_json(text: str) -> str:
    """Best-effort rewrite of almost-JSON into JSON.

    Handles single-quoted strings, unquoted keys, bare-word values, Python literals, raw newlines in strings,
    trailing commas and missing closing quotes/brackets. The result may still be invalid JSON.
    """
    out: List[str] = []
    stack: List[str] = []
    index = 0
    length = len(text)

    def drop_trailing_comma() -> None:
        while out and out[-1].isspace():
            out.pop()
        if out and out[-1] == ",":
            out.pop()

    while index < length:
        char = text[index]
        if char in "\"'":
            quote = char
            index += 1
            out.append('"')
            while index < length and text[index] != quote:
                inner = text[index]
                if inner == "\\" and index + 1 < length:
                    nxt = text[index + 1]
                    out.append("\\" + nxt if nxt in '"\\/bfnrtu' else ("'" if nxt == "'" else "\\\\" + nxt))
                    index += 2
                    continue
                out.append({'"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(inner, inner))
                index += 1
            out.append('"')
            index += 1
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
            out.append(char)
            index += 1
        elif char in "}]":
            drop_trailing_comma()
            if stack:
                out.append(stack.pop())
            index += 1
            if not stack:
                break
        elif char.isalpha() or char == "_":
            end = index
            while end < length and (text[end].isalnum() or text[end] in "_- "):
                end += 1
            word = text[index:end].rstrip()
            after = end
            while after < length and text[after].isspace():
                after += 1
            if after < length and text[after] == ":":
                out.append(json.dumps(word))
                index = index + len(word)
            elif word in _LITERALS:
                out.append(_LITERALS[word])
                index = index + len(word)
            else:
                # A bare-word value: everything up to the next separator at this level.
                end = index
                while end < length and text[end] not in ",}]\n":
                    end += 1
                out.append(json.dumps(text[index:end].strip()))
                index = end
        elif char.isdigit() or char in "-+.(":
            # A number, or an unquoted expression such as 12*12 (quoted unless it is a JSON number).
            end = index
            while end < length and text[end] not in ",}]\n":
                end += 1
            token = text[index:end].strip()
            out.append(token if _JSON_NUMBER.fullmatch(token) else json.dumps(token))
            index = end
        else:
            out.append(char)
            index += 1
    drop_trailing_comma()
    if out and out[-1] == ":":
        out.append("null")
    out.extend(reversed(stack))
    return "".join(out)


def _unwrap(data: Any, fields: set[str]) -> Any:
    """Unwrap ``{"NextStep": {...}}``-style single-key envelopes."""
    while isinstance(data, dict) and len(data) == 1:
        ((key, inner),) = data.items()
        if normalize_key(str(key)) in fields or not isinstance(inner, dict):
            break
        data = inner
    return data


def _normalize_keys(data: Dict[str, Any], schema: Type[BaseModel]) -> Dict[str, Any]:
    by_norm = {normalize_key(name): name for name in schema.model_fields}
    result: Dict[str, Any] = {}
    for key, value in data.items():
        norm = normalize_key(str(key))
        name = by_norm.get(norm) or _KEY_ALIASES.get(norm)
        if name in schema.model_fields and name not in result:
            result[name] = value
    return result


def _validate(data: Any, schema: Type[M]) -> M:
    fields = {normalize_key(name) for name in schema.model_fields}
    data = _unwrap(data, fields)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return schema.model_validate(_normalize_keys(data, schema))


def _key_value_lines(text: str) -> Dict[str, str]:
    data: Dict[str, str] = {}
    for line in text.splitlines():
        match = _KEY_LINE.match(line)
        if match and match.group(2):
            data.setdefault(match.group(1), match.group(2).strip().strip("*").strip())
    return data


def parse_output(text: Optional[str], schema: Type[M], fallback: M) -> ParseResult[M]:
    """Parse a role's answer into ``schema``, repairing common mistakes, or return ``fallback``.

    Args:
        text: The model's answer (None is treated as empty).
        schema: The pydantic model the answer must validate against.
        fallback: Value returned (with ``ok=False``) when nothing in the text validates.

    Returns:
        A :class:`ParseResult`; ``value`` is always an instance of ``schema``.
    """
    text = (text or "").replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'").replace("\u2019", "'")
    last_error = "no JSON object in the answer"
    for candidate in extract_json_objects(text):
        try:
            return ParseResult(_validate(json.loads(candidate), schema), ok=True)
        except (ValueError, ValidationError) as exc:
            last_error = _describe(exc)
        try:
            return ParseResult(_validate(json.loads(repair_json(candidate)), schema), ok=True, repaired=True)
        except (ValueError, ValidationError) as exc:
            last_error = _describe(exc)
    lines = _key_value_lines(text)
    if lines:
        try:
            return ParseResult(_validate(lines, schema), ok=True, repaired=True)
        except (ValueError, ValidationError) as exc:
            last_error = _describe(exc)
    return ParseResult(fallback, ok=False, error=last_error)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        problems = [f"{'.'.join(str(p) for p in err['loc']) or 'object'}: {err['msg']}" for err in exc.errors()]
        return "; ".join(problems)
    return str(exc)
