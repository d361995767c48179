"""agentbolt: train AI agents from the traces of their LLM calls.

``import agentbolt as agl`` exposes the top-level names of Agent Lightning v0.3, plus ``GRPO``, ``SFT``,
``ParetoAPO``, ``FewShotAPO`` and ``SqliteLightningStore``. Each name is imported on first access, so ``import agentbolt`` stays fast and pulls in no
heavy dependency; type checkers and IDEs see the same names as ordinary imports (the ``TYPE_CHECKING`` block below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from agentbolt.utils.lazy import LazyExports

__version__ = "0.3.1"

# Where each exported name lives at run time. ``__all__`` and the TYPE_CHECKING block below list the same names
# statically, for type checkers; tests/test_public_names.py checks that the three agree.
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
    "agentbolt.algorithm": ["Algorithm", "algo", "FastAlgorithm", "Baseline", "APO", "VERL"],
    "agentbolt.algorithm.apo": ["ParetoAPO", "FewShotAPO"],
    "agentbolt.algorithm.grpo": ["GRPO"],
    "agentbolt.algorithm.sft": ["SFT"],
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
    "agentbolt.env_var": ["LightningEnvVar", "resolve_bool_env_var", "resolve_int_env_var", "resolve_str_env_var"],
    "agentbolt.execution": [
        "ExecutionStrategy",
        "ClientServerExecutionStrategy",
        "ExecutionEvent",
        "ThreadingEvent",
        "MultiprocessingEvent",
        "SharedMemoryExecutionStrategy",
        "RayExecutionStrategy",
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
    "agentbolt.store.sqlite": ["SqliteLightningStore"],
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
_RENAMED: Dict[str, Tuple[str, str]] = {
    "configure_logger": ("agentbolt.logging", "configure_logger"),
    "setup_logging": ("agentbolt.logging", "setup"),
    "setup_module_logging": ("agentbolt.logging", "setup_module"),
}

_LAZY = LazyExports(__name__, _EXPORTS, renamed=_RENAMED)

__all__ = [
    "__version__",
    # agentbolt.adapter
    "TraceAdapter",
    "OtelTraceAdapter",
    "Adapter",
    "TraceToTripletBase",
    "TracerTraceToTriplet",
    "LlmProxyTraceToTriplet",
    "TraceToMessages",
    # agentbolt.algorithm
    "Algorithm",
    "algo",
    "FastAlgorithm",
    "Baseline",
    "APO",
    "VERL",
    # agentbolt.algorithm.apo
    "ParetoAPO",
    "FewShotAPO",
    # agentbolt.algorithm.grpo
    "GRPO",
    # agentbolt.algorithm.sft
    "SFT",
    # agentbolt.client
    "AgentLightningClient",
    "DevTaskLoader",
    # agentbolt.server
    "AgentLightningServer",
    # agentbolt.config
    "lightning_cli",
    # agentbolt.emitter
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
    # agentbolt.env_var
    "LightningEnvVar",
    "resolve_bool_env_var",
    "resolve_int_env_var",
    "resolve_str_env_var",
    # agentbolt.execution
    "ExecutionStrategy",
    "ClientServerExecutionStrategy",
    "ExecutionEvent",
    "ThreadingEvent",
    "MultiprocessingEvent",
    "SharedMemoryExecutionStrategy",
    "RayExecutionStrategy",
    # agentbolt.litagent
    "LitAgent",
    "llm_rollout",
    "prompt_rollout",
    "rollout",
    # agentbolt.llm_proxy
    "LLMProxy",
    # agentbolt.runner
    "Runner",
    "LegacyAgentRunner",
    "LitAgentRunner",
    # agentbolt.store
    "LightningStore",
    "LightningStoreCapabilities",
    "LightningStoreStatistics",
    "LightningStoreClient",
    "LightningStoreServer",
    "InMemoryLightningStore",
    "CollectionBasedLightningStore",
    "LightningStoreThreaded",
    # agentbolt.store.sqlite
    "SqliteLightningStore",
    # agentbolt.tracer
    "AgentOpsTracer",
    "Tracer",
    "OtelTracer",
    "DummyTracer",
    "get_active_tracer",
    "set_active_tracer",
    "clear_active_tracer",
    # agentbolt.trainer
    "Trainer",
    "build_component",
    # agentbolt.types
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
    # agentbolt.logging
    "configure_logger",
    "setup_logging",
    "setup_module_logging",
]

if TYPE_CHECKING:
    from agentbolt.adapter import (
        Adapter,
        LlmProxyTraceToTriplet,
        OtelTraceAdapter,
        TraceAdapter,
        TracerTraceToTriplet,
        TraceToMessages,
        TraceToTripletBase,
    )
    from agentbolt.algorithm import APO, VERL, Algorithm, Baseline, FastAlgorithm, algo
    from agentbolt.algorithm.apo import FewShotAPO, ParetoAPO
    from agentbolt.algorithm.grpo.algorithm import GRPO  # what agentbolt.algorithm.grpo.GRPO loads
    from agentbolt.algorithm.sft.algorithm import SFT  # what agentbolt.algorithm.sft.SFT loads
    from agentbolt.client import AgentLightningClient, DevTaskLoader
    from agentbolt.config import lightning_cli
    from agentbolt.emitter import (
        emit_annotation,
        emit_exception,
        emit_message,
        emit_object,
        emit_reward,
        find_final_reward,
        find_reward_spans,
        get_message_value,
        get_object_value,
        get_reward_value,
        get_rewards_from_span,
        is_reward_span,
        operation,
        reward,
    )
    from agentbolt.env_var import LightningEnvVar, resolve_bool_env_var, resolve_int_env_var, resolve_str_env_var
    from agentbolt.execution import (
        ClientServerExecutionStrategy,
        ExecutionEvent,
        ExecutionStrategy,
        MultiprocessingEvent,
        RayExecutionStrategy,
        SharedMemoryExecutionStrategy,
        ThreadingEvent,
    )
    from agentbolt.litagent import LitAgent, llm_rollout, prompt_rollout, rollout
    from agentbolt.llm_proxy import LLMProxy
    from agentbolt.logging import configure_logger
    from agentbolt.logging import setup as setup_logging
    from agentbolt.logging import setup_module as setup_module_logging
    from agentbolt.runner import LegacyAgentRunner, LitAgentRunner, Runner
    from agentbolt.server import AgentLightningServer
    from agentbolt.store import (
        CollectionBasedLightningStore,
        InMemoryLightningStore,
        LightningStore,
        LightningStoreCapabilities,
        LightningStoreClient,
        LightningStoreServer,
        LightningStoreStatistics,
        LightningStoreThreaded,
    )
    from agentbolt.store.sqlite import SqliteLightningStore
    from agentbolt.tracer import (
        AgentOpsTracer,
        DummyTracer,
        OtelTracer,
        Tracer,
        clear_active_tracer,
        get_active_tracer,
        set_active_tracer,
    )
    from agentbolt.trainer import Trainer, build_component
    from agentbolt.types import (
        LLM,
        Attempt,
        AttemptedRollout,
        AttemptStatus,
        Attributes,
        AttributeValue,
        Dataset,
        EnqueueRolloutRequest,
        Event,
        FilterField,
        FilterOptions,
        GenericResponse,
        Hook,
        Link,
        NamedResources,
        OtelResource,
        PaginatedResult,
        ParallelWorkerBase,
        PromptTemplate,
        ProxyLLM,
        Resource,
        ResourcesUpdate,
        ResourceUnion,
        Rollout,
        RolloutConfig,
        RolloutLegacy,
        RolloutMode,
        RolloutRawResult,
        RolloutRawResultLegacy,
        RolloutStatus,
        SortOptions,
        Span,
        SpanAttributeNames,
        SpanContext,
        SpanCoreFields,
        SpanLike,
        SpanNames,
        SpanRecordingContext,
        StatusCode,
        Task,
        TaskIfAny,
        TaskInput,
        TraceState,
        TraceStatus,
        Triplet,
        Worker,
        WorkerStatus,
    )
else:
    # Defined only at run time, so that type checkers report a misspelt name instead of typing it as Any.

    def __getattr__(name: str) -> Any:
        """Import an exported name on first access."""
        return _LAZY.load(name)

    def __dir__() -> List[str]:
        return _LAZY.dir()
