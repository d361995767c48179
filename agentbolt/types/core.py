"""Core data model: rollouts, attempts, workers, queries and legacy task types."""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Generic,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    SupportsIndex,
    TypedDict,
    TypeVar,
    Union,
    overload,
)

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .wire import WireModel

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from agentbolt.litagent import LitAgent
    from agentbolt.runner import Runner
    from agentbolt.tracer import Tracer

    from .tracer import Span, SpanCoreFields

__all__ = [
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
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

RolloutStatus = Literal["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]
"""Status of a rollout: ``queuing`` initially, ``preparing`` once claimed, ``running`` after the first span or
heartbeat, then one of the terminal ``failed`` / ``succeeded`` / ``cancelled``; ``requeuing`` waits for a retry."""

AttemptStatus = Literal["preparing", "running", "failed", "succeeded", "unresponsive", "timeout"]
"""Status of one attempt at executing a rollout."""

RolloutMode = Literal["train", "val", "test"]
WorkerStatus = Literal["idle", "busy", "unknown"]
TaskInput = Any


class Triplet(WireModel):
    """One (prompt, response, reward) transition extracted from a trace."""

    prompt: Any
    response: Any
    reward: Optional[float] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


class Task(WireModel):
    """A task as handed out by the legacy (v0.1) server."""

    rollout_id: str
    input: TaskInput
    mode: Optional[RolloutMode] = None
    resources_id: Optional[str] = None
    create_time: Optional[float] = None
    last_claim_time: Optional[float] = None
    num_claims: Optional[int] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


class TaskIfAny(WireModel):
    """Legacy polling answer: a task when one is available."""

    is_available: bool
    task: Optional[Task] = None


class RolloutLegacy(WireModel):
    """The result of a rollout as reported to the legacy (v0.1) server."""

    rollout_id: str
    task: Optional[Task] = None
    final_reward: Optional[float] = None
    triplets: Optional[List[Triplet]] = None
    trace: Optional[List[Dict[str, Any]]] = None
    logs: Optional[List[str]] = None
    metadata: Dict[str, Any] = Field(default_factory=dict)


class GenericResponse(WireModel):
    """Legacy generic server response."""

    status: str = "success"
    message: Optional[str] = None
    data: Optional[Dict[str, Any]] = None


class Attempt(WireModel):
    """One execution of a rollout by a worker."""

    rollout_id: str
    attempt_id: str
    sequence_id: int = Field(ge=1)
    """1-based position of this attempt among the rollout's attempts."""
    start_time: float
    end_time: Optional[float] = None
    status: AttemptStatus = "preparing"
    worker_id: Optional[str] = None
    last_heartbeat_time: Optional[float] = None
    metadata: Optional[Dict[str, Any]] = None


class RolloutConfig(WireModel):
    """Retry and health-check policy of a rollout.

    A bool is refused for every number (lax parsing would read ``True`` as 1 second or 1 attempt), an unknown field
    (a misspelt ``timeout=``, say) is refused rather than ignored, and assigning a field checks the new value. The
    store refuses time limits its watchdog cannot apply (NaN, infinite, negative) when a rollout is enqueued or
    updated.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    timeout_seconds: Optional[float] = None
    """An attempt running longer than this is marked ``timeout``."""
    unresponsive_seconds: Optional[float] = None
    """An attempt silent (no span, no heartbeat) for longer than this is marked ``unresponsive``."""
    max_attempts: int = Field(default=1, ge=1)
    """Total number of attempts allowed, the first one included."""
    retry_condition: List[AttemptStatus] = Field(default_factory=list)
    """Attempt statuses that trigger a retry while attempts remain."""

    @field_validator("timeout_seconds", "unresponsive_seconds", "max_attempts", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{info.field_name} must be a number, got bool {value!r}")
        return value


class Rollout(WireModel):
    """A unit of work: one task input run by an agent, possibly over several attempts."""

    rollout_id: str
    input: TaskInput
    start_time: float
    end_time: Optional[float] = None
    mode: Optional[RolloutMode] = None
    resources_id: Optional[str] = None
    status: RolloutStatus = "queuing"
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: Optional[Dict[str, Any]] = None


class AttemptedRollout(Rollout):
    """A rollout together with its current (latest) attempt."""

    attempt: Attempt

    @model_validator(mode="after")
    def _check_attempt_matches(self) -> AttemptedRollout:
        if self.attempt.rollout_id != self.rollout_id:
            raise ValueError(
                f"Attempt rollout_id {self.attempt.rollout_id!r} does not match rollout_id {self.rollout_id!r}"
            )
        return self


class EnqueueRolloutRequest(WireModel):
    """Arguments of one rollout for :meth:`LightningStore.enqueue_many_rollouts`."""

    input: TaskInput
    mode: Optional[RolloutMode] = None
    resources_id: Optional[str] = None
    config: Optional[RolloutConfig] = None
    metadata: Optional[Dict[str, Any]] = None


class Worker(WireModel):
    """A runner worker as seen by the store."""

    worker_id: str
    status: WorkerStatus = "unknown"
    heartbeat_stats: Optional[Dict[str, Any]] = None
    last_heartbeat_time: Optional[float] = None
    last_dequeue_time: Optional[float] = None
    last_busy_time: Optional[float] = None
    last_idle_time: Optional[float] = None
    current_rollout_id: Optional[str] = None
    current_attempt_id: Optional[str] = None


class ParallelWorkerBase:
    """Base of components that run in one or several workers (init -> init_worker -> run -> teardown)."""

    def __init__(self) -> None:
        self.worker_id: Optional[int] = None

    def init(self, *args: Any, **kwargs: Any) -> None:
        """Called once in the main process before any worker starts."""

    def init_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        """Called once in each worker before it runs."""
        self.worker_id = worker_id

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The worker's main work."""

    def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
        """Called once in each worker after it ran."""

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        """Called once in the main process after every worker finished."""


class Dataset(Protocol, Generic[T_co]):
    """Anything indexable with a length (a plain ``list`` qualifies)."""

    def __getitem__(self, index: SupportsIndex, /) -> T_co: ...

    def __len__(self) -> int: ...


class Hook(ParallelWorkerBase):
    """Callbacks around each rollout a runner executes. All methods are no-ops by default."""

    async def on_trace_start(
        self, *, agent: LitAgent[Any], runner: Runner[Any], tracer: Tracer, rollout: Rollout
    ) -> None:
        """After the tracer context is entered, before the rollout runs."""

    async def on_trace_end(
        self, *, agent: LitAgent[Any], runner: Runner[Any], tracer: Tracer, rollout: Rollout
    ) -> None:
        """After the rollout ran, before the tracer context exits."""

    async def on_rollout_start(self, *, agent: LitAgent[Any], runner: Runner[Any], rollout: Rollout) -> None:
        """Before an attempt begins."""

    async def on_rollout_end(
        self,
        *,
        agent: LitAgent[Any],
        runner: Runner[Any],
        rollout: Rollout,
        spans: Union[List[ReadableSpan], List[Span]],
    ) -> None:
        """After the attempt finished, with the spans it produced."""


RolloutRawResult = Union[None, float, List["ReadableSpan"], List["Span"], List["SpanCoreFields"]]
"""What :meth:`LitAgent.rollout` may return."""

RolloutRawResultLegacy = Union[None, float, List[Triplet], List[Dict[str, Any]], List["ReadableSpan"], RolloutLegacy]


class FilterField(TypedDict, total=False):
    """Operators applicable to one field: ``exact`` equality, ``within`` membership, ``contains`` substring."""

    exact: Any
    within: Sequence[Any]
    contains: str


FilterOptions = Mapping[
    str, Union[FilterField, Literal["and", "or"], Mapping[str, FilterField], Sequence[Mapping[str, FilterField]]]
]
"""Field -> operators, plus ``_aggregate`` ("and"/"or") and ``_must`` (conditions that always apply)."""


class SortOptions(TypedDict):
    """Sort by one field."""

    name: str
    order: Literal["asc", "desc"]


class PaginatedResult(WireModel, Sequence[T], Generic[T]):
    """One page of query results; behaves as a sequence of its items.

    ``total`` is the number of matching items before pagination.
    """

    items: Sequence[T]
    limit: int
    offset: int
    total: int

    @field_validator("items", mode="before")
    @classmethod
    def _items_to_list(cls, value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return list(value)
        return value

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[T, Sequence[T]]:
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[T]:  # type: ignore[override]
        return iter(self.items)

    def __contains__(self, value: object) -> bool:
        return value in self.items

    def __repr__(self) -> str:
        end = "" if self.limit == -1 else str(self.offset + self.limit)
        header = f"<PaginatedResult ({self.offset}:{end} of {self.total})"
        if not self.items:
            return f"{header} empty>"
        if len(self.items) == 1:
            return f"{header} [{self.items[0]!r}]>"
        return f"{header} [{self.items[0]!r}, ...]>"

    __str__ = __repr__
