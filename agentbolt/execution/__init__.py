"""Execution strategies: where the algorithm and the runners run (threads, processes, Ray actors)."""

from .base import ExecutionStrategy
from .client_server import ClientServerExecutionStrategy
from .events import ExecutionEvent, MultiprocessingEvent, ThreadingEvent
from .ray import RayExecutionStrategy
from .shared_memory import SharedMemoryExecutionStrategy

__all__ = [
    "ExecutionStrategy",
    "ClientServerExecutionStrategy",
    "ExecutionEvent",
    "ThreadingEvent",
    "MultiprocessingEvent",
    "SharedMemoryExecutionStrategy",
    "RayExecutionStrategy",
]
