"""Model registry: the embedded default model, local model directories and hub ids.

Importing this package is cheap; torch and transformers are imported only when a model is converted or built.
"""

from __future__ import annotations

from agentbolt.models.registry import (
    DEFAULT_MODEL,
    REGISTRY,
    ModelNotAvailableError,
    RegistryEntry,
    ResolvedModel,
    cache_root,
    find_packaged_file,
    list_models,
    model_cache_dir,
    model_info,
    pull_model,
    resolve_gguf,
    resolve_model,
)

__all__ = [
    "DEFAULT_MODEL",
    "REGISTRY",
    "ModelNotAvailableError",
    "RegistryEntry",
    "ResolvedModel",
    "cache_root",
    "create_tiny_model",
    "find_packaged_file",
    "list_models",
    "model_cache_dir",
    "model_info",
    "pull_model",
    "resolve_gguf",
    "resolve_model",
]


def __getattr__(name: str) -> object:
    if name == "create_tiny_model":
        from agentbolt.models.tiny import create_tiny_model

        return create_tiny_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
