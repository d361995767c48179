"""Execution strategies decide where the algorithm and the runners run (threads, processes, machines)."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Awaitable, Iterator, Optional, Protocol, Tuple

from agentbolt.env_var import LightningEnvVar, resolve_bool_env_var, resolve_str_env_var, setting_source
from agentbolt.utils.server_launcher import bind_socket

from .events import ExecutionEvent

if TYPE_CHECKING:
    from agentbolt.store.base import LightningStore

__all__ = [
    "AlgorithmBundle",
    "RunnerBundle",
    "ExecutionStrategy",
    "check_store_port_free",
    "check_unmanaged_store_shareable",
    "resolve_managed_store",
    "resolve_managed_store_setting",
    "resolve_server_host",
    "stopping_on_failure",
]


class AlgorithmBundle(Protocol):
    """The algorithm side, ready to run against a store until done (then it returns)."""

    def __call__(self, store: LightningStore, event: ExecutionEvent) -> Awaitable[None]: ...


class RunnerBundle(Protocol):
    """One runner worker, ready to run against a store until ``event`` is set."""

    def __call__(self, store: LightningStore, worker_id: int, event: ExecutionEvent) -> Awaitable[None]: ...


class ExecutionStrategy:
    """Runs one algorithm bundle and one or more runner bundles that share a store."""

    alias: str = ""

    def execute(self, algorithm: AlgorithmBundle, runner: RunnerBundle, store: LightningStore) -> None:
        """Run both sides until the algorithm finishes (or a side fails, or the user interrupts)."""
        raise NotImplementedError()


def resolve_managed_store(managed_store: Optional[bool]) -> bool:
    """Whether a strategy manages the store: ``managed_store`` when given, else ``AGL_MANAGED_STORE``, else True."""
    return bool(resolve_bool_env_var(LightningEnvVar.AGL_MANAGED_STORE, override=managed_store, fallback=True))


def resolve_managed_store_setting(managed_store: Optional[bool]) -> Tuple[bool, str]:
    """:func:`resolve_managed_store`, and where the value came from (``"managed_store"`` or ``"AGL_MANAGED_STORE"``),
    as :func:`check_unmanaged_store_shareable` names it."""
    source = setting_source(LightningEnvVar.AGL_MANAGED_STORE, managed_store, "managed_store")
    return resolve_managed_store(managed_store), source


def resolve_server_host(server_host: Optional[str], fallback: Optional[str]) -> Optional[str]:
    """The store server's host: ``server_host``, else ``AGL_SERVER_HOST`` (spaces around it ignored), else
    ``fallback``.

    Raises:
        ValueError: The host is empty or blank, naming where it came from (an empty host would bind every interface).
    """
    source = setting_source(LightningEnvVar.AGL_SERVER_HOST, server_host, "server_host")
    host = resolve_str_env_var(LightningEnvVar.AGL_SERVER_HOST, override=server_host, fallback=fallback)
    if host is None:
        return None
    if source != "server_host":
        host = host.strip()
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"{source} must be a host name or an IP address, got {host!r}")
    return host


def check_unmanaged_store_shareable(store: Any, managed_store: bool, source: str) -> None:
    """Refuse to hand a store that lives in this process (in memory, SQLite) as it is to other processes.

    Args:
        store: The store given to ``execute``.
        managed_store: Whether the strategy manages the store; only an unmanaged store is checked.
        source: Where ``managed_store`` came from (``"managed_store"`` or ``"AGL_MANAGED_STORE"``), for the message.

    Raises:
        ValueError: The store is unmanaged and cannot be shared across processes (not ``zero_copy``).
    """
    from agentbolt.store.base import LightningStore

    if managed_store or not isinstance(store, LightningStore) or store.capabilities.get("zero_copy", False):
        return
    setting = "managed_store=False" if source == "managed_store" else f"{source}=false"
    raise ValueError(
        f"{setting} hands the store to the processes of the other side as it is, and {type(store).__name__} cannot "
        "be shared across processes: keep the store managed (the default), or pass a store every process can reach "
        "(a LightningStoreClient of an `agentbolt store` server)."
    )


def check_store_port_free(host: str, port: int, *, failure: str, option: str) -> None:
    """Fail before anything starts when the store server could not listen on ``host:port``.

    Args:
        host: The address the store server will listen on.
        port: Its port.
        failure: How the message reports the failure (it is followed by the address and the reason).
        option: The setting a user changes to choose another port (``AGL_SERVER_PORT`` is named as well).

    Raises:
        RuntimeError: Nothing can listen there: another process holds the port, or ``host`` is not an address of
            this machine.
    """
    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise RuntimeError(
            f"{failure}: cannot listen on {host}:{port} ({exc.strerror or exc}). Another process (another Trainer's "
            f"store?) holds the port; choose a free one with {option} or AGL_SERVER_PORT."
        ) from exc


@contextmanager
def stopping_on_failure(stop_evt: ExecutionEvent) -> Iterator[None]:
    """Set ``stop_evt`` when the block fails (an exception, a cancellation or Ctrl-C), so the other side stops too."""
    try:
        yield
    except (Exception, asyncio.CancelledError, KeyboardInterrupt):
        stop_evt.set()
        raise
