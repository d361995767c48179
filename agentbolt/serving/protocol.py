"""From validated OpenAI requests (:mod:`agentbolt.openai_api.schema`) to the engine's sampling parameters.

The schema checks types and ranges for ``agentbolt serve`` and the gateway alike; this module adds what only this
server decides: which OpenAI and vLLM features it cannot honour (refused with 400 instead of silently ignored) and
how the others map onto :class:`~agentbolt.serving.params.SamplingParams`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from pydantic import BaseModel, ConfigDict, Field

from agentbolt.openai_api.errors import ApiError
from agentbolt.openai_api.schema import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    SamplingRequest,
)
from agentbolt.serving.chat_prompt import template_message
from agentbolt.serving.guided import choice_pattern
from agentbolt.serving.params import EngineError, SamplingParams
from agentbolt.serving.tool_parser import forced_tool_call

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "LoadLoraRequest",
    "UnloadLoraRequest",
    "chat_sampling_params",
    "completion_sampling_params",
    "demanded_tool_call",
    "normalize_messages",
]

# vLLM sampling extensions this server does not implement, with the values that mean "off".
_UNSUPPORTED_EXTRAS: Dict[str, tuple] = {
    "top_k": (None, 0, -1),
    "min_p": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_tokens": (None, 0),
    "guided_json": (None,),
    "guided_grammar": (None,),
}


def _unsupported(param: str, detail: str = "") -> ApiError:
    return ApiError(400, f"{param}{detail} is not supported by this server", param=param, code="unsupported_parameter")


def _check_supported(body: SamplingRequest) -> None:
    if body.presence_penalty:
        raise _unsupported("presence_penalty")
    if body.frequency_penalty:
        raise _unsupported("frequency_penalty")
    if body.logit_bias:
        raise _unsupported("logit_bias")
    if body.response_format is not None and body.response_format.type != "text":
        raise _unsupported("response_format", f" of type {body.response_format.type!r}")
    for name, off in _UNSUPPORTED_EXTRAS.items():
        value = (body.model_extra or {}).get(name)
        if value not in off or isinstance(value, bool):
            raise _unsupported(name)


def _guided_regex(body: SamplingRequest) -> Optional[str]:
    """vLLM's ``guided_regex`` or ``guided_choice`` (one of them) as one regular expression."""
    extra = body.model_extra or {}
    regex, choices = extra.get("guided_regex"), extra.get("guided_choice")
    if regex is not None and choices is not None:
        raise ApiError(400, "give guided_regex or guided_choice, not both", param="guided_regex")
    if choices is not None:
        if not isinstance(choices, list):
            raise ApiError(400, "guided_choice must be a list of strings", param="guided_choice")
        try:
            return choice_pattern(choices)
        except EngineError as exc:
            raise ApiError(400, str(exc), param="guided_choice") from None
    if regex is not None and not isinstance(regex, str):
        raise ApiError(400, "guided_regex must be a string", param="guided_regex")
    return regex


def _sampling(body: SamplingRequest, max_tokens: Optional[int], logprobs: bool, top_logprobs: int) -> SamplingParams:
    _check_supported(body)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        n=body.choices,
        stop=body.stop_list,
        stop_token_ids=list(body.stop_token_ids or []),
        seed=body.seed,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=bool(body.ignore_eos),
        guided_regex=_guided_regex(body),
    )


def demanded_tool_call(body: ChatCompletionRequest) -> Optional[Tuple[str, str]]:
    """The opening and guided-decoding pattern of the tool call ``tool_choice`` demands (``"required"`` or a named
    function; see :func:`~agentbolt.serving.tool_parser.forced_tool_call`), or None when it demands none."""
    choice = body.tool_choice
    if choice != "required" and not isinstance(choice, NamedToolChoice):
        return None
    names = [tool.function.name for tool in body.tools or []]
    name = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return forced_tool_call(names, name, parallel=body.parallel_tool_calls is not False)


def chat_sampling_params(body: ChatCompletionRequest) -> SamplingParams:
    """Engine parameters of a chat request.

    A ``tool_choice`` that demands a call guides the answer into a call of a declared tool (of the named one).

    Raises:
        ApiError: 400 for a feature this server does not implement, or one that cannot be combined with a demanded
            tool call (``guided_regex``, ``guided_choice``, ``ignore_eos``).
    """
    params = _sampling(body, body.max_new_tokens, bool(body.logprobs), body.top_logprobs or 0)
    demanded = demanded_tool_call(body)
    if demanded is None:
        return params
    choice = body.tool_choice_name
    if params.guided_regex is not None:
        raise ApiError(
            400,
            f"guided_regex and guided_choice cannot be combined with tool_choice {choice!r}, which guides the answer "
            "into a tool call",
            param="tool_choice",
        )
    if params.ignore_eos:
        raise ApiError(
            400,
            f"ignore_eos cannot be combined with tool_choice {choice!r}: the tool call ends the answer",
            param="ignore_eos",
        )
    params.guided_regex = demanded[1]
    return params


def completion_sampling_params(body: CompletionRequest) -> SamplingParams:
    """Engine parameters of a text completion request.

    Raises:
        ApiError: 400 for a feature this server does not implement.
    """
    if body.echo:
        raise _unsupported("echo")
    if body.suffix:
        raise _unsupported("suffix")
    if body.best_of is not None and body.best_of != body.choices:
        raise _unsupported("best_of", " different from n")
    # An explicit null means the default, as in OpenAI's API: 16 for text completions (not the rest of the context).
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
    return _sampling(body, max_tokens, body.logprobs is not None, body.logprobs or 0)


def normalize_messages(body: ChatCompletionRequest) -> List[Dict[str, Any]]:
    """The conversation as chat templates expect it: text content, ``developer`` as ``system``.

    Raises:
        ApiError: 400 for content this server cannot read (images, audio, files) or the legacy ``function`` role.
    """
    normalized = []
    for position, message in enumerate(body.messages):
        if message.role == "function":
            raise ApiError(400, f"messages[{position}]: the legacy 'function' role is not supported; use 'tool'")
        try:
            normalized.append(template_message(message.model_dump(exclude_none=True)))
        except ValueError as exc:
            raise ApiError(400, f"messages[{position}].{exc}", param="messages") from None
    return normalized


class LoadLoraRequest(BaseModel):
    """Body of ``POST /v1/load_lora_adapter`` (vLLM-compatible)."""

    model_config = ConfigDict(strict=True, extra="allow")

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraRequest(BaseModel):
    """Body of ``POST /v1/unload_lora_adapter`` (vLLM-compatible)."""

    model_config = ConfigDict(strict=True, extra="allow")

    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: Optional[int] = None
