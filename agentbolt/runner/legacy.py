"""Deprecated v0.1 runner: polls an ``AgentLightningClient`` for tasks and posts ``RolloutLegacy`` results."""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan

from agentbolt.types import Attempt, AttemptedRollout, RolloutLegacy, Span, Task, Triplet
from agentbolt.utils.checks import check_finite

if TYPE_CHECKING:
    from agentbolt.adapter import TraceAdapter
    from agentbolt.client import AgentLightningClient
    from agentbolt.litagent import LitAgent
    from agentbolt.tracer import Tracer

__all__ = ["LegacyAgentRunner"]

logger = logging.getLogger("agentbolt.runner.legacy")

DEFAULT_POST_RETRY_DELAYS = (1.0, 2.0, 5.0)
"""Seconds before each new attempt to post a result the v0.1 server did not take."""


class LegacyAgentRunner:
    """Runs an agent against the v0.1 task server (deprecated; use :class:`~agentbolt.runner.LitAgentRunner`).

    Args:
        agent: The agent.
        client: An ``AgentLightningClient`` (or ``DevTaskLoader``).
        tracer: Tracer capturing the agent's spans.
        triplet_exporter: Adapter turning spans into triplets.
        worker_id: Id of this worker (for logs).
        max_tasks: Stop after this many tasks (None: forever).
        post_retry_delays: Seconds to wait before each new attempt to post a result the server did not take (it is
            restarting, say); once they are used up the result is dropped with an error, and the server hands the
            task out again after its task timeout.
    """

    def __init__(
        self,
        agent: LitAgent[Any],
        client: AgentLightningClient,
        tracer: Tracer,
        triplet_exporter: TraceAdapter[List[Triplet]],
        worker_id: Optional[int] = None,
        max_tasks: Optional[int] = None,
        *,
        post_retry_delays: Sequence[float] = DEFAULT_POST_RETRY_DELAYS,
    ) -> None:
        warnings.warn("LegacyAgentRunner is deprecated; use LitAgentRunner.", DeprecationWarning, stacklevel=2)
        self.agent = agent
        self.client = client
        self.tracer = tracer
        self.triplet_exporter = triplet_exporter
        self.worker_id = worker_id
        self.max_tasks = max_tasks
        self.post_retry_delays = tuple(check_finite(d, "post_retry_delays", minimum=0) for d in post_retry_delays)

    def _rollout_of(self, task: Task) -> AttemptedRollout:
        now = time.time()
        return AttemptedRollout(
            rollout_id=task.rollout_id,
            input=task.input,
            start_time=now,
            mode=task.mode,
            resources_id=task.resources_id,
            status="running",
            attempt=Attempt(
                rollout_id=task.rollout_id, attempt_id="legacy", sequence_id=1, start_time=now, status="running"
            ),
        )

    def _agent_kwargs(self, task: Task, resources: Any) -> Dict[str, Any]:
        from agentbolt.litagent.litagent import is_v0_1_rollout_api

        method = self.agent.training_rollout if task.mode == "train" else self.agent.validation_rollout
        if is_v0_1_rollout_api(method):
            return {"resources": resources, "rollout_id": task.rollout_id}
        return {"resources": resources, "rollout": self._rollout_of(task)}

    def _to_legacy_result(self, task: Task, result: Any) -> RolloutLegacy:
        if isinstance(result, RolloutLegacy):
            return result
        rollout = RolloutLegacy(rollout_id=task.rollout_id, task=task)
        if isinstance(result, (bool, int, float)):
            rollout.final_reward = float(result)
            spans = self.tracer.get_last_trace()
            if spans:
                rollout.triplets = self.triplet_exporter.adapt(spans)
            return rollout
        if result is None:
            spans = self.tracer.get_last_trace()
            rollout.triplets = self.triplet_exporter.adapt(spans) if spans else []
        elif isinstance(result, list) and all(isinstance(t, Triplet) for t in result):
            rollout.triplets = list(result)
        elif isinstance(result, list) and all(isinstance(t, dict) for t in result):
            rollout.trace = list(result)
        elif isinstance(result, list) and all(isinstance(t, (ReadableSpan, Span)) for t in result):
            rollout.triplets = self.triplet_exporter.adapt(result)
        else:
            raise TypeError(f"Unsupported v0.1 rollout result of type {type(result).__name__}")
        if rollout.triplets:
            rollout.final_reward = rollout.triplets[-1].reward
        return rollout

    def _resources(self, task: Task) -> Any:
        update = (
            self.client.get_resources_by_id(task.resources_id)
            if task.resources_id
            else self.client.get_latest_resources()
        )
        if update is None:
            raise RuntimeError(f"No resources available for task {task.rollout_id}")
        return update.resources

    async def _resources_async(self, task: Task) -> Any:
        update = (
            await self.client.get_resources_by_id_async(task.resources_id)
            if task.resources_id
            else await self.client.get_latest_resources_async()
        )
        if update is None:
            raise RuntimeError(f"No resources available for task {task.rollout_id}")
        return update.resources

    def run(self) -> bool:
        """Process one task; returns True when a result was posted."""
        task = self.client.poll_next_task()
        if task is None:
            return False
        try:
            resources = self._resources(task)
            method = self.agent.training_rollout if task.mode == "train" else self.agent.validation_rollout
            with self.tracer._trace_context_sync(name=task.rollout_id):
                result = method(task.input, **self._agent_kwargs(task, resources))
            return self._post(self._to_legacy_result(task, result))
        except Exception:
            logger.exception("[Worker %s] Task %s failed", self.worker_id, task.rollout_id)
            return False

    async def run_async(self) -> bool:
        """Process one task with an async agent; returns True when a result was posted."""
        task = await self.client.poll_next_task_async()
        if task is None:
            return False
        try:
            resources = await self._resources_async(task)
            method = self.agent.training_rollout_async if task.mode == "train" else self.agent.validation_rollout_async
            async with self.tracer.trace_context(name=task.rollout_id):
                result = await method(task.input, **self._agent_kwargs(task, resources))
            return await self._post_async(self._to_legacy_result(task, result))
        except Exception:
            logger.exception("[Worker %s] Task %s failed", self.worker_id, task.rollout_id)
            return False

    def _post(self, result: RolloutLegacy) -> bool:
        """Post ``result``, again after each of :attr:`post_retry_delays` while the server does not take it."""
        delays = iter(self.post_retry_delays)
        while self.client.post_rollout(result) is None:
            delay = next(delays, None)
            if delay is None:
                return self._result_dropped(result)
            time.sleep(delay)
        return True

    async def _post_async(self, result: RolloutLegacy) -> bool:
        """:meth:`_post` for async agents."""
        delays = iter(self.post_retry_delays)
        while await self.client.post_rollout_async(result) is None:
            delay = next(delays, None)
            if delay is None:
                return self._result_dropped(result)
            await asyncio.sleep(delay)
        return True

    def _result_dropped(self, result: RolloutLegacy) -> bool:
        logger.error(
            "[Worker %s] The server took none of %d attempts to post the result of task %s; it is dropped, and the "
            "server hands the task out again after its task timeout",
            self.worker_id,
            len(self.post_retry_delays) + 1,
            result.rollout_id,
        )
        return False

    def iter(self) -> int:
        """Process tasks until ``max_tasks``; returns the number processed."""
        count = 0
        while self.max_tasks is None or count < self.max_tasks:
            self.run()
            count += 1
        return count

    async def iter_async(self) -> int:
        """Process tasks with an async agent until ``max_tasks``; returns the number processed."""
        count = 0
        while self.max_tasks is None or count < self.max_tasks:
            await self.run_async()
            count += 1
        return count
