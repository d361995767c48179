"""Instrumentation of third-party SDKs so that their calls become spans.

``instrument_all()`` patches every supported SDK that is installed; the ``*_INSTALLED`` flags say which ones are
available (checked without importing them).
"""

from __future__ import annotations

import importlib.util
import logging

__all__ = [
    "OPENAI_INSTALLED",
    "AGENTOPS_INSTALLED",
    "AGENTOPS_LANGCHAIN_INSTALLED",
    "LITELLM_INSTALLED",
    "VLLM_INSTALLED",
    "WEAVE_INSTALLED",
    "instrument_all",
    "uninstrument_all",
]

logger = logging.getLogger(__name__)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


OPENAI_INSTALLED = _installed("openai")
AGENTOPS_INSTALLED = _installed("agentops")
AGENTOPS_LANGCHAIN_INSTALLED = AGENTOPS_INSTALLED and _installed("langchain_core")
LITELLM_INSTALLED = _installed("litellm")
VLLM_INSTALLED = False  # vLLM is patched on demand by the vLLM launcher, never automatically.
WEAVE_INSTALLED = _installed("weave")


def instrument_all() -> None:
    """Instrument every supported SDK that is installed (currently the OpenAI SDK)."""
    if OPENAI_INSTALLED:
        from agentbolt.instrumentation.openai import instrument_openai

        instrument_openai()
    else:
        logger.warning("The 'openai' package is not installed; OpenAI calls will not be traced.")


def uninstrument_all() -> None:
    """Undo :func:`instrument_all`."""
    if OPENAI_INSTALLED:
        from agentbolt.instrumentation.openai import uninstrument_openai

        uninstrument_openai()
