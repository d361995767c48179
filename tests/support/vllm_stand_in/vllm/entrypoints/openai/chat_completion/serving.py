"""Stand-in of vLLM's chat handler: ``OpenAIServingChat.create_chat_completion`` at vLLM's module path."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional

from vllm.entrypoints.openai.completion.serving import Request, choice_logprobs, tokenize


class OpenAIServingChat:
    """Answers ``echo: <last user message>`` (cut to ``max_tokens`` characters)."""

    def __init__(self, served_names: List[str]) -> None:
        self.served_names = served_names

    async def create_chat_completion(self, request: Request, raw_request: Optional[Any] = None) -> Dict[str, Any]:
        messages = request.body.get("messages") or []
        prompt = "".join(f"<{m.get('role')}>{m.get('content') or ''}" for m in messages) + "<assistant>"
        last_user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        text = f"echo: {last_user}"[: int(request.body.get("max_tokens") or 16)]
        choice: Dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        if request.body.get("logprobs"):
            choice["logprobs"] = {"content": choice_logprobs(text)}
        response: Dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "model": request.body.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(text)},
        }
        if request.return_token_ids:
            response["prompt_token_ids"] = tokenize(prompt)
            choice["token_ids"] = tokenize(text)
        return response
