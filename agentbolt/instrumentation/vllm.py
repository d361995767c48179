"""vLLM's OpenAI-compatible server, instrumented so that every chat and completion response carries token ids.

vLLM (0.10.2 and later) returns ``prompt_token_ids`` and each choice's ``token_ids`` when a request sets
``return_token_ids``. The agentbolt gateway always sets it; :func:`instrument_vllm` makes it the server's default,
so calls that reach vLLM without the gateway (an agent pointed straight at the server, a trainer's own rollouts)
carry token ids too. A request that sends ``"return_token_ids": false`` still gets none.

The patch wraps the request handlers of the API server process (``OpenAIServingChat.create_chat_completion`` and
``OpenAIServingCompletion.create_completion``). It applies to ``vllm serve`` run in this process with one API server
(the default; ``agentbolt vllm serve`` does this), not to API server processes vLLM spawns for
``--api-server-count`` above 1.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from typing import Any, Callable, Dict, List, Tuple

__all__ = ["instrument_vllm", "is_vllm_instrumented", "uninstrument_vllm"]

logger = logging.getLogger(__name__)

HANDLERS: Tuple[Tuple[str, str, str], ...] = (
    # vLLM 0.12 and later
    ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "create_chat_completion"),
    ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "create_completion"),
    # vLLM 0.10.2 - 0.11
    ("vllm.entrypoints.openai.serving_chat", "OpenAIServingChat", "create_chat_completion"),
    ("vllm.entrypoints.openai.serving_completion", "OpenAIServingCompletion", "create_completion"),
)
"""(module, class, method) of the request handlers that are wrapped, for each layout of vLLM's modules."""

_ORIGINALS: Dict[Tuple[type, str], Callable[..., Any]] = {}


def default_token_ids(request: Any) -> Any:
    """Ask for token ids on ``request`` unless it decided itself (``return_token_ids`` left unset)."""
    if getattr(request, "return_token_ids", False) is None:
        request.return_token_ids = True
    return request


def _wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    async def with_token_ids(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        return await handler(self, default_token_ids(request), *args, **kwargs)

    return with_token_ids


def _handler_classes() -> List[Tuple[type, str]]:
    found: List[Tuple[type, str]] = []
    for module_name, class_name, method in HANDLERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, class_name, None)
        if isinstance(cls, type) and callable(getattr(cls, method, None)):
            found.append((cls, method))
    return found


def is_vllm_instrumented() -> bool:
    """Whether :func:`instrument_vllm` is in effect."""
    return bool(_ORIGINALS)


def instrument_vllm() -> None:
    """Make vLLM's chat and completion handlers return token ids unless a request opts out.

    Calling it again while instrumented logs a warning and changes nothing.

    Raises:
        ImportError: vLLM is not installed (``pip install 'agentbolt[vllm]'``).
        RuntimeError: This vLLM has none of the known handlers (older than 0.10.2, or a new layout).
    """
    if importlib.util.find_spec("vllm") is None:
        raise ImportError("vLLM is not installed: pip install 'agentbolt[vllm]' (needs a CUDA GPU)")
    if _ORIGINALS:
        logger.warning("vLLM is already instrumented; nothing changed.")
        return
    handlers = _handler_classes()
    if not handlers:
        raise RuntimeError(
            "This vLLM has no known chat/completion handler to instrument (token ids need vLLM 0.10.2 or later)."
        )
    for cls, method in handlers:
        original = getattr(cls, method)
        _ORIGINALS[(cls, method)] = original
        setattr(cls, method, _wrap(original))
    logger.info("vLLM instrumented: %s", ", ".join(f"{cls.__name__}.{method}" for cls, method in handlers))


def uninstrument_vllm() -> None:
    """Undo :func:`instrument_vllm` (a no-op when it is not in effect)."""
    while _ORIGINALS:
        (cls, method), original = _ORIGINALS.popitem()
        setattr(cls, method, original)
