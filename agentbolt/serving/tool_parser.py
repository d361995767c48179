"""Parse ``<tool_call>{json}</tool_call>`` blocks out of model output, whole or while streaming.

The block holds ``{"name": ..., "arguments": {...}}`` (the convention of our ChatML template and of
Hermes/Qwen-style models). Text outside the blocks is the assistant's content. A block whose body is not a JSON
object with a string ``name`` stays content, so nothing the model wrote is lost.

:func:`forced_tool_call` describes the call a ``tool_choice`` of ``"required"`` or a named function demands: the
opening the answer is forced to start with, and the guided-decoding pattern the rest must match.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from agentbolt.serving.guided import JSON_OBJECT, choice_pattern, with_json_objects
from agentbolt.utils.id import generate_id

__all__ = [
    "ParsedToolCall",
    "ToolCallParser",
    "forced_tool_call",
    "parse_tool_calls",
    "TOOL_CALL_OPEN",
    "TOOL_CALL_CLOSE",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


@dataclass
class ParsedToolCall:
    """One function call.

    Attributes:
        id: Call id (``call_`` + 24 hex chars).
        name: Function name.
        arguments: Arguments as a JSON string (the OpenAI wire format).
    """

    id: str
    name: str
    arguments: str

    def to_openai(self, index: Optional[int] = None) -> dict:
        """The OpenAI ``tool_calls`` entry (with ``index`` for streaming deltas)."""
        entry: dict = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            entry["index"] = index
        return entry


def _parse_block(body: str) -> Optional[ParsedToolCall]:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        text = arguments
    else:
        text = json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(id=f"call_{generate_id(24)}", name=payload["name"], arguments=text)


class ToolCallParser:
    """Incremental parser: feed text as it is generated, get content to release and completed calls.

    Content that might be the start of ``<tool_call>`` is held back until it is decided, and so is trailing
    whitespace, until text follows it: an answer with calls ends its content without the whitespace around them,
    so the streamed content adds up to what :func:`parse_tool_calls` gives for the whole text (except for whitespace
    an answer with calls starts with, released before any call is known).
    """

    def __init__(self) -> None:
        self._pending = ""
        self._inside = False
        self._whitespace = ""
        self._called = False

    def _release(self, content: str, calls: List[ParsedToolCall], *, last: bool) -> Tuple[str, List[ParsedToolCall]]:
        """``content`` after the whitespace held back, less the whitespace it ends with (held back in turn, or, at
        the end of an answer with calls, dropped)."""
        self._called = self._called or bool(calls)
        text = self._whitespace + content
        if last:
            self._whitespace = ""
            return (text.rstrip() if self._called else text), calls
        released = text.rstrip()
        self._whitespace = text[len(released) :]
        return released, calls

    def feed(self, text: str) -> Tuple[str, List[ParsedToolCall]]:
        """Consume new text.

        Returns:
            Content safe to release now, and the tool calls completed by this text.
        """
        self._pending += text
        content: List[str] = []
        calls: List[ParsedToolCall] = []
        while True:
            if self._inside:
                end = self._pending.find(TOOL_CALL_CLOSE)
                if end < 0:
                    break
                body = self._pending[:end]
                call = _parse_block(body.strip())
                if call is None:
                    content.append(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)
                else:
                    calls.append(call)
                self._pending = self._pending[end + len(TOOL_CALL_CLOSE) :]
                self._inside = False
                continue
            start = self._pending.find(TOOL_CALL_OPEN)
            if start >= 0:
                content.append(self._pending[:start])
                self._pending = self._pending[start + len(TOOL_CALL_OPEN) :]
                self._inside = True
                continue
            keep = 0
            for size in range(min(len(TOOL_CALL_OPEN) - 1, len(self._pending)), 0, -1):
                if TOOL_CALL_OPEN.startswith(self._pending[-size:]):
                    keep = size
                    break
            content.append(self._pending[: len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep :]
            break
        return self._release("".join(content), calls, last=False)

    def finish(self) -> Tuple[str, List[ParsedToolCall]]:
        """Flush at the end of generation; an unterminated block is parsed if its JSON is complete."""
        pending, inside = self._pending, self._inside
        self._pending, self._inside = "", False
        if not inside:
            return self._release(pending, [], last=True)
        call = _parse_block(pending.strip())
        if call is None:
            return self._release(TOOL_CALL_OPEN + pending, [], last=True)
        return self._release("", [call], last=True)


def parse_tool_calls(text: str) -> Tuple[Optional[str], List[ParsedToolCall]]:
    """Split a complete generation into content and tool calls.

    Returns:
        The content (``None`` if only whitespace remains once calls are removed and there are calls) and the calls.
    """
    parser = ToolCallParser()
    content, calls = parser.feed(text)
    rest, more = parser.finish()
    content += rest
    calls += more
    if calls and not content.strip():
        return None, calls
    return (content.strip() if calls else content), calls


def forced_tool_call(names: Sequence[str], name: Optional[str] = None, parallel: bool = True) -> Tuple[str, str]:
    """The tool call a ``tool_choice`` demands, as the text the answer starts with and a guided-decoding pattern.

    The opening becomes part of the prompt: ``<tool_call>\\n{"name": "`` for ``"required"``, and
    ``<tool_call>\\n{"name": "<name>", "arguments": `` for a named function. The pattern (see
    :mod:`agentbolt.serving.guided`) makes the generated rest complete the block as the chat templates write it:
    for ``"required"`` one of the declared ``names``, then a JSON object of arguments and the closing tag, and
    (with ``parallel``) more such blocks on their own lines; for a named function its arguments and the closing tag.

    Args:
        names: The declared tools' names.
        name: The function a named ``tool_choice`` forces; None for ``"required"``.
        parallel: Whether a ``"required"`` answer may go on with further calls.

    Returns:
        The forced opening and the pattern of the text generated after it.
    """
    import regex

    close = regex.escape("}\n" + TOOL_CALL_CLOSE)
    if name is not None:
        return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": ', with_json_objects(JSON_OBJECT + close)
    opening = f'{TOOL_CALL_OPEN}\n{{"name": "'
    call = choice_pattern([json.dumps(tool)[1:-1] for tool in names]) + regex.escape('", "arguments": ') + JSON_OBJECT
    pattern = call + close
    if parallel:
        pattern += "(?:" + regex.escape("\n" + opening) + call + close + ")*"
    return opening, with_json_objects(pattern)
