"""The agent interface: a :class:`LitAgent` turns one task into one rollout."""

from __future__ import annotations

import inspect
import logging
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, Optional, TypeVar

from agentbolt.types import NamedResources, Rollout, RolloutRawResult
from agentbolt.utils.weak import TrainerReference, deref

if TYPE_CHECKING:
    from agentbolt.runner import Runner
    from agentbolt.tracer import Tracer
    from agentbolt.trainer import Trainer

__all__ = ["LitAgent", "is_v0_1_rollout_api"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ASYNC_ROLLOUT_METHODS = ("training_rollout_async", "validation_rollout_async", "rollout_async")


def is_v0_1_rollout_api(func: Callable[..., Any]) -> bool:
    """Whether ``func`` uses the v0.1 rollout signature (it has a ``rollout_id`` parameter).

    Args:
        func: The rollout function or method to inspect.

    Returns:
        True when the signature contains a parameter named ``rollout_id``.
    """
    try:
        return "rollout_id" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


class LitAgent(TrainerReference, Generic[T]):
    """Base class of trainable agents.

    Subclasses implement :meth:`rollout` (synchronous) or :meth:`rollout_async` (coroutine), or the
    mode-specific variants (:meth:`training_rollout`, :meth:`validation_rollout` and their ``_async``
    counterparts). A rollout receives the task input, the named resources (LLM endpoints, prompt templates)
    chosen by the algorithm, and the :class:`~agentbolt.types.Rollout` being executed, and returns a
    :data:`~agentbolt.types.RolloutRawResult`: ``None`` (spans come from the tracer), a final reward, or spans.

    The runner calls the ``training_*`` variants for ``train`` rollouts and the ``validation_*`` ones otherwise; a
    synchronous agent runs in a worker thread, so it may block without stalling heartbeats or span uploads.

    Args:
        trained_agents: Deprecated; select agents with the adapter's ``agent_match`` instead.
    """

    # Class-level defaults keep subclasses that skip ``super().__init__()`` working.
    trained_agents: Optional[str] = None
    _runner_ref: Optional[weakref.ReferenceType[Any]] = None

    def __init__(self, *, trained_agents: Optional[str] = None) -> None:
        if trained_agents is not None:
            warnings.warn(
                "`trained_agents` is deprecated; configure `agent_match` on the adapter instead.",
                DeprecationWarning,
                stacklevel=2,
            )
        self.trained_agents = trained_agents
        self._trainer_ref = None
        self._runner_ref = None

    def is_async(self) -> bool:
        """Whether the agent implements the coroutine rollout API.

        Returns:
            True iff the class overrides ``training_rollout_async``, ``validation_rollout_async`` or
            ``rollout_async``.
        """
        cls = type(self)
        return any(getattr(cls, name) is not getattr(LitAgent, name) for name in _ASYNC_ROLLOUT_METHODS)

    def __getstate__(self) -> Dict[str, Any]:
        # The back references are weak and local to this process: a copy shipped to another process (a runner
        # actor, say) is attached to that process's runner when the runner starts.
        state = dict(self.__dict__)
        state["_trainer_ref"] = None
        state["_runner_ref"] = None
        return state

    # -- trainer / runner back references ------------------------------------------------------------------------

    @property
    def trainer(self) -> Trainer:
        """The trainer driving this agent (see :meth:`get_trainer`)."""
        return self.get_trainer()

    def set_runner(self, runner: Runner[T]) -> None:
        """Remember the runner executing this agent (weakly referenced)."""
        self._runner_ref = weakref.ref(runner)

    def get_runner(self) -> Runner[T]:
        """The runner executing this agent.

        Raises:
            ValueError: If no runner was set or it has been garbage-collected.
        """
        return deref(self._runner_ref, "Runner", "agent")

    @property
    def runner(self) -> Runner[T]:
        """The runner executing this agent (see :meth:`get_runner`)."""
        return self.get_runner()

    def get_tracer(self) -> Tracer:
        """The tracer recording this agent: the runner's when it has one, else the trainer's.

        Raises:
            ValueError: If neither a runner with a tracer nor a trainer is set.
        """
        if self._runner_ref is not None:
            runner = self._runner_ref()
            tracer = getattr(runner, "tracer", None) if runner is not None else None
            if tracer is not None:
                return tracer
        return self.get_trainer().tracer

    @property
    def tracer(self) -> Tracer:
        """The tracer recording this agent (see :meth:`get_tracer`)."""
        return self.get_tracer()

    # -- deprecated hooks ----------------------------------------------------------------------------------------

    def on_rollout_start(self, task: T, runner: Runner[T], tracer: Tracer) -> None:
        """Deprecated no-op hook; use :class:`~agentbolt.types.Hook` instead."""

    def on_rollout_end(self, task: T, rollout: Any, runner: Runner[T], tracer: Tracer) -> None:
        """Deprecated no-op hook; use :class:`~agentbolt.types.Hook` instead."""

    # -- rollout API ---------------------------------------------------------------------------------------------

    def rollout(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Run the agent on one task (synchronous API).

        Args:
            task: The task input.
            resources: Named resources chosen by the algorithm for this rollout.
            rollout: The rollout being executed (an :class:`~agentbolt.types.AttemptedRollout` under a runner).

        Returns:
            ``None`` (the tracer's spans are used), a final reward, or a list of spans.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement rollout() or rollout_async().")

    async def rollout_async(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Run the agent on one task (coroutine API); see :meth:`rollout`."""
        raise NotImplementedError(f"{type(self).__name__} must implement rollout() or rollout_async().")

    def training_rollout(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Rollout in ``train`` mode; defaults to :meth:`rollout`."""
        return self.rollout(task, resources, rollout)

    def validation_rollout(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Rollout in ``val`` / ``test`` mode; defaults to :meth:`rollout`."""
        return self.rollout(task, resources, rollout)

    async def training_rollout_async(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Coroutine rollout in ``train`` mode; defaults to :meth:`rollout_async`."""
        return await self.rollout_async(task, resources, rollout)

    async def validation_rollout_async(self, task: T, resources: NamedResources, rollout: Rollout) -> RolloutRawResult:
        """Coroutine rollout in ``val`` / ``test`` mode; defaults to :meth:`rollout_async`."""
        return await self.rollout_async(task, resources, rollout)
