"""The LightningStore: rollouts, attempts, spans, resources and workers, shared by algorithms and runners.

``LightningStoreClient`` and ``LightningStoreServer`` are imported on first access so that ``import agentbolt.store``
stays free of the HTTP stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentbolt.utils.lazy import LazyExports

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

_LAZY = LazyExports(__name__, {"agentbolt.store.client_server": ["LightningStoreClient", "LightningStoreServer"]})


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)
