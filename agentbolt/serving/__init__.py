"""Local OpenAI-compatible inference: the transformers engine and server, and llama.cpp / vLLM launchers.

Importing this package is cheap; torch, transformers, fastapi and uvicorn load when the names below are used.
"""

from __future__ import annotations

from typing import Any, List

from agentbolt.utils.lazy import LazyExports

_LAZY = LazyExports(
    __name__,
    {
        "agentbolt.serving.params": [
            "ContextOverflowError",
            "EngineError",
            "GenerationOutput",
            "SamplingParams",
            "SequenceDelta",
            "SequenceOutput",
        ],
        "agentbolt.serving.transformers_engine": ["TransformersEngine"],
        "agentbolt.serving.server": ["InferenceServer", "create_app"],
        "agentbolt.serving.tool_parser": ["parse_tool_calls"],
    },
)

__all__ = sorted(_LAZY.names())


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)


def __dir__() -> List[str]:
    return _LAZY.dir()
