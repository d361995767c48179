"""Request bodies of the OpenAI-compatible routes, validated with strict types.

``agentbolt serve`` and the LLM gateway validate every completion request with these models before doing any work,
so both answer the same 400 for the same mistake: ``"stream": "yes"``, ``"max_tokens": "5"``, a seed outside
64 bits, a ``tool_choice`` naming no offered tool, a malformed tool schema... Strict means no coercion: a string is
not a number and a number is not a boolean (an integer is accepted where a float is expected). ``null`` means the
field's default, as in OpenAI's API. Fields these models do not know are kept (``model_extra``): the gateway forwards
them unchanged, and serve refuses the ones it knows it cannot honour.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

__all__ = [
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "MAX_CHOICES",
    "SEED_MAX",
    "SEED_MIN",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ContentPart",
    "FunctionDefinition",
    "Location",
    "NamedToolChoice",
    "ResponseFormat",
    "SamplingRequest",
    "StreamOptions",
    "Tool",
    "ToolCall",
    "validation_failure",
    "validation_message",
]

SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
"""Seeds are 64-bit signed integers (OpenAI's and vLLM's range); choice ``i`` of a request samples with ``seed + i``."""
MAX_CHOICES = 128
"""Most choices (``n``) one prompt may ask for."""
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20
_FUNCTION_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    """``stream_options`` of a streaming request."""

    include_usage: Optional[bool] = None


class FunctionCall(_Strict):
    """The function an assistant message called."""

    name: str
    arguments: str = Field(description="The arguments as a JSON string (OpenAI's wire format).")


class ToolCall(_Strict):
    """A tool call in an assistant message of the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Strict):
    """One part of a message's content; text parts need ``text`` (other types pass through the gateway)."""

    type: str = Field(min_length=1)
    text: Optional[str] = None

    @model_validator(mode="after")
    def _text_parts_have_text(self) -> ContentPart:
        if self.type in {"text", "input_text"} and self.text is None:
            raise ValueError(f"a {self.type!r} content part needs a 'text' string")
        return self


class ChatMessage(_Strict):
    """One message of the conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, List[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None

    @model_validator(mode="after")
    def _content_is_present(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role!r} message needs 'content' (only assistant tool calls may omit it)")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs the 'tool_call_id' of the call it answers")
        return self


class FunctionDefinition(_Strict):
    """A function the model may call."""

    name: str = Field(pattern=_FUNCTION_NAME, description="Letters, digits, '_', '-' and '.', at most 64.")
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = Field(default=None, description="A JSON Schema of type 'object'.")
    strict: Optional[bool] = None

    @field_validator("parameters")
    @classmethod
    def _parameters_are_an_object_schema(cls, schema: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        if schema is None:
            return schema
        kind = schema.get("type", "object")
        if kind != "object":
            raise ValueError(f"must be a JSON Schema of type 'object', got type {kind!r}")
        properties = schema.get("properties", {})
        if not isinstance(properties, dict) or not all(isinstance(v, (dict, bool)) for v in properties.values()):
            raise ValueError("'properties' must map each parameter name to a JSON Schema object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise ValueError("'required' must be a list of parameter names")
        return schema


class Tool(_Strict):
    """A tool offered to the model (OpenAI's ``tools`` entry)."""

    type: Literal["function"]
    function: FunctionDefinition


class _ToolName(_Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(_Strict):
    """``tool_choice`` forcing one named function."""

    type: Literal["function"]
    function: _ToolName


class ResponseFormat(_Strict):
    """``response_format``: plain text or JSON output."""

    type: Literal["text", "json_object", "json_schema"]


class SamplingRequest(_Strict):
    """The fields chat and text completions share: model, sampling, stopping, streaming, token-id extensions."""

    model: Optional[str] = Field(default=None, min_length=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    n: Optional[int] = Field(default=None, ge=1, le=MAX_CHOICES)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    stop: Union[str, List[str], None] = None
    seed: Optional[int] = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[Dict[str, float]] = None
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # vLLM extensions (also understood by agentbolt serve)
    return_token_ids: Optional[bool] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: Optional[bool] = None

    @field_validator("stop")
    @classmethod
    def _stops_are_non_empty(cls, stop: Union[str, List[str], None]) -> Union[str, List[str], None]:
        stops = [stop] if isinstance(stop, str) else stop or []
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
        return stop

    @field_validator("stream_options")
    @classmethod
    def _options_of_a_stream(cls, options: Optional[StreamOptions], info: ValidationInfo) -> Optional[StreamOptions]:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids_are_non_negative(cls, ids: Optional[List[int]]) -> Optional[List[int]]:
        if ids and min(ids) < 0:
            raise ValueError(f"token ids must not be negative, got {min(ids)}")
        return ids

    @field_validator("logit_bias")
    @classmethod
    def _biases_in_range(cls, bias: Optional[Dict[str, float]]) -> Optional[Dict[str, float]]:
        for token, value in (bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {token!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias values must be between -100 and 100, got {value}")
        return bias

    @model_validator(mode="after")
    def _every_choice_has_a_seed(self) -> SamplingRequest:
        if self.seed is not None and self.seed + self.choices - 1 > SEED_MAX:
            raise ValueError(
                f"seed {self.seed} with n={self.choices} is out of range: choice i samples with seed + i, and "
                f"seed + n - 1 must be at most {SEED_MAX}"
            )
        return self

    @property
    def choices(self) -> int:
        """``n`` with its default (1)."""
        return self.n if self.n is not None else 1

    @property
    def streaming(self) -> bool:
        """Whether the answer is a server-sent event stream."""
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        """Whether a streaming response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_list(self) -> List[str]:
        """``stop`` as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingRequest):
    """Body of ``POST /v1/chat/completions``."""

    messages: List[ChatMessage] = Field(min_length=1)
    tools: Optional[List[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: Optional[Dict[str, Any]] = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, kwargs: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        reserved = sorted(set(kwargs or {}) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: the request's own fields set them, and the "
                "server's chat template is the model's (a template sent with a request could run without bound)"
            )
        return kwargs

    @model_validator(mode="after")
    def _tools_agree(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        names = [tool.function.name for tool in self.tools or []]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tools: function names must be unique, {duplicates} appear more than once")
        return self

    @field_validator("tool_choice")
    @classmethod
    def _choice_of_an_offered_tool(cls, choice: Any, info: ValidationInfo) -> Any:
        names = [tool.function.name for tool in info.data.get("tools") or []]
        if choice not in (None, "none") and not names:
            named = f"function:{choice.function.name}" if isinstance(choice, NamedToolChoice) else choice
            raise ValueError(f"tool_choice {named!r} needs 'tools'")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among the tools {names}")
        return choice

    @property
    def tool_choice_name(self) -> str:
        """``tool_choice`` as a short string: ``none``, ``auto``, ``required`` or ``function:<name>``."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return f"function:{choice.function.name}"
        return choice or ("auto" if self.tools else "none")

    def tools_enabled(self) -> bool:
        """Whether tools are offered to the model (and tool calls parsed from its output)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def max_new_tokens(self) -> Optional[int]:
        """``max_completion_tokens``, else ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


Prompt = Union[str, List[str], List[int], List[List[int]]]


RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "assistant_prefix",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "chat_template",
        "tokenizer_kwargs",
    }
)
"""``chat_template_kwargs`` keys a request may not set: the rendering's own arguments, and the template itself."""

COMPLETION_DEFAULT_MAX_TOKENS = 16
"""Tokens a text completion generates when the request does not say (or says null), as in OpenAI's API."""


class CompletionRequest(SamplingRequest):
    """Body of ``POST /v1/completions``."""

    prompt: Prompt
    max_tokens: Optional[int] = Field(default=COMPLETION_DEFAULT_MAX_TOKENS, ge=1)
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Optional[bool] = None
    best_of: Optional[int] = Field(default=None, ge=1, le=MAX_CHOICES)
    suffix: Optional[str] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, prompt: Any) -> Any:
        shape = "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists"
        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, list) or not prompt:
            raise ValueError(f"{shape} (non-empty)")
        if all(isinstance(item, str) for item in prompt):
            return prompt
        if all(_is_token_id(item) for item in prompt):
            return prompt
        if all(isinstance(item, list) and item and all(_is_token_id(t) for t in item) for item in prompt):
            return prompt
        raise ValueError(f"{shape}; token ids are non-negative integers and no list may be empty")

    def prompts(self) -> List[Union[str, List[int]]]:
        """The prompt(s) as a list of strings or token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


Location = Tuple[Union[str, int], ...]
"""Where a field is in a request: field names and list indexes, outermost first (``("messages", 0, "role")``)."""


def validation_failure(exc: ValidationError) -> Tuple[Location, str]:
    """The offending field of a failed request validation (empty for a rule across fields) and what is wrong.

    Of several errors the deepest is reported: for a union (``content`` is a string or a list of parts) pydantic
    reports every alternative, and the one that got furthest into the value says what is actually wrong.
    """
    errors = exc.errors(include_url=False)
    if not errors:
        return (), str(exc)
    first = max(errors, key=lambda error: len(error.get("loc", ())))
    # pydantic adds the name of a union member to the location; it is not a field
    location = tuple(part for part in first.get("loc", ()) if isinstance(part, int) or _is_field_name(part))
    return location, str(first.get("msg", "invalid value")).removeprefix("Value error, ")


def validation_message(exc: ValidationError) -> Tuple[str, Optional[str]]:
    """A one-line message and the offending field (``messages[0].role``) for a failed request validation (the
    error :func:`validation_failure` picks)."""
    location, message = validation_failure(exc)
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).removeprefix(".")
    return (f"{path}: {message}" if path else message), path or None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _is_field_name(part: Any) -> bool:
    """Whether a location part is a field name (not a union member such as ``str`` or ``list[int]``)."""
    return isinstance(part, str) and part.isidentifier() and part[:1].islower() and part not in _TYPE_TAGS
