"""Stand-in of vLLM's completion handler and of the little "model" both handlers share."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional


def tokenize(text: str) -> List[int]:
    """The stand-in's tokenizer: one token per character, its code point."""
    return [ord(c) for c in text]


def choice_logprobs(text: str) -> List[Dict[str, Any]]:
    """OpenAI-style logprob entries, one per token, each -0.5."""
    return [{"token": c, "logprob": -0.5, "bytes": list(c.encode()), "top_logprobs": []} for c in text]


class Request:
    """What vLLM's request models hold that the stand-in uses: the body and ``return_token_ids`` (None: unset)."""

    def __init__(self, body: Dict[str, Any]) -> None:
        self.body = body
        self.return_token_ids: Optional[bool] = body.get("return_token_ids")


class OpenAIServingCompletion:
    """Answers ``echo: <prompt>`` (cut to ``max_tokens`` characters)."""

    def __init__(self, served_names: List[str]) -> None:
        self.served_names = served_names

    async def create_completion(self, request: Request, raw_request: Optional[Any] = None) -> Dict[str, Any]:
        prompt = str(request.body.get("prompt") or "")
        text = f"echo: {prompt}"[: int(request.body.get("max_tokens") or 16)]
        choice: Dict[str, Any] = {"index": 0, "text": text, "finish_reason": "stop"}
        if request.return_token_ids:
            choice["prompt_token_ids"] = tokenize(prompt)
            choice["token_ids"] = tokenize(text)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "model": request.body.get("model"),
            "choices": [choice],
        }
