"""Local OpenAI-compatible inference: the transformers engine and server, and llama.cpp / vLLM launchers.

Importing this package is cheap; torch, transformers, fastapi and uvicorn load when the names below are used.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ContextOverflowError",
    "EngineError",
    "GenerationOutput",
    "InferenceServer",
    "SamplingParams",
    "SequenceDelta",
    "SequenceOutput",
    "TransformersEngine",
    "create_app",
    "parse_tool_calls",
]

_LOCATIONS = {
    "ContextOverflowError": "agentbolt.serving.params",
    "EngineError": "agentbolt.serving.params",
    "GenerationOutput": "agentbolt.serving.params",
    "SamplingParams": "agentbolt.serving.params",
    "SequenceDelta": "agentbolt.serving.params",
    "SequenceOutput": "agentbolt.serving.params",
    "TransformersEngine": "agentbolt.serving.transformers_engine",
    "InferenceServer": "agentbolt.serving.server",
    "create_app": "agentbolt.serving.server",
    "parse_tool_calls": "agentbolt.serving.tool_parser",
}


def __getattr__(name: str) -> Any:
    module = _LOCATIONS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
