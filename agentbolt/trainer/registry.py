"""Short names accepted where an execution strategy is expected."""

from __future__ import annotations

from typing import Dict

__all__ = ["ExecutionStrategyRegistry"]

ExecutionStrategyRegistry: Dict[str, str] = {
    "shm": "agentbolt.execution.shared_memory.SharedMemoryExecutionStrategy",
    "cs": "agentbolt.execution.client_server.ClientServerExecutionStrategy",
    "ray": "agentbolt.execution.ray.RayExecutionStrategy",
}
