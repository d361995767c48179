"""The LightningStore: rollouts, attempts, spans, resources and workers, shared by algorithms and runners.

``LightningStoreClient`` and ``LightningStoreServer`` are imported on first access so that ``import agentbolt.store``
stays free of the HTTP stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import LightningStore, LightningStoreCapabilities, LightningStoreStatistics
from .collection_based import CollectionBasedLightningStore
from .memory import InMemoryLightningStore
from .threading import LightningStoreThreaded

if TYPE_CHECKING:
    from .client_server import LightningStoreClient, LightningStoreServer

__all__ = [
    "LightningStore",
    "LightningStoreCapabilities",
    "LightningStoreStatistics",
    "LightningStoreClient",
    "LightningStoreServer",
    "InMemoryLightningStore",
    "CollectionBasedLightningStore",
    "LightningStoreThreaded",
]

_LAZY = {"LightningStoreClient", "LightningStoreServer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import client_server

        value = getattr(client_server, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
