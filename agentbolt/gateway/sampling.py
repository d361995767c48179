"""Sampling defaults: the ``sampling_parameters`` of a rollout's LLM resource, applied to its calls.

An algorithm publishes an ``LLM`` resource with ``sampling_parameters`` (GRPO by default: ``temperature=1.0`` for training,
``0.0`` for validation) and expects every call of the rollout to sample that way. An agent that forgets to pass
``**llm.sampling_parameters`` would otherwise sample at the backend's default (temperature 1.0). For a call bound
to a rollout, the gateway reads the rollout's resources (``rollout.resources_id``, the snapshot that was latest when
the rollout was enqueued) and adds each
parameter of the LLM resource serving the requested model that the request does not set itself; what the agent
passes always wins. The recorded span shows the parameters actually sent. When several LLM resources of the
snapshot serve the requested model with different parameters, none is applied (and a warning says so once).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Set, Tuple

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore
    from agentbolt.types import ResourcesUpdate

__all__ = ["SamplingDefaults", "with_sampling_defaults"]

logger = logging.getLogger("agentbolt.gateway")

_EQUIVALENT_KEYS = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}

ModelDefaults = Dict[str, Dict[str, Any]]
"""Sampling parameters by model name, from one resources snapshot."""


def with_sampling_defaults(body: Mapping[str, Any], defaults: Mapping[str, Any]) -> Dict[str, Any]:
    """``body`` with each parameter of ``defaults`` it does not set itself (``max_tokens`` and
    ``max_completion_tokens`` count as one)."""
    merged = dict(body)
    for key, value in defaults.items():
        if key in merged or _EQUIVALENT_KEYS.get(key) in merged:
            continue
        merged[key] = value
    return merged


def _defaults_by_model(update: Optional[ResourcesUpdate]) -> Tuple[ModelDefaults, Set[str]]:
    """Per model name, the sampling parameters of the LLM resources serving it; and the ambiguous names."""
    from agentbolt.types import LLM

    found: Dict[str, Dict[str, Any]] = {}
    ambiguous: Set[str] = set()
    for resource in (update.resources if update is not None else {}).values():
        if not isinstance(resource, LLM) or not resource.sampling_parameters:
            continue
        previous = found.setdefault(resource.model, dict(resource.sampling_parameters))
        if previous != resource.sampling_parameters:
            ambiguous.add(resource.model)
    for model in ambiguous:
        del found[model]
    return found, ambiguous


class SamplingDefaults:
    """Finds the sampling parameters of a rollout's LLM resources, once per rollout, with a bounded wait.

    A rollout's parameters are read at its first call and kept for its later calls, so every call of a rollout
    samples alike even if the snapshot is updated meanwhile.

    Args:
        store: The store the rollouts and resources live in.
        timeout: Longest wait for the store; past it the call goes out without defaults (logged once).
        max_cached: Rollouts remembered (the least recently used ones are forgotten).
    """

    def __init__(self, store: LightningStore, timeout: float = 2.0, max_cached: int = 4096) -> None:
        self.store = store
        self.timeout = timeout
        self.max_cached = max_cached
        self._by_rollout: collections.OrderedDict[str, ModelDefaults] = collections.OrderedDict()
        # The read of each rollout under way: the calls arriving meanwhile wait for it instead of reading again, and
        # go on in the order they arrived.
        self._reading: Dict[str, asyncio.Future[ModelDefaults]] = {}
        self._warned: Set[str] = set()

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    async def _read(self, rollout_id: str) -> ModelDefaults:
        rollout = await self.store.get_rollout_by_id(rollout_id)
        # A rollout enqueued before any resources existed has none, and never gets any.
        if rollout is None or rollout.resources_id is None:
            return {}
        defaults, ambiguous = _defaults_by_model(await self.store.get_resources_by_id(rollout.resources_id))
        for model in ambiguous:
            self._warn_once(
                f"ambiguous:{model}",
                "Several LLM resources serve model %r with different sampling_parameters; the gateway applies "
                "none of them to calls that do not set their own.",
                model,
            )
        return defaults

    def _reading_of(self, rollout_id: str) -> asyncio.Future[ModelDefaults]:
        """The read of ``rollout_id``'s parameters under way, started if there is none."""
        reading = self._reading.get(rollout_id)
        if reading is None:
            reading = self._reading[rollout_id] = asyncio.ensure_future(self._read(rollout_id))

            def done(finished: asyncio.Future[ModelDefaults]) -> None:
                if self._reading.get(rollout_id) is finished:
                    del self._reading[rollout_id]
                if not finished.cancelled():
                    finished.exception()  # retrieved: every caller may have stopped waiting (it is logged by them)

            reading.add_done_callback(done)
        return reading

    async def for_call(self, rollout_id: str, model: str) -> Dict[str, Any]:
        """The sampling parameters for a call of ``rollout_id`` to ``model``; empty when none apply or the store
        does not answer in time."""
        defaults = self._by_rollout.get(rollout_id)
        if defaults is None:
            try:
                # Shielded: a call that stops waiting leaves the read to the calls still waiting for it.
                defaults = await asyncio.wait_for(asyncio.shield(self._reading_of(rollout_id)), self.timeout)
            except Exception as exc:  # a slow or failing store must not fail the agent's call
                self._warn_once(
                    "store",
                    "Could not read the sampling parameters of rollout %s from the store (%s); calls that set none "
                    "go out with the backend's defaults.",
                    rollout_id,
                    exc,
                )
                return {}
            self._by_rollout[rollout_id] = defaults
            while len(self._by_rollout) > self.max_cached:
                self._by_rollout.popitem(last=False)
        else:
            self._by_rollout.move_to_end(rollout_id)
        return dict(defaults.get(model, {}))
