"""The OpenAI-compatible wire protocol shared by ``agentbolt serve`` and the LLM gateway.

One validation model for both servers: the request schema (pydantic, strict types), OpenAI-style error bodies,
body parsing (content type, size, UTF-8, nesting), bearer-token checks and the OpenAPI document. Importing this
package loads pydantic only; the FastAPI/Starlette helpers live in :mod:`agentbolt.openai_api.http`.
"""

from __future__ import annotations

from agentbolt.openai_api.errors import ApiError, error_body
from agentbolt.openai_api.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    validation_message,
)

__all__ = [
    "ApiError",
    "ChatCompletionRequest",
    "CompletionRequest",
    "SamplingRequest",
    "error_body",
    "validation_message",
]
