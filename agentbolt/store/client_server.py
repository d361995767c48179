"""The LightningStore over HTTP, under the reference's module path: a FastAPI server wrapping any store, and an
aiohttp client.

The implementation lives in :mod:`agentbolt.store.http` (route table, request models, server, client); this module
re-exports it. Routes live under ``/v1/agl`` (see ``docs/store.md``, section "HTTP API").
"""

from __future__ import annotations

import logging

from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.store.http import *  # noqa: F403
from agentbolt.store.http import __all__ as _http_all
from agentbolt.store.http.models import *  # noqa: F403
from agentbolt.store.http.models import __all__ as _models_all
from agentbolt.store.requests import *  # noqa: F403
from agentbolt.store.requests import __all__ as _requests_all
from agentbolt.types import Span

__all__ = ["API_KEY_ENV_VAR", *_http_all, *_models_all, *_requests_all, "Span"]

server_logger = logging.getLogger("agentbolt.store.server")
client_logger = logging.getLogger("agentbolt.store.client")
