"""Deprecated v0.1 client: polls tasks from an ``AgentLightningServer`` and posts rollouts back.

New code uses the :class:`~agentbolt.store.LightningStore` API instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ValidationError

from agentbolt.types import NamedResources, ResourcesUpdate, RolloutLegacy, Task, TaskIfAny, TaskInput
from agentbolt.utils.checks import check_finite, check_positive

__all__ = ["AgentLightningClient", "DevTaskLoader"]

logger = logging.getLogger("agentbolt.client")

_CLIENT_HEADER = {"X-AgentLightning-Client": "true"}


def _check_rollout(rollout: Any) -> RolloutLegacy:
    if not isinstance(rollout, RolloutLegacy):
        raise TypeError(f"rollout must be a RolloutLegacy, got {type(rollout).__name__} {rollout!r:.200}")
    return rollout


class AgentLightningClient:
    """HTTP client of the v0.1 task server (deprecated).

    Args:
        endpoint: Base URL of the server, e.g. ``http://localhost:8000``.
        poll_interval: Seconds between polls when no task is available.
        timeout: Timeout of each HTTP request in seconds.
    """

    def __init__(self, endpoint: str, poll_interval: float = 5.0, timeout: float = 10.0) -> None:
        warnings.warn("AgentLightningClient is deprecated; use LightningStoreClient.", DeprecationWarning, stacklevel=2)
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be a URL starting with http:// or https://, got {endpoint!r}")
        self._init_state(endpoint, poll_interval, timeout)

    def _init_state(self, endpoint: str, poll_interval: float, timeout: float) -> None:
        self.endpoint = endpoint
        self.poll_interval = check_finite(poll_interval, "poll_interval", minimum=0)
        self.timeout = check_positive(timeout, "timeout")
        self.task_count = 0
        self._resources_cache: Dict[str, ResourcesUpdate] = {}
        self._latest_resources: Optional[ResourcesUpdate] = None
        self._latest_resources_time = 0.0

    def _url(self, path: str) -> str:
        return urllib.parse.urljoin(
            self.endpoint if self.endpoint.endswith("/") else self.endpoint + "/", path.lstrip("/")
        )

    def _request(self, method: str, path: str, json: Any = None) -> Optional[Any]:
        import httpx

        try:
            response = httpx.request(method, self._url(path), json=json, headers=_CLIENT_HEADER, timeout=self.timeout)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("%s %s failed: %s", method, path, exc)
            return None

    async def _request_async(self, method: str, path: str, json: Any = None) -> Optional[Any]:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.request(method, self._url(path), json=json, headers=_CLIENT_HEADER)
                response.raise_for_status()
                return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("%s %s failed: %s", method, path, exc)
            return None

    @staticmethod
    def _resources_path(resource_id: str) -> str:
        if not isinstance(resource_id, str):
            raise TypeError(f"resource_id must be a str, got {type(resource_id).__name__} {resource_id!r}")
        # Quoted as one path segment: an id such as "../task" must not reach (and claim from) another route.
        return "/resources/" + urllib.parse.quote(resource_id, safe="")

    def _validate(self, model: type[BaseModel], path: str, payload: Any) -> Any:
        """``payload`` as ``model``, or None (logged) when it is missing or not such an answer."""
        if payload is None:
            return None
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            logger.warning("GET %s returned an answer that is not a %s: %s", path, model.__name__, exc)
            return None

    def _parse_task(self, payload: Any) -> Optional[Task]:
        answer = self._validate(TaskIfAny, "/task", payload)
        if answer is None:
            return None
        if answer.is_available and answer.task is not None:
            self.task_count += 1
            return answer.task
        return None

    def poll_next_task(self) -> Optional[Task]:
        """Block until the server hands out a task."""
        while True:
            task = self._parse_task(self._request("GET", "/task"))
            if task is not None:
                return task
            time.sleep(self.poll_interval)

    async def poll_next_task_async(self) -> Optional[Task]:
        """Wait (asynchronously) until the server hands out a task."""
        while True:
            task = self._parse_task(await self._request_async("GET", "/task"))
            if task is not None:
                return task
            await asyncio.sleep(self.poll_interval)

    def _cache_resources(self, resource_id: Optional[str], payload: Any) -> Optional[ResourcesUpdate]:
        update = self._validate(ResourcesUpdate, "/resources", payload)
        if update is None:
            return None
        self._resources_cache[resource_id or update.resources_id] = update
        return update

    def get_resources_by_id(self, resource_id: str) -> Optional[ResourcesUpdate]:
        """Resources with this id (cached)."""
        path = self._resources_path(resource_id)
        if resource_id in self._resources_cache:
            return self._resources_cache[resource_id]
        return self._cache_resources(resource_id, self._request("GET", path))

    async def get_resources_by_id_async(self, resource_id: str) -> Optional[ResourcesUpdate]:
        """Resources with this id (cached)."""
        path = self._resources_path(resource_id)
        if resource_id in self._resources_cache:
            return self._resources_cache[resource_id]
        return self._cache_resources(resource_id, await self._request_async("GET", path))

    def get_latest_resources(self) -> Optional[ResourcesUpdate]:
        """The server's latest resources (cached for ``poll_interval`` seconds)."""
        if self._latest_resources is not None and time.time() - self._latest_resources_time < self.poll_interval:
            return self._latest_resources
        update = self._cache_resources(None, self._request("GET", "/resources/latest"))
        if update is not None:
            self._latest_resources, self._latest_resources_time = update, time.time()
        return update

    async def get_latest_resources_async(self) -> Optional[ResourcesUpdate]:
        """The server's latest resources (cached for ``poll_interval`` seconds)."""
        if self._latest_resources is not None and time.time() - self._latest_resources_time < self.poll_interval:
            return self._latest_resources
        update = self._cache_resources(None, await self._request_async("GET", "/resources/latest"))
        if update is not None:
            self._latest_resources, self._latest_resources_time = update, time.time()
        return update

    def post_rollout(self, rollout: RolloutLegacy) -> Optional[Dict[str, Any]]:
        """Report a finished rollout."""
        return self._request("POST", "/rollout", json=_check_rollout(rollout).model_dump(mode="json"))

    async def post_rollout_async(self, rollout: RolloutLegacy) -> Optional[Dict[str, Any]]:
        """Report a finished rollout."""
        return await self._request_async("POST", "/rollout", json=_check_rollout(rollout).model_dump(mode="json"))


class DevTaskLoader(AgentLightningClient):
    """An in-process stand-in for the v0.1 server: cycles through a fixed task list (deprecated).

    Args:
        tasks: Task inputs, or ``Task`` objects (not mixed).
        resources: The resources every task uses.
    """

    def __init__(
        self,
        tasks: Union[List[TaskInput], List[Task]],
        resources: Union[NamedResources, ResourcesUpdate],
        **kwargs: Any,
    ) -> None:
        warnings.warn("DevTaskLoader is deprecated; use Trainer.dev().", DeprecationWarning, stacklevel=2)
        unknown = sorted(set(kwargs) - {"poll_interval", "timeout"})
        if unknown:
            raise TypeError(
                f"DevTaskLoader got unexpected keyword arguments {unknown}; it accepts poll_interval, timeout"
            )
        self._init_state("local://", kwargs.get("poll_interval", 5.0), kwargs.get("timeout", 10.0))
        if isinstance(tasks, (str, bytes, Mapping)) or not isinstance(tasks, Iterable):
            raise TypeError(f"tasks must be a list of task inputs or of Task objects, got {type(tasks).__name__}")
        self._tasks: List[Any] = list(tasks)
        if not self._tasks:
            raise ValueError("DevTaskLoader needs at least one task")
        n_tasks = sum(isinstance(t, Task) for t in self._tasks)
        if 0 < n_tasks < len(self._tasks):
            raise ValueError("DevTaskLoader tasks must be all Task objects or all plain inputs, not a mix")
        if isinstance(resources, ResourcesUpdate):
            self._resources_update = resources
        else:
            now = time.time()
            self._resources_update = ResourcesUpdate(
                resources_id="local", create_time=now, update_time=now, version=1, resources=resources
            )
        self._next_index = 0
        self.rollouts: List[RolloutLegacy] = []

    def poll_next_task(self) -> Task:
        """The next task, cycling through the list."""
        index = self._next_index % len(self._tasks)
        self._next_index += 1
        self.task_count += 1
        item = self._tasks[index]
        if isinstance(item, Task):
            return item
        return Task(
            rollout_id=f"local_task_{index + 1:03d}",
            input=item,
            resources_id=self._resources_update.resources_id,
            create_time=time.time(),
        )

    async def poll_next_task_async(self) -> Task:
        """The next task, cycling through the list."""
        return self.poll_next_task()

    def get_resources_by_id(self, resource_id: str) -> ResourcesUpdate:
        """The loader's resources; any other id is a ``ValueError``."""
        if resource_id != self._resources_update.resources_id:
            raise ValueError(
                f"Unknown resources id {resource_id!r}; DevTaskLoader only has {self._resources_update.resources_id!r}"
            )
        return self._resources_update

    async def get_resources_by_id_async(self, resource_id: str) -> ResourcesUpdate:
        """The loader's resources; any other id is a ``ValueError``."""
        return self.get_resources_by_id(resource_id)

    def get_latest_resources(self) -> ResourcesUpdate:
        """The loader's resources."""
        return self._resources_update

    async def get_latest_resources_async(self) -> ResourcesUpdate:
        """The loader's resources."""
        return self._resources_update

    def post_rollout(self, rollout: RolloutLegacy) -> Dict[str, Any]:
        """Keep the rollout in :attr:`rollouts`."""
        self.rollouts.append(_check_rollout(rollout))
        return {"status": "received", "rollout_id": rollout.rollout_id}

    async def post_rollout_async(self, rollout: RolloutLegacy) -> Dict[str, Any]:
        """Keep the rollout in :attr:`rollouts`."""
        return self.post_rollout(rollout)

    def __repr__(self) -> str:
        return f"DevTaskLoader(num_tasks={len(self._tasks)}, resources={self._resources_update.resources})"
