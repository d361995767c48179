"""The span attributes of one LLM call, built in one place for every recorder of LLM calls.

The OpenAI SDK instrumentation (``openai.chat.completion`` and ``openai.completion`` spans) and the LLM gateway
(``agentbolt.llm_call`` spans) both build their attributes here, so one call records the same keys whichever way it
was traced. Requests are read as the OpenAI API defines them; responses and stream chunks may be parsed JSON (dicts)
or the SDK's objects (including the extra fields servers add, such as vLLM's ``token_ids``).

Where the OpenTelemetry GenAI semantic conventions name a value, their key is used:

==============================================  ======================================================================
request ``model``                               ``gen_ai.request.model``
``temperature``, ``top_p``, ``top_k``, ``seed``,  ``gen_ai.request.<name>`` (numbers only)
``frequency_penalty``, ``presence_penalty``
``max_tokens`` / ``max_completion_tokens``      ``gen_ai.request.max_tokens``
``n``                                           ``gen_ai.request.choice.count``
``stop``                                        ``gen_ai.request.stop_sequences`` (always a list of strings)
``stream``                                      ``gen_ai.request.stream`` (always recorded, bool)
guided decoding, ``top_p`` < 1, penalties...    ``gen_ai.request.distribution_changing``: the names of the parameters
                                                set to change the sampled distribution
                                                (:mod:`agentbolt.openai_api.sampling`), sorted; absent when none is
                                                set
``messages`` / ``prompt``                       ``gen_ai.prompt.<i>.role/content/name/tool_call_id/reasoning_content``
                                                and ``gen_ai.prompt.<i>.tool_calls.<j>.id/type/name/arguments`` (a
                                                text completion's ``prompt`` is one ``user`` message; a prompt that is
                                                not a string, such as token ids, is its JSON)
``tools`` / ``functions``                       ``gen_ai.request.functions.<i>.name/description/parameters``
response ``id`` / ``model``                     ``gen_ai.response.id`` / ``gen_ai.response.model``
choices                                         ``gen_ai.completion.<i>.*`` (as messages, plus ``finish_reason`` and,
                                                when the backend names it, vLLM's ``stop_reason``: the stop string or
                                                token that ended the choice) and ``gen_ai.response.finish_reasons``
``usage``                                       ``gen_ai.usage.input_tokens`` / ``output_tokens`` (counted from the
                                                token ids when the backend sends no usage)
token ids (vLLM ``return_token_ids``)           ``prompt_token_ids``, ``response_token_ids`` (first choice)
logprobs of the first choice                    ``logprobs.content`` (chat: JSON of the entries) and
                                                ``response_logprobs`` (one float per token)
==============================================  ======================================================================

Strings with lone surrogates (a server's JSON escaping half of a surrogate pair, ``"\\ud83d"``) are recorded with
U+FFFD in their place (see :func:`~agentbolt.types.wire.without_lone_surrogates`): they have no UTF-8 form, and the
OTLP encoder and the JSON writers refuse them. The same rule applies to the ``exception`` event of a failed call
(:func:`~agentbolt.utils.otel.record_exception_event`).

Content that is not a string (content parts, tool parameters) is recorded as JSON. Text content that would read back
as content parts (see :func:`parse_content_parts`) also records ``<prefix>.content_is_text``: ``True`` (next to
``<prefix>.content``), so it is read back as the same string. Tool calls use the flat layout of OpenLLMetry-style
instrumentations (``tool_calls.<j>.name`` / ``.arguments``), which Agent Lightning traces use; the adapters also read
the nested ``function.name`` / ``function.arguments`` layout of older gateway spans.
"""

from __future__ import annotations

import ast
import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import orjson

from agentbolt.openai_api.sampling import distribution_changing_parameters
from agentbolt.semconv import (
    GEN_AI_COMPLETION,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROMPT,
    GEN_AI_REQUEST_CHOICE_COUNT,
    GEN_AI_REQUEST_DISTRIBUTION_CHANGING,
    GEN_AI_REQUEST_FUNCTIONS,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_STOP_SEQUENCES,
    GEN_AI_REQUEST_STREAM,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_SYSTEM,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    LOGPROBS_CONTENT,
    PROMPT_TOKEN_IDS,
    RESPONSE_LOGPROBS,
    RESPONSE_TOKEN_IDS,
)
from agentbolt.types.wire import without_lone_surrogates

__all__ = [
    "CONTENT_IS_TEXT",
    "CompletionRecord",
    "is_content_parts",
    "parse_content_parts",
    "request_attributes",
    "llm_call_attributes",
]

CONTENT_IS_TEXT = "content_is_text"
"""Field of a recorded message (``gen_ai.prompt.<i>.content_is_text``): ``True`` when its content string is text
that would otherwise read as content parts."""

# OpenAI's content part types; each carries its payload under the field named like the type.
_PART_PAYLOAD_TYPES: Dict[str, Any] = {
    "text": str,
    "refusal": str,
    "image_url": (dict, str),
    "input_audio": dict,
    "file": dict,
}

# Numeric request parameters and their keys; the first listed of two aliases wins.
_NUMERIC_PARAMS = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("max_tokens", GEN_AI_REQUEST_MAX_TOKENS),
    ("max_completion_tokens", GEN_AI_REQUEST_MAX_TOKENS),
    ("n", GEN_AI_REQUEST_CHOICE_COUNT),
    ("seed", "gen_ai.request.seed"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
)


def _get(obj: Any, key: str) -> Any:
    """Field of a dict or an SDK object, including the extra fields servers add (``token_ids``...)."""
    if type(obj) is dict:
        return obj.get(key)
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    value = getattr(obj, key, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if extra:
            value = extra.get(key)
    return value


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    return str(value)


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, default=_json_default).decode()
    except TypeError:  # what orjson refuses (lone surrogates, integers beyond 64 bits) the standard library writes
        return without_lone_surrogates(json.dumps(value, default=_json_default, ensure_ascii=False))


def _writable(attributes: Dict[str, Any]) -> Dict[str, Any]:
    """``attributes`` with the lone surrogates of their strings replaced (see
    :func:`~agentbolt.types.wire.without_lone_surrogates`), in place.

    A server's JSON may escape half of a surrogate pair (``"\\ud83d"``), which decodes to a string with no UTF-8 form;
    the OTLP encoder and the JSON writers refuse such strings, which would lose the whole span on its way to the store.
    """
    for key, value in attributes.items():
        if type(value) is str:
            if not value.isascii():
                attributes[key] = without_lone_surrogates(value)
        elif type(value) is list and value and type(value[0]) is str:
            attributes[key] = without_lone_surrogates(value)
    return attributes


def _text(value: Any) -> Optional[str]:
    """A string attribute value: strings as they are, anything else (content parts...) as JSON."""
    if value is None or isinstance(value, str):
        return value
    return _json(value)


def is_content_parts(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of OpenAI content parts (``text``, ``image_url``, ``input_audio``,
    ``file``, ``refusal``), each carrying its payload (``{"type": "text", "text": "..."}``...)."""
    if not isinstance(value, list) or not value:
        return False
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in _PART_PAYLOAD_TYPES:
            return False
        if not isinstance(part.get(kind), _PART_PAYLOAD_TYPES[kind]):
            return False
    return True


def parse_content_parts(text: str) -> Optional[List[Dict[str, Any]]]:
    """The content parts a recorded content string holds, or None when it holds text.

    Content parts are recorded as a JSON list (some instrumentations record the string of a Python list). Only a list
    of OpenAI content parts (see :func:`is_content_parts`) counts: other JSON, such as a tool's JSON output, is text.
    """
    stripped = text.strip()
    if not stripped.startswith("[") or "type" not in stripped:
        return None
    try:
        value = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        try:
            value = ast.literal_eval(stripped)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if is_content_parts(value) else None


def _put_content(attributes: Dict[str, Any], prefix: str, content: Optional[str], *, text: bool) -> None:
    """Record ``content`` (already a string) under ``<prefix>.content``; ``text`` tells whether it was text (not
    content parts recorded as JSON), and text that would read as content parts is marked with ``CONTENT_IS_TEXT``."""
    if content is None:
        return
    attributes[f"{prefix}.content"] = content
    if text and parse_content_parts(content) is not None:
        attributes[f"{prefix}.{CONTENT_IS_TEXT}"] = True


def _number(value: Any) -> Optional[Union[int, float]]:
    """``value`` when it is an int or a float (not a bool), else None."""
    kind = type(value)
    return value if kind is int or kind is float else None


def _items(value: Any) -> List[Any]:
    """``value`` when it is a list (of choices, tool calls...), else none: a malformed answer records what it can."""
    return value if isinstance(value, list) else []


def _int_list(value: Any) -> Optional[List[int]]:
    if type(value) is list and value and all(type(v) is int for v in value):
        return value
    return None


def _str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _put_given(attributes: Dict[str, Any], key: str, value: Optional[str]) -> None:
    if value is not None:
        attributes[key] = value


def _put_tool_calls(attributes: Dict[str, Any], prefix: str, tool_calls: Iterable[Any]) -> None:
    for j, call in enumerate(tool_calls):
        key = f"{prefix}.tool_calls.{j}"
        function = _get(call, "function")
        _put_given(attributes, f"{key}.id", _str(_get(call, "id")))
        attributes[f"{key}.type"] = _get(call, "type") or "function"
        _put_given(attributes, f"{key}.name", _str(_get(function, "name")))
        _put_given(attributes, f"{key}.arguments", _text(_get(function, "arguments")))


def _put_message(attributes: Dict[str, Any], prefix: str, message: Any) -> None:
    _put_given(attributes, f"{prefix}.role", _str(_get(message, "role")))
    content = _get(message, "content")
    _put_content(attributes, prefix, _text(content), text=isinstance(content, str))
    for field in ("name", "tool_call_id", "reasoning_content"):
        _put_given(attributes, f"{prefix}.{field}", _str(_get(message, field)))
    tool_calls = _get(message, "tool_calls")
    if tool_calls:
        _put_tool_calls(attributes, prefix, tool_calls)


def request_attributes(
    request: Mapping[str, Any], *, operation: str = "chat", provider: Optional[str] = None
) -> Dict[str, Any]:
    """Span attributes of an LLM request (see the module docstring for the keys).

    Args:
        request: The request's parameters (the JSON body, or the keyword arguments given to the SDK).
        operation: ``"chat"`` (chat completions) or ``"text_completion"`` (legacy completions).
        provider: Value of ``gen_ai.system`` (``"openai"``, ``"hosted_vllm"``...), if known.

    Returns:
        A new dict of attributes.
    """
    attributes: Dict[str, Any] = {
        GEN_AI_OPERATION_NAME: operation,
        GEN_AI_REQUEST_STREAM: request.get("stream") is True,
    }
    if provider is not None:
        attributes[GEN_AI_SYSTEM] = provider
    model = request.get("model")
    if isinstance(model, str):
        attributes[GEN_AI_REQUEST_MODEL] = model
    for name, key in _NUMERIC_PARAMS:
        value = _number(request.get(name))
        if value is not None and key not in attributes:
            attributes[key] = value
    changing = distribution_changing_parameters(request)
    if changing:
        attributes[GEN_AI_REQUEST_DISTRIBUTION_CHANGING] = changing
    stop = request.get("stop")
    if isinstance(stop, str):
        attributes[GEN_AI_REQUEST_STOP_SEQUENCES] = [stop]
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        attributes[GEN_AI_REQUEST_STOP_SEQUENCES] = list(stop)
    messages = request.get("messages")
    if isinstance(messages, (list, tuple)):
        for i, message in enumerate(messages):
            _put_message(attributes, f"{GEN_AI_PROMPT}.{i}", message)
    elif request.get("prompt") is not None:
        attributes[f"{GEN_AI_PROMPT}.0.role"] = "user"
        prompt = request.get("prompt")
        _put_content(attributes, f"{GEN_AI_PROMPT}.0", _text(prompt), text=isinstance(prompt, str))
    tools = request.get("tools")
    functions: List[Any] = [_get(tool, "function") or tool for tool in tools] if isinstance(tools, list) else []
    legacy = request.get("functions")
    if isinstance(legacy, list):
        functions.extend(legacy)
    for i, function in enumerate(functions):
        prefix = f"{GEN_AI_REQUEST_FUNCTIONS}.{i}"
        for field in ("name", "description"):
            value = _get(function, field)
            if value is not None:
                attributes[f"{prefix}.{field}"] = str(value)
        parameters = _text(_get(function, "parameters"))
        if parameters is not None:
            attributes[f"{prefix}.parameters"] = parameters
    return _writable(attributes)


class _Choice:
    """One choice of a response, complete or assembled from stream deltas."""

    __slots__ = (
        "content",
        "content_is_text",
        "finish_reason",
        "logprob_entries",
        "reasoning",
        "role",
        "stop_reason",
        "token_ids",
        "token_logprobs",
        "tool_calls",
    )

    def __init__(self) -> None:
        self.role: Optional[str] = None
        self.content: Optional[str] = None
        self.content_is_text: bool = True  # False when the content was a list of parts, recorded as JSON
        self.reasoning: Optional[str] = None
        self.finish_reason: Optional[str] = None
        self.stop_reason: Union[int, str, None] = None  # vLLM's: the stop string or token that ended the choice
        self.token_ids: List[int] = []
        self.logprob_entries: List[Any] = []  # chat: {"token", "logprob", ...} per token
        self.token_logprobs: List[Any] = []  # legacy completions: one number per token
        self.tool_calls: Dict[int, Dict[str, Any]] = {}

    def add_logprobs(self, logprobs: Any) -> None:
        entries = _get(logprobs, "content")
        if isinstance(entries, list):
            self.logprob_entries.extend(entries)
        values = _get(logprobs, "token_logprobs")
        if isinstance(values, list):
            self.token_logprobs.extend(values)

    def take_stop_reason(self, choice: Any) -> None:
        """Keep the choice's ``stop_reason`` when it names a stop string or token (vLLM sends null otherwise)."""
        value = _get(choice, "stop_reason")
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            self.stop_reason = value

    def add_token_ids(self, choice: Any) -> None:
        ids = _int_list(_get(choice, "token_ids")) or _int_list(
            _get(_get(choice, "provider_specific_fields"), "token_ids")
        )
        if ids:
            self.token_ids.extend(ids)

    def logprobs(self) -> Optional[List[float]]:
        if self.logprob_entries:
            values = [
                entry.get("logprob") if type(entry) is dict else _get(entry, "logprob")
                for entry in self.logprob_entries
            ]
        else:
            values = self.token_logprobs
        if not values or not all(type(v) is float or type(v) is int for v in values):
            return None
        return [float(v) for v in values]


class CompletionRecord:
    """What a response contributes to its span: built from a complete response or from stream chunks.

    ``CompletionRecord.from_completion(response)`` reads a complete chat or text completion; an empty record fed with
    :meth:`add_chunk` reassembles a stream (content, tool-call fragments, token ids and logprobs concatenated per
    choice; ``id``, ``model``, ``usage`` and ``prompt_token_ids`` taken from the chunks that carry them), so a
    streamed call records the same attributes as the same call made without streaming.
    """

    def __init__(self) -> None:
        self.id: Optional[str] = None
        self.model: Optional[str] = None
        self.usage: Any = None
        self.prompt_token_ids: Optional[List[int]] = None
        self.choices: Dict[int, _Choice] = {}

    def _choice(self, raw: Any, position: int) -> _Choice:
        index = _get(raw, "index")
        key = index if isinstance(index, int) and not isinstance(index, bool) else position
        choice = self.choices.get(key)
        if choice is None:
            choice = self.choices[key] = _Choice()
        return choice

    def _take_response_fields(self, data: Any) -> None:
        if self.id is None:
            self.id = _get(data, "id")
        if self.model is None:
            self.model = _get(data, "model")
        usage = _get(data, "usage")
        if usage is not None:
            self.usage = usage
        if self.prompt_token_ids is None:
            self.prompt_token_ids = _int_list(_get(data, "prompt_token_ids"))

    @classmethod
    def from_completion(cls, completion: Any) -> CompletionRecord:
        """The record of a complete (non-streamed) chat or text completion."""
        record = cls()
        record._take_response_fields(completion)
        for position, raw in enumerate(_items(_get(completion, "choices"))):
            choice = record._choice(raw, position)
            message = _get(raw, "message")
            if message is not None:
                choice.role = _get(message, "role")
                content = _get(message, "content")
                choice.content = _text(content)
                choice.content_is_text = content is None or isinstance(content, str)
                choice.reasoning = _text(_get(message, "reasoning_content"))
                choice.tool_calls = {j: _tool_call(call) for j, call in enumerate(_items(_get(message, "tool_calls")))}
            else:
                choice.content = _text(_get(raw, "text"))
            choice.finish_reason = _get(raw, "finish_reason")
            choice.take_stop_reason(raw)
            choice.add_token_ids(raw)
            choice.add_logprobs(_get(raw, "logprobs"))
            if record.prompt_token_ids is None:
                record.prompt_token_ids = _int_list(_get(raw, "prompt_token_ids"))
        return record

    def add_chunk(self, chunk: Any) -> None:
        """Merge one stream chunk (chat ``delta`` or text-completion ``text``)."""
        self._take_response_fields(chunk)
        for position, raw in enumerate(_items(_get(chunk, "choices"))):
            choice = self._choice(raw, position)
            delta = _get(raw, "delta")
            if delta is not None:
                role = _get(delta, "role")
                if role:
                    choice.role = role
                content = _text(_get(delta, "content"))
                if content:
                    choice.content = (choice.content or "") + content
                reasoning = _text(_get(delta, "reasoning_content"))
                if reasoning:
                    choice.reasoning = (choice.reasoning or "") + reasoning
                for slot, fragment in enumerate(_items(_get(delta, "tool_calls"))):
                    _merge_tool_call(choice.tool_calls, fragment, slot)
            else:
                text = _text(_get(raw, "text"))
                if text:
                    choice.content = (choice.content or "") + text
            finish_reason = _get(raw, "finish_reason")
            if finish_reason is not None:
                choice.finish_reason = finish_reason
            choice.take_stop_reason(raw)
            choice.add_token_ids(raw)
            choice.add_logprobs(_get(raw, "logprobs"))
            if self.prompt_token_ids is None:
                self.prompt_token_ids = _int_list(_get(raw, "prompt_token_ids"))

    def attributes(self) -> Dict[str, Any]:
        """Span attributes of the response (see the module docstring for the keys)."""
        attributes: Dict[str, Any] = {}
        if self.id is not None:
            attributes[GEN_AI_RESPONSE_ID] = str(self.id)
        if self.model is not None:
            attributes[GEN_AI_RESPONSE_MODEL] = str(self.model)
        finish_reasons: List[str] = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            prefix = f"{GEN_AI_COMPLETION}.{index}"
            attributes[f"{prefix}.role"] = choice.role or "assistant"
            _put_content(attributes, prefix, choice.content, text=choice.content_is_text)
            if choice.reasoning is not None:
                attributes[f"{prefix}.reasoning_content"] = choice.reasoning
            if choice.finish_reason is not None:
                attributes[f"{prefix}.finish_reason"] = str(choice.finish_reason)
                finish_reasons.append(str(choice.finish_reason))
            if choice.stop_reason is not None:
                attributes[f"{prefix}.stop_reason"] = choice.stop_reason
            if choice.tool_calls:
                _put_tool_calls(attributes, prefix, [choice.tool_calls[j] for j in sorted(choice.tool_calls)])
        if finish_reasons:
            attributes[GEN_AI_RESPONSE_FINISH_REASONS] = finish_reasons
        if self.prompt_token_ids:
            attributes[PROMPT_TOKEN_IDS] = self.prompt_token_ids
        first = self.choices[min(self.choices)] if self.choices else None
        if first is not None:
            if first.token_ids:
                attributes[RESPONSE_TOKEN_IDS] = first.token_ids
            if first.logprob_entries:
                attributes[LOGPROBS_CONTENT] = _json(first.logprob_entries)
            logprobs = first.logprobs()
            if logprobs:
                attributes[RESPONSE_LOGPROBS] = logprobs
        input_tokens = _number(_get(self.usage, "prompt_tokens"))
        output_tokens = _number(_get(self.usage, "completion_tokens"))
        if input_tokens is None and self.prompt_token_ids:
            input_tokens = len(self.prompt_token_ids)
        if output_tokens is None and self.choices and all(choice.token_ids for choice in self.choices.values()):
            output_tokens = sum(len(choice.token_ids) for choice in self.choices.values())  # all choices count
        if input_tokens is not None:
            attributes[GEN_AI_USAGE_INPUT_TOKENS] = int(input_tokens)
        if output_tokens is not None:
            attributes[GEN_AI_USAGE_OUTPUT_TOKENS] = int(output_tokens)
        return _writable(attributes)


def _tool_call(call: Any) -> Dict[str, Any]:
    function = _get(call, "function")
    return {
        "id": _get(call, "id"),
        "type": _get(call, "type"),
        "function": {"name": _get(function, "name"), "arguments": _get(function, "arguments")},
    }


def _merge_tool_call(calls: Dict[int, Dict[str, Any]], fragment: Any, position: int) -> None:
    """Merge one streamed tool-call fragment: the first names the call, the next ones carry argument pieces."""
    index = _get(fragment, "index")
    slot = index if isinstance(index, int) and not isinstance(index, bool) else position
    call = calls.get(slot)
    if call is None:
        call = calls[slot] = {"id": None, "type": None, "function": {"name": None, "arguments": None}}
    for field in ("id", "type"):
        value = _get(fragment, field)
        if value:
            call[field] = value
    function = _get(fragment, "function")
    target = call["function"]
    name = _text(_get(function, "name"))
    if name and name != target["name"]:  # some servers repeat the whole name in every fragment
        target["name"] = (target["name"] or "") + name
    arguments = _text(_get(function, "arguments"))
    if arguments:
        target["arguments"] = (target["arguments"] or "") + arguments


def llm_call_attributes(
    request: Mapping[str, Any],
    response: Optional[CompletionRecord],
    *,
    operation: str = "chat",
    provider: Optional[str] = None,
) -> Dict[str, Any]:
    """All attributes of one call: :func:`request_attributes` plus the response's, when there is one.

    Args:
        request: The request's parameters.
        response: The response (complete or reassembled from a stream), None when the call got no answer.
        operation: ``"chat"`` or ``"text_completion"``.
        provider: Value of ``gen_ai.system``, if known.
    """
    attributes = request_attributes(request, operation=operation, provider=provider)
    if response is not None:
        attributes.update(response.attributes())
    return attributes
