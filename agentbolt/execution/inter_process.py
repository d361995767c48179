"""Inter-process execution on one machine, available under the alias ``"ipc"``."""

from __future__ import annotations

from .client_server import ClientServerExecutionStrategy

__all__ = ["InterProcessExecutionStrategy"]


class InterProcessExecutionStrategy(ClientServerExecutionStrategy):
    """Alias ``"ipc"``: the client-server strategy with every process on this machine."""

    alias = "ipc"
