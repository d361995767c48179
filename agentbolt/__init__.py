"""agentbolt: train AI agents from the traces of their LLM calls.

``import agentbolt as agl`` exposes the top-level names of Agent Lightning v0.3, plus ``GRPO``, ``SFT``,
``ParetoAPO``, ``FewShotAPO`` and ``SqliteLightningStore``. Each name is imported on first access, so ``import agentbolt`` stays fast and pulls in no
heavy dependency; type checkers and IDEs see the same names as ordinary imports (the ``TYPE_CHECKING`` block below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

from agentbolt.utils.lazy import LazyExports

__version__ = "0.3.1"

# Where each exported name lives at run time; ``__all__`` is built from it. The TYPE_CHECKING block below imports the
# same names statically for type checkers, each as an explicit re-export (``import X as X``), so no static
# ``__all__`` is needed; tests/test_public_names.py checks that the two agree.
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
    "agentbolt.logging": ["configure_logger", "setup_logging", "setup_module_logging"],
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

_LAZY = LazyExports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from agentbolt.adapter import Adapter as Adapter
    from agentbolt.adapter import LlmProxyTraceToTriplet as LlmProxyTraceToTriplet
    from agentbolt.adapter import OtelTraceAdapter as OtelTraceAdapter
    from agentbolt.adapter import TraceAdapter as TraceAdapter
    from agentbolt.adapter import TracerTraceToTriplet as TracerTraceToTriplet
    from agentbolt.adapter import TraceToMessages as TraceToMessages
    from agentbolt.adapter import TraceToTripletBase as TraceToTripletBase
    from agentbolt.algorithm import APO as APO
    from agentbolt.algorithm import VERL as VERL
    from agentbolt.algorithm import Algorithm as Algorithm
    from agentbolt.algorithm import Baseline as Baseline
    from agentbolt.algorithm import FastAlgorithm as FastAlgorithm
    from agentbolt.algorithm import algo as algo
    from agentbolt.algorithm.apo import FewShotAPO as FewShotAPO
    from agentbolt.algorithm.apo import ParetoAPO as ParetoAPO
    from agentbolt.algorithm.grpo.algorithm import GRPO as GRPO  # what agentbolt.algorithm.grpo.GRPO loads
    from agentbolt.algorithm.sft.algorithm import SFT as SFT  # what agentbolt.algorithm.sft.SFT loads
    from agentbolt.client import AgentLightningClient as AgentLightningClient
    from agentbolt.client import DevTaskLoader as DevTaskLoader
    from agentbolt.config import lightning_cli as lightning_cli
    from agentbolt.emitter import emit_annotation as emit_annotation
    from agentbolt.emitter import emit_exception as emit_exception
    from agentbolt.emitter import emit_message as emit_message
    from agentbolt.emitter import emit_object as emit_object
    from agentbolt.emitter import emit_reward as emit_reward
    from agentbolt.emitter import find_final_reward as find_final_reward
    from agentbolt.emitter import find_reward_spans as find_reward_spans
    from agentbolt.emitter import get_message_value as get_message_value
    from agentbolt.emitter import get_object_value as get_object_value
    from agentbolt.emitter import get_reward_value as get_reward_value
    from agentbolt.emitter import get_rewards_from_span as get_rewards_from_span
    from agentbolt.emitter import is_reward_span as is_reward_span
    from agentbolt.emitter import operation as operation
    from agentbolt.emitter import reward as reward
    from agentbolt.env_var import LightningEnvVar as LightningEnvVar
    from agentbolt.env_var import resolve_bool_env_var as resolve_bool_env_var
    from agentbolt.env_var import resolve_int_env_var as resolve_int_env_var
    from agentbolt.env_var import resolve_str_env_var as resolve_str_env_var
    from agentbolt.execution import ClientServerExecutionStrategy as ClientServerExecutionStrategy
    from agentbolt.execution import ExecutionEvent as ExecutionEvent
    from agentbolt.execution import ExecutionStrategy as ExecutionStrategy
    from agentbolt.execution import MultiprocessingEvent as MultiprocessingEvent
    from agentbolt.execution import RayExecutionStrategy as RayExecutionStrategy
    from agentbolt.execution import SharedMemoryExecutionStrategy as SharedMemoryExecutionStrategy
    from agentbolt.execution import ThreadingEvent as ThreadingEvent
    from agentbolt.litagent import LitAgent as LitAgent
    from agentbolt.litagent import llm_rollout as llm_rollout
    from agentbolt.litagent import prompt_rollout as prompt_rollout
    from agentbolt.litagent import rollout as rollout
    from agentbolt.llm_proxy import LLMProxy as LLMProxy
    from agentbolt.logging import configure_logger as configure_logger
    from agentbolt.logging import setup_logging as setup_logging
    from agentbolt.logging import setup_module_logging as setup_module_logging
    from agentbolt.runner import LegacyAgentRunner as LegacyAgentRunner
    from agentbolt.runner import LitAgentRunner as LitAgentRunner
    from agentbolt.runner import Runner as Runner
    from agentbolt.server import AgentLightningServer as AgentLightningServer
    from agentbolt.store import CollectionBasedLightningStore as CollectionBasedLightningStore
    from agentbolt.store import InMemoryLightningStore as InMemoryLightningStore
    from agentbolt.store import LightningStore as LightningStore
    from agentbolt.store import LightningStoreCapabilities as LightningStoreCapabilities
    from agentbolt.store import LightningStoreClient as LightningStoreClient
    from agentbolt.store import LightningStoreServer as LightningStoreServer
    from agentbolt.store import LightningStoreStatistics as LightningStoreStatistics
    from agentbolt.store import LightningStoreThreaded as LightningStoreThreaded
    from agentbolt.store.sqlite import SqliteLightningStore as SqliteLightningStore
    from agentbolt.tracer import AgentOpsTracer as AgentOpsTracer
    from agentbolt.tracer import DummyTracer as DummyTracer
    from agentbolt.tracer import OtelTracer as OtelTracer
    from agentbolt.tracer import Tracer as Tracer
    from agentbolt.tracer import clear_active_tracer as clear_active_tracer
    from agentbolt.tracer import get_active_tracer as get_active_tracer
    from agentbolt.tracer import set_active_tracer as set_active_tracer
    from agentbolt.trainer import Trainer as Trainer
    from agentbolt.trainer import build_component as build_component
    from agentbolt.types import LLM as LLM
    from agentbolt.types import Attempt as Attempt
    from agentbolt.types import AttemptedRollout as AttemptedRollout
    from agentbolt.types import AttemptStatus as AttemptStatus
    from agentbolt.types import Attributes as Attributes
    from agentbolt.types import AttributeValue as AttributeValue
    from agentbolt.types import Dataset as Dataset
    from agentbolt.types import EnqueueRolloutRequest as EnqueueRolloutRequest
    from agentbolt.types import Event as Event
    from agentbolt.types import FilterField as FilterField
    from agentbolt.types import FilterOptions as FilterOptions
    from agentbolt.types import GenericResponse as GenericResponse
    from agentbolt.types import Hook as Hook
    from agentbolt.types import Link as Link
    from agentbolt.types import NamedResources as NamedResources
    from agentbolt.types import OtelResource as OtelResource
    from agentbolt.types import PaginatedResult as PaginatedResult
    from agentbolt.types import ParallelWorkerBase as ParallelWorkerBase
    from agentbolt.types import PromptTemplate as PromptTemplate
    from agentbolt.types import ProxyLLM as ProxyLLM
    from agentbolt.types import Resource as Resource
    from agentbolt.types import ResourcesUpdate as ResourcesUpdate
    from agentbolt.types import ResourceUnion as ResourceUnion
    from agentbolt.types import Rollout as Rollout
    from agentbolt.types import RolloutConfig as RolloutConfig
    from agentbolt.types import RolloutLegacy as RolloutLegacy
    from agentbolt.types import RolloutMode as RolloutMode
    from agentbolt.types import RolloutRawResult as RolloutRawResult
    from agentbolt.types import RolloutRawResultLegacy as RolloutRawResultLegacy
    from agentbolt.types import RolloutStatus as RolloutStatus
    from agentbolt.types import SortOptions as SortOptions
    from agentbolt.types import Span as Span
    from agentbolt.types import SpanAttributeNames as SpanAttributeNames
    from agentbolt.types import SpanContext as SpanContext
    from agentbolt.types import SpanCoreFields as SpanCoreFields
    from agentbolt.types import SpanLike as SpanLike
    from agentbolt.types import SpanNames as SpanNames
    from agentbolt.types import SpanRecordingContext as SpanRecordingContext
    from agentbolt.types import StatusCode as StatusCode
    from agentbolt.types import Task as Task
    from agentbolt.types import TaskIfAny as TaskIfAny
    from agentbolt.types import TaskInput as TaskInput
    from agentbolt.types import TraceState as TraceState
    from agentbolt.types import TraceStatus as TraceStatus
    from agentbolt.types import Triplet as Triplet
    from agentbolt.types import Worker as Worker
    from agentbolt.types import WorkerStatus as WorkerStatus
else:
    # Defined only at run time, so that type checkers report a misspelt name instead of typing it as Any.
    __all__ = ["__version__", *_LAZY.names()]

    def __getattr__(name: str) -> Any:
        """Import an exported name on first access."""
        return _LAZY.load(name)

    def __dir__() -> List[str]:
        return _LAZY.dir()
