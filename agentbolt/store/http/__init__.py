"""The store over HTTP: the route table written once, the FastAPI server, the aiohttp client.

``agentbolt.store.client_server`` re-exports everything here under the reference's module path.
"""

from .client import LightningStoreClient
from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .routes import API_AGL_PREFIX, API_V1_AGL_PREFIX, API_V1_PREFIX, ROUTES, STORE_ID_HEADER, StoreRoute
from .server import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_PORT, LightningStoreServer, build_store_app

__all__ = [
    "API_V1_PREFIX",
    "API_AGL_PREFIX",
    "API_V1_AGL_PREFIX",
    "STORE_ID_HEADER",
    "DEFAULT_PORT",
    "DEFAULT_MAX_REQUEST_BYTES",
    "ROUTES",
    "StoreRoute",
    "LightningStoreServer",
    "LightningStoreClient",
    "build_store_app",
    *_errors_all,
]
