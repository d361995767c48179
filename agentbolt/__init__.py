"""agentbolt: train AI agents from the traces of their LLM calls.

``import agentbolt as agl`` exposes the same top-level names as Agent Lightning v0.3. Every name is imported lazily
on first access, so ``import agentbolt`` stays fast and pulls in no heavy dependency.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

__version__ = "0.3.1"

_EXPORTS: Dict[str, List[str]] = {
    "agentbolt.adapter": [
        "TraceAdapter",
        "OtelTraceAdapter",
        "Adapter",
        "TraceToTripletBase",
        "TracerTraceToTriplet",
        "LlmProxyTraceToTriplet",
        "TraceToMessages",
    ],
    "agentbolt.algorithm": ["Algorithm", "algo", "FastAlgorithm", "Baseline", "APO", "VERL", "GRPO"],
    "agentbolt.client": ["AgentLightningClient", "DevTaskLoader"],
    "agentbolt.server": ["AgentLightningServer"],
    "agentbolt.config": ["lightning_cli"],
    "agentbolt.emitter": [
        "reward",
        "operation",
        "emit_reward",
        "get_reward_value",
        "get_rewards_from_span",
        "is_reward_span",
        "find_reward_spans",
        "find_final_reward",
        "emit_message",
        "emit_object",
        "emit_exception",
        "emit_annotation",
        "get_message_value",
        "get_object_value",
    ],
    "agentbolt.env_var": [
        "LightningEnvVar",
        "resolve_bool_env_var",
        "resolve_int_env_var",
        "resolve_str_env_var",
    ],
    "agentbolt.execution": [
        "ExecutionStrategy",
        "ClientServerExecutionStrategy",
        "ExecutionEvent",
        "ThreadingEvent",
        "MultiprocessingEvent",
        "SharedMemoryExecutionStrategy",
    ],
    "agentbolt.litagent": ["LitAgent", "llm_rollout", "prompt_rollout", "rollout"],
    "agentbolt.llm_proxy": ["LLMProxy"],
    "agentbolt.runner": ["Runner", "LegacyAgentRunner", "LitAgentRunner"],
    "agentbolt.store": [
        "LightningStore",
        "LightningStoreCapabilities",
        "LightningStoreStatistics",
        "LightningStoreClient",
        "LightningStoreServer",
        "InMemoryLightningStore",
        "CollectionBasedLightningStore",
        "LightningStoreThreaded",
    ],
    "agentbolt.tracer": [
        "AgentOpsTracer",
        "Tracer",
        "OtelTracer",
        "DummyTracer",
        "get_active_tracer",
        "set_active_tracer",
        "clear_active_tracer",
    ],
    "agentbolt.trainer": ["Trainer", "build_component"],
    "agentbolt.types": [
        "Triplet",
        "RolloutLegacy",
        "Task",
        "TaskInput",
        "TaskIfAny",
        "RolloutRawResultLegacy",
        "RolloutRawResult",
        "RolloutMode",
        "GenericResponse",
        "ParallelWorkerBase",
        "Dataset",
        "AttemptStatus",
        "RolloutStatus",
        "RolloutConfig",
        "Rollout",
        "Attempt",
        "AttemptedRollout",
        "EnqueueRolloutRequest",
        "Hook",
        "Worker",
        "WorkerStatus",
        "PaginatedResult",
        "FilterOptions",
        "SortOptions",
        "FilterField",
        "Resource",
        "LLM",
        "ProxyLLM",
        "PromptTemplate",
        "ResourceUnion",
        "NamedResources",
        "ResourcesUpdate",
        "AttributeValue",
        "Attributes",
        "TraceState",
        "SpanContext",
        "TraceStatus",
        "Event",
        "Link",
        "OtelResource",
        "Span",
        "SpanNames",
        "SpanAttributeNames",
        "SpanLike",
        "StatusCode",
        "SpanCoreFields",
        "SpanRecordingContext",
    ],
}

# Names whose attribute in the source module differs from the exported name.
_RENAMED: Dict[str, tuple[str, str]] = {
    "configure_logger": ("agentbolt.logging", "configure_logger"),
    "setup_logging": ("agentbolt.logging", "setup"),
    "setup_module_logging": ("agentbolt.logging", "setup_module"),
}

_NAME_TO_MODULE: Dict[str, tuple[str, str]] = {
    name: (module, name) for module, names in _EXPORTS.items() for name in names
}
_NAME_TO_MODULE.update(_RENAMED)

__all__ = ["__version__", *sorted(_NAME_TO_MODULE)]


def __getattr__(name: str) -> Any:
    """Import an exported name on first access."""
    try:
        module_name, attribute = _NAME_TO_MODULE[name]
    except KeyError:
        raise AttributeError(f"module 'agentbolt' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_NAME_TO_MODULE))


if TYPE_CHECKING:  # pragma: no cover - static analysers see the eager imports
    from agentbolt.types import *  # noqa: F403
