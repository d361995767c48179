"""Response bodies of the OpenAI-compatible routes, as documented in the servers' OpenAPI documents.

These models describe what ``agentbolt serve`` and the gateway answer (the gateway passes its backend's answer
through, so it documents the same shapes); they are not used to build the answers, which would cost time on every
request. Extra keys are allowed everywhere, as OpenAI adds fields over time.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "Completion",
    "ErrorResponse",
    "ModelList",
    "Usage",
]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Open):
    """What went wrong."""

    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = Field(
        default=None,
        description="A short code naming the failure (model_not_found, context_length_exceeded...), or null.",
    )


class ErrorResponse(_Open):
    """Every error answer: ``{"error": {...}}``."""

    error: ErrorDetail


class Usage(_Open):
    """Token counts of a request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCallOut(_Open):
    """A called function and its arguments (a JSON string)."""

    name: str
    arguments: str


class ToolCallOut(_Open):
    """A tool call the model made."""

    id: str
    type: Literal["function"]
    function: FunctionCallOut
    index: Optional[int] = Field(default=None, description="Position among the choice's calls (streaming only).")


class TopLogprob(_Open):
    """An alternative token at one position."""

    token: str
    logprob: float
    bytes: Optional[List[int]] = None


class TokenLogprob(TopLogprob):
    """The log-probability of one generated token and its most likely alternatives."""

    top_logprobs: List[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Open):
    """Log-probabilities of a chat choice's tokens."""

    content: Optional[List[TokenLogprob]] = None


class AssistantMessage(_Open):
    """The generated message."""

    role: Literal["assistant"]
    content: Optional[str] = None
    tool_calls: Optional[List[ToolCallOut]] = None


class ChatChoice(_Open):
    """One generated choice."""

    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = Field(default=None, description="stop, length, tool_calls or abort.")
    stop_reason: Union[int, str, None] = Field(
        default=None,
        description="What ended a stop choice other than an EOS token: the stop string matched or the stop token id "
        "(vLLM's stop_reason; on the last chunk when streaming).",
    )
    token_ids: Optional[List[int]] = Field(default=None, description="Generated token ids (return_token_ids).")


class ChatCompletion(_Open):
    """Answer of ``POST /v1/chat/completions`` without streaming."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: List[ChatChoice]
    usage: Optional[Usage] = None
    prompt_token_ids: Optional[List[int]] = Field(default=None, description="Prompt token ids (return_token_ids).")


class ChunkDelta(_Open):
    """What one streamed chunk adds to a choice."""

    role: Optional[str] = None
    content: Optional[str] = None
    tool_calls: Optional[List[ToolCallOut]] = None


class ChunkChoice(_Open):
    """One choice's part of a streamed chunk."""

    index: int
    delta: ChunkDelta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    token_ids: Optional[List[int]] = None


class ChatCompletionChunk(_Open):
    """One ``data:`` event of a streamed chat completion (the stream ends with ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: List[ChunkChoice]
    usage: Optional[Usage] = None
    prompt_token_ids: Optional[List[int]] = None


class CompletionLogprobs(_Open):
    """Log-probabilities of a text completion choice."""

    tokens: List[str]
    token_logprobs: List[Optional[float]]
    top_logprobs: Optional[List[Dict[str, float]]] = None
    text_offset: List[int]


class CompletionChoice(_Open):
    """One generated text."""

    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    token_ids: Optional[List[int]] = None
    prompt_token_ids: Optional[List[int]] = None


class Completion(_Open):
    """Answer of ``POST /v1/completions`` (also the shape of each streamed ``data:`` event)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: List[CompletionChoice]
    usage: Optional[Usage] = None


class ModelCard(_Open):
    """A served model (or a loaded LoRA adapter, whose ``parent`` is the served model)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: Optional[str] = None
    parent: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(_Open):
    """Answer of ``GET /v1/models``."""

    object: Literal["list"]
    data: List[ModelCard]


class StatusResponse(_Open):
    """A health or status answer: ``status`` plus details that depend on the server."""

    status: str


def sse_description(event_model: type[BaseModel]) -> str:
    """The OpenAPI description of a stream whose events are ``event_model`` objects."""
    return (
        f'With "stream": true, a text/event-stream of `data: <{event_model.__name__}>` events ending with '
        '`data: [DONE]` (an `{"error": ...}` event first if generation fails midway).'
    )


def schema_ref(name: str) -> Dict[str, Any]:
    """A ``$ref`` to a component schema."""
    return {"$ref": f"#/components/schemas/{name}"}
