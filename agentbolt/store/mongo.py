"""``MongoLightningStore``, the reference's MongoDB store, which agentbolt does not have.

The name imports, so code written for the reference (``from agentbolt.store.mongo import MongoLightningStore``)
fails where the store is made, with a message naming the stores that exist, rather than with a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["MONGO_REFUSAL", "MongoLightningStore"]

MONGO_REFUSAL = "MongoDB is not a store backend of agentbolt"
"""How every refusal of MongoDB begins (the Python class here, ``agl store --backend mongo``)."""


class MongoLightningStore:
    """Refuses to be made: agentbolt has no MongoDB store.

    Raises:
        NotImplementedError: always, naming the stores to use instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"{MONGO_REFUSAL}: use agentbolt.store.sqlite.SqliteLightningStore (durable), "
            "agentbolt.store.postgres.PostgresLightningStore (shared by many processes and machines) "
            "or agentbolt.InMemoryLightningStore"
        )
