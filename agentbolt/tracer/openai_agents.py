"""OpenAI Agents SDK agents as OpenTelemetry spans: each agent's LLM calls carry its name.

While installed, every agent run of the Agents SDK (``Runner.run``, ``run_sync``, ``run_streamed``: one span per
agent, so a handoff from one agent to another ends the first span and opens the second) is recorded as an
``openai_agents.agent.<name>`` span with the ``agent.name`` attribute. The span is a child of the OpenTelemetry
span current where the run works (the rollout's, in a trace context) and is current while the agent runs, so the
LLM calls the OpenAI SDK instrumentation records for the agent (:mod:`agentbolt.instrumentation.openai`) nest inside
it and the adapters give them the agent's name (``agent_match``). Each run keeps the OpenTelemetry context of the
task it runs in: concurrent rollouts of one process record their agents apart.

The recording sits in the SDK's trace provider (``agents.tracing.set_trace_provider``: a provider wrapping the one
installed before, see :mod:`agentbolt.tracer.openai_agents_provider`). It sees agent runs whether or not the SDK's
own tracing is enabled (``set_tracing_disabled(True)``, ``RunConfig(tracing_disabled=True)``), and leaves the SDK's
trace processors (its exporter to OpenAI's platform, ``add_trace_processor``) exactly as they were. A trace
processor would not do: with the SDK's tracing disabled, as agents trained against local endpoints usually have it,
the SDK creates no-op spans that no processor ever sees.

The default tracer (:class:`~agentbolt.tracer.AgentOpsTracer`) installs it with the OpenAI SDK instrumentation and
removes it on teardown. Nothing here imports the ``agents`` package: when it is not imported yet, installing waits
for its import (a one-time import hook) instead of importing it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import sys
import threading
from types import ModuleType
from typing import Any, Optional, Sequence

__all__ = ["instrument_openai_agents", "uninstrument_openai_agents", "is_openai_agents_instrumented"]

logger = logging.getLogger(__name__)

_MODULE = "agents"
_lock = threading.Lock()
_wanted = False
"""Whether the recording is asked for (installed, or waiting for the SDK's import)."""
_finder: Optional[_InstallOnImport] = None


def _is_agents_sdk(module: Any) -> bool:
    """Whether ``module`` is the OpenAI Agents SDK (and not another top-level package named ``agents``)."""
    tracing = getattr(module, "tracing", None)
    return callable(getattr(tracing, "set_trace_provider", None)) and callable(
        getattr(tracing, "get_trace_provider", None)
    )


def _install_into_sdk() -> None:
    """Wrap the SDK's current trace provider (the SDK is imported)."""
    from agentbolt.tracer.openai_agents_provider import install_provider

    install_provider()


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Installs the recording right after the ``agents`` package is imported, then removes itself."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None) -> Any:
        """Find ``agents`` with the other finders and hook its loader; every other module is left to them."""
        if fullname != _MODULE:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def exec_and_install(module: ModuleType) -> None:
            try:
                exec_module(module)
            finally:
                with contextlib.suppress(AttributeError):
                    del loader.exec_module  # the loader is as it was for anything it loads later
            _installed_module(module)

        try:
            loader.exec_module = exec_and_install  # this loader object serves this import only
        except AttributeError:
            return spec
        return spec


def _installed_module(module: ModuleType) -> None:
    """The ``agents`` package was imported: install the recording if still wanted, and stop waiting."""
    with _lock:
        _remove_finder()
        wanted = _wanted
    if not wanted:
        return
    if not _is_agents_sdk(module):
        logger.debug("The imported 'agents' package is not the OpenAI Agents SDK; its agents are not recorded.")
        return
    try:
        _install_into_sdk()
    except Exception:  # recording must never break the user's import
        logger.exception("Failed to record OpenAI Agents SDK agents as spans")


def _remove_finder() -> None:
    global _finder
    if _finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_finder)
        _finder = None


def instrument_openai_agents() -> None:
    """Record OpenAI Agents SDK agent runs as spans that name the agent (idempotent).

    When the SDK is already imported this wraps its trace provider at once; when it is installed but not imported,
    it does so right after its import. Without the SDK it does nothing.
    """
    global _wanted, _finder
    with _lock:
        _wanted = True
        module = sys.modules.get(_MODULE)
        if module is None and _finder is None:
            try:
                installed = importlib.util.find_spec(_MODULE) is not None
            except (ImportError, ValueError):
                installed = False
            if installed:
                _finder = _InstallOnImport()
                sys.meta_path.insert(0, _finder)
    # Installing imports the SDK's tracing module: never while holding the lock an importing thread may wait for.
    if module is not None and _is_agents_sdk(module):
        _install_into_sdk()


def uninstrument_openai_agents() -> None:
    """Undo :func:`instrument_openai_agents`: the SDK's trace provider is the one it wrapped again.

    A provider installed over ours since (``set_trace_provider``) stays; ours, inside it, then records nothing.
    """
    global _wanted
    with _lock:
        _wanted = False
        _remove_finder()
    module = sys.modules.get(_MODULE)
    if module is not None and _is_agents_sdk(module):
        from agentbolt.tracer.openai_agents_provider import uninstall_provider

        uninstall_provider()


def is_openai_agents_instrumented() -> bool:
    """Whether agent runs are recorded (or will be, once the SDK is imported)."""
    return _wanted
