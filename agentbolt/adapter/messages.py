"""Turn traced LLM calls into OpenAI chat conversations (messages plus tool definitions).

Each LLM-call span carrying ``gen_ai.*`` attributes becomes one :class:`OpenAIMessages` entry: the request messages,
the assistant's reply (with the tool calls it made) and the tools that were offered. The result can be written as
JSONL for supervised fine-tuning or fed to prompt optimization. The ``openai`` package is only needed for the type
annotations; nothing here imports it at run time.
"""

from __future__ import annotations

import bisect
import json
import math
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Mapping, Optional, Sequence, Set, Tuple, TypedDict, Union

from agentbolt.llm_call_attributes import CONTENT_IS_TEXT, parse_content_parts
from agentbolt.semconv import GEN_AI_COMPLETION, GEN_AI_PROMPT
from agentbolt.types import Span
from agentbolt.utils.otel import filter_and_unflatten_attributes

from .base import TraceAdapter, span_list
from .calls import CallIdentities, call_identity, record_rank
from .fenwick import MinimumTree

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

__all__ = [
    "OpenAIMessages",
    "group_genai_dict",
    "convert_to_openai_messages",
    "get_tool_calls",
    "TraceToMessages",
]

_GEN_AI_REQUEST = "gen_ai.request"
_GEN_AI_RESPONSE = "gen_ai.response"
_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


class OpenAIMessages(TypedDict):
    """One conversation: OpenAI chat messages and the function tools that were available (None if none)."""

    messages: List[ChatCompletionMessageParam]
    tools: Optional[List[ChatCompletionFunctionToolParam]]


def _sparse_lists(value: Any) -> Any:
    """Turn dicts whose keys are all digits into lists ordered by index (recursively)."""
    if isinstance(value, list):
        return [_sparse_lists(v) for v in value]
    if isinstance(value, dict):
        converted = {k: _sparse_lists(v) for k, v in value.items()}
        if converted and all(str(k).isdigit() for k in converted):
            return [converted[k] for k in sorted(converted, key=lambda k: int(k))]
        return converted
    return value


def group_genai_dict(data: Mapping[str, Any], prefix: str) -> Union[Dict[str, Any], List[Any]]:
    """Nest the dotted keys under ``prefix.``: ``{"p.0.role": "user"}`` with prefix ``"p"`` -> ``[{"role": "user"}]``.

    Levels whose keys are all numbers become lists ordered by index (gaps allowed).

    Args:
        data: Flat attributes.
        prefix: The key prefix (without the trailing dot).

    Returns:
        The nested dict or list; ``{}`` when no key is under the prefix.
    """
    dotted = prefix + "."
    nested = {key: value for key, value in data.items() if key.startswith(dotted)}
    if not nested:
        return {}
    return _sparse_lists(filter_and_unflatten_attributes(nested, prefix))


def _decode_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _as_list(value: Any) -> List[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, dict) and not value:
        return []
    return [value]


def _tool_call(raw: Any) -> Dict[str, Any]:
    """An OpenAI function tool call from ``{id, type?, function: {name, arguments}}`` or ``{id, name, arguments}``."""
    if not isinstance(raw, dict):
        raise ValueError(f"A tool call must be a dict, got {type(raw).__name__}: {raw!r}")
    nested = raw.get("function")
    function: Dict[str, Any] = nested if isinstance(nested, dict) else raw
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"A tool call must have a function name: {raw!r}")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    call_id = raw.get("id")
    return {
        "id": call_id if isinstance(call_id, str) else "",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def decode_content(value: Any, *, text: bool = False) -> Any:
    """Message content as recorded in span attributes, with its content parts restored as a list.

    Instrumentations record a list of content parts (``text``, ``image_url`` with ``https:`` or ``data:`` URLs...)
    as numbered attributes, as a JSON string or as the string of a Python list; each comes back as the list. A string
    is read as parts only when it holds a list of OpenAI content parts
    (:func:`agentbolt.llm_call_attributes.parse_content_parts`): other text, JSON or not, is returned unchanged, as
    are other values.

    Args:
        value: The recorded content.
        text: The message is marked as holding text (``content_is_text``): a string is returned unchanged.
    """
    if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
        return _sparse_lists(value)
    if isinstance(value, str) and not text:
        parts = parse_content_parts(value)
        if parts is not None:
            return parts
    return value


def _content(value: Any, *, text: bool = False) -> Any:
    """Message content: text, or a list of content parts (``text`` as for :func:`decode_content`)."""
    value = decode_content(value, text=text)
    if value is None or isinstance(value, (list, str)):
        return value
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _message(raw: Any, *, default_role: Optional[str] = None) -> Dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"A chat message must be a dict, got {type(raw).__name__}: {raw!r}")
    role = raw.get("role", default_role)
    if role not in _ROLES:
        raise ValueError(f"Invalid chat message role {role!r}; expected one of {sorted(_ROLES)}.")
    content = _content(raw.get("content"), text=raw.get(CONTENT_IS_TEXT) is True)
    message: Dict[str, Any] = {"role": role, "content": content}
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ValueError(f"A tool message needs a tool_call_id: {raw!r}")
        message["tool_call_id"] = call_id
        if message["content"] is None:
            message["content"] = ""
    elif role in ("system", "developer", "user") and message["content"] is None:
        message["content"] = ""
    name = raw.get("name")
    if isinstance(name, str) and name and role in ("system", "developer", "user", "assistant", "function"):
        message["name"] = name
    if role == "assistant" and raw.get("tool_calls"):
        message["tool_calls"] = [_tool_call(call) for call in _as_list(raw["tool_calls"])]
    return message


def _function_tool(raw: Any) -> Dict[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ValueError(f"A function definition must be a dict with a name: {raw!r}")
    function: Dict[str, Any] = {"name": raw["name"]}
    if isinstance(raw.get("description"), str):
        function["description"] = raw["description"]
    if raw.get("parameters") is not None:
        parameters = _decode_json(raw["parameters"])
        if not isinstance(parameters, dict):
            raise ValueError(f"The parameters of function {raw['name']!r} must be a JSON object: {parameters!r}")
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def convert_to_openai_messages(list_of_raw: Sequence[Mapping[str, Any]]) -> Generator[OpenAIMessages, None, None]:
    """Build conversations from grouped ``gen_ai`` data.

    Args:
        list_of_raw: One dict per LLM call with ``prompt`` (list of messages), ``completion`` (list of choices),
            ``request`` (dict; ``functions`` lists the tools offered), ``response`` (dict) and optionally
            ``tool_calls`` (tool calls recorded as child spans, attached to the reply that has none of its own).

    Yields:
        One :class:`OpenAIMessages` per call.

    Raises:
        ValueError: On malformed messages, tool calls or function definitions.
    """
    for raw in list_of_raw:
        messages = [_message(m) for m in raw.get("prompt") or []]
        replies = [_message(c, default_role="assistant") for c in raw.get("completion") or []]
        child_calls = list(raw.get("tool_calls") or [])
        if child_calls:
            target = next((r for r in reversed(replies) if r["role"] == "assistant"), None)
            if target is None:
                target = {"role": "assistant", "content": None}
                replies.append(target)
            target.setdefault("tool_calls", [_tool_call(call) for call in child_calls])
        functions = (raw.get("request") or {}).get("functions")
        tools = [_function_tool(f) for f in _as_list(functions)] if functions else None
        yield OpenAIMessages(messages=messages + replies, tools=tools)  # type: ignore[typeddict-item]


def get_tool_calls(completion: Span, all_spans: Sequence[Span], /) -> List[Dict[str, Any]]:
    """Tool calls recorded as direct child spans of an LLM-call span (``tool.name``, ``tool.parameters``,
    ``tool.call.id``, ``tool.call.type``).

    Args:
        completion: The LLM-call span.
        all_spans: All spans of the trace.

    Returns:
        OpenAI-style tool calls ``{"id", "type", "function": {"name", "arguments"}}`` in span order.
    """
    calls: List[Dict[str, Any]] = []
    for span in all_spans:
        if span.parent_id != completion.span_id or span is completion:
            continue
        tool = group_genai_dict(span.attributes, "tool")
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        raw_call = tool.get("call")
        call: Dict[str, Any] = raw_call if isinstance(raw_call, dict) else {}
        calls.append(
            {
                "id": call.get("id") if isinstance(call.get("id"), str) else "",
                "type": call.get("type") if isinstance(call.get("type"), str) else "function",
                "function": {"name": tool["name"], "arguments": tool.get("parameters", "")},
            }
        )
    return calls


def _has_genai_data(attributes: Mapping[str, Any]) -> bool:
    prefixes = tuple(p + "." for p in (GEN_AI_PROMPT, GEN_AI_COMPLETION, _GEN_AI_REQUEST, _GEN_AI_RESPONSE))
    return any(key.startswith(prefixes) for key in attributes)


def _time_range(span: Span) -> Optional[Tuple[float, float]]:
    """The span's ``(start, end)`` when both are known numbers; a span without them encloses nothing and is enclosed
    by nothing."""
    start, end = span.start_time, span.end_time
    if start is None or end is None or math.isnan(start) or math.isnan(end):
        return None
    return start, end


def _request_signature(span: Span) -> Optional[str]:
    """The request messages of an LLM-call record as comparable text (roles and decoded contents), None when the
    record has no (well-formed) prompt: two records of one call carry the same request."""
    prompt = group_genai_dict(span.attributes, GEN_AI_PROMPT)
    if not isinstance(prompt, list) or not prompt:
        return None
    messages = [
        [m.get("role"), decode_content(m.get("content"), text=m.get(CONTENT_IS_TEXT) is True)]
        if isinstance(m, dict)
        else m
        for m in prompt
    ]
    return json.dumps(messages, sort_keys=True, default=str)


class _EnclosedRecords:
    """Time ranges of records taken so far, answering "does ``[start, end]`` enclose one of them" in ``O(log n)``.

    The end times sit in a Fenwick tree of minimums by start time.

    Args:
        starts: Every start time a range added later may have.
    """

    def __init__(self, starts: Sequence[float]) -> None:
        self._starts = sorted(set(starts))
        self._earliest_end: MinimumTree[float] = MinimumTree(len(self._starts))

    def _slot(self, start: float) -> int:
        # Slot 1 is the latest start, so slots 1..slot(start) hold the records starting at or after ``start``.
        return len(self._starts) - bisect.bisect_left(self._starts, start)

    def add(self, time_range: Tuple[float, float]) -> None:
        """Take the record with this time range."""
        self._earliest_end.lower(self._slot(time_range[0]), time_range[1])

    def encloses_one(self, time_range: Tuple[float, float]) -> bool:
        """Whether ``time_range`` encloses the time range of a record taken."""
        end = self._earliest_end.minimum(self._slot(time_range[0]))
        return end is not None and end <= time_range[1]


_ANY_REQUEST = "\x00any"


def _kept_records(records: Sequence[Span]) -> Set[int]:
    """Positions of the records that give a conversation, one per call.

    Records are taken by :func:`~agentbolt.adapter.calls.record_rank` (in recorded order within a rank). A framework record that encloses in
    time a record taken before it is of the same call, and dropped, unless the two tell their calls apart: both carry
    a response id (and these differ: equal ones are the same call anyway), or both are framework records carrying
    request messages and these differ. The other records are taken when their call is new (:class:`~agentbolt.adapter.calls.CallIdentities`).

    The records taken are indexed by request (each framework request, records without one or of another source,
    and all records), each index split
    into all records and those without a response id, so that the whole selection takes ``O(n log n)`` for ``n``
    records.
    """
    time_ranges = [_time_range(record) for record in records]
    # Only framework records are told apart by their requests: a gateway or SDK record of the same call may write
    # its request differently (LangChain's messages are not the SDK's), so it sits with the records without one.
    requests = [_request_signature(record) if record_rank(record) == 2 else None for record in records]
    starts_by_request: Dict[Optional[str], List[float]] = {_ANY_REQUEST: []}
    for request, time_range in zip(requests, time_ranges, strict=True):
        if time_range is not None:
            starts_by_request.setdefault(request, []).append(time_range[0])
            starts_by_request[_ANY_REQUEST].append(time_range[0])
    # (request, only records without a response id) -> the time ranges of the records taken
    taken: Dict[Tuple[Optional[str], bool], _EnclosedRecords] = {
        (request, without_response_id): _EnclosedRecords(starts)
        for request, starts in starts_by_request.items()
        for without_response_id in (False, True)
    }
    identities = CallIdentities()
    kept: Set[int] = set()
    for position in sorted(range(len(records)), key=lambda i: record_rank(records[i])):
        record, time_range, request = records[position], time_ranges[position], requests[position]
        call_id, response_id = call_identity(record.attributes)
        if time_range is not None and record_rank(record) == 2:
            # A record with a response id is told apart from taken records with another response id.
            pools = [_ANY_REQUEST] if request is None else [request, None]
            if any(
                (pool, response_id is not None) in taken
                and taken[pool, response_id is not None].encloses_one(time_range)
                for pool in pools
            ):
                continue
        if identities.claim(call_id, response_id):
            kept.add(position)
            if time_range is not None:
                for pool in (request, _ANY_REQUEST):
                    taken[pool, False].add(time_range)
                    if response_id is None:
                        taken[pool, True].add(time_range)
    return kept


class TraceToMessages(TraceAdapter[List[OpenAIMessages]]):
    """One OpenAI conversation per traced LLM call, ready for SFT datasets or prompt optimization.

    Works with any span carrying ``gen_ai.prompt`` / ``gen_ai.completion`` attributes: the tracer's
    ``openai.chat.completion`` spans (and ``openai.completion`` spans of text completions, whose prompt is one user
    message), the LLM gateway's ``agentbolt.llm_call`` spans and the LangChain handler's ``langchain.llm.<name>``
    spans. A call recorded by several of them (same call id, or same response id, see
    :mod:`agentbolt.adapter.calls`) gives one conversation, taken from the gateway's record when there is one, else
    from the SDK's, else from the framework's. A framework's record that encloses in time a record kept before it
    (an SDK or gateway record, or an earlier framework record) is of the same call too (framework callbacks do not
    always learn the response id, e.g. when streaming), unless their response ids or their request messages differ:
    two distinct calls recorded with the same time range give two conversations. Selecting the records takes
    ``O(n log n)`` for ``n`` records.
    """

    def adapt(self, source: Sequence[Span], /) -> List[OpenAIMessages]:
        """Convert the spans of one rollout.

        Args:
            source: The spans (store order); any iterable of spans, read once.

        Returns:
            The conversations in span order.

        Raises:
            ValueError: If a span's ``gen_ai`` data has the wrong shape (prompt/completion not lists, request/response
                not dicts) or holds malformed messages.
        """
        spans = span_list(source)
        records = [span for span in spans if _has_genai_data(span.attributes)]
        kept = _kept_records(records)
        children: Dict[str, List[Span]] = {}
        for span in spans:
            if span.parent_id is not None:
                children.setdefault(span.parent_id, []).append(span)
        raw_calls: List[Dict[str, Any]] = []
        for position, span in enumerate(records):
            if position not in kept:
                continue
            attrs = span.attributes
            prompt = group_genai_dict(attrs, GEN_AI_PROMPT) or []
            completion = group_genai_dict(attrs, GEN_AI_COMPLETION) or []
            request = group_genai_dict(attrs, _GEN_AI_REQUEST)
            response = group_genai_dict(attrs, _GEN_AI_RESPONSE)
            for label, value, expected in (
                ("gen_ai.prompt", prompt, list),
                ("gen_ai.completion", completion, list),
                ("gen_ai.request", request, dict),
                ("gen_ai.response", response, dict),
            ):
                if not isinstance(value, expected):
                    raise ValueError(
                        f"Span {span.span_id} ({span.name}): {label} must be a {expected.__name__}, "
                        f"got {type(value).__name__}."
                    )
            if not prompt and not completion:
                continue
            raw_calls.append(
                {
                    "prompt": prompt,
                    "completion": completion,
                    "request": request,
                    "response": response,
                    "tool_calls": get_tool_calls(span, children.get(span.span_id, [])),
                }
            )
        return list(convert_to_openai_messages(raw_calls))
