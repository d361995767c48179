"""``LLMProxy``: an OpenAI-compatible gateway in front of your inference backends that records every call.

Agents call the proxy like any OpenAI endpoint. Calls made under ``/rollout/{rollout_id}/attempt/{attempt_id}``
(the URL :meth:`LLMProxy.as_resource` and :meth:`agentbolt.types.ProxyLLM.get_base_url` hand out) are written to the
store as one ``agentbolt.llm_call`` span each, with the prompt and response token ids and logprobs returned by
backends that support them (vLLM, ``agentbolt serve``). The gateway itself lives in :mod:`agentbolt.gateway`; see
``docs/gateway.md``.

Unlike the reference implementation this does not use LiteLLM: ``model_list`` keeps LiteLLM's entry format, the
middleware and callback aliases are accepted, and streams are relayed as they arrive instead of being converted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, TypedDict

from agentbolt.store.base import LightningStore
from agentbolt.types import LLM, ProxyLLM
from agentbolt.utils.checks import check_count, check_positive
from agentbolt.utils.request_limits import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from agentbolt.utils.server_launcher import LaunchMode, PythonServerLauncher, PythonServerLauncherArgs

if TYPE_CHECKING:
    from agentbolt.gateway.app import Gateway, GatewaySettings

__all__ = ["LLMProxy", "ModelConfig", "get_active_llm_proxy", "set_active_llm_proxy"]

logger = logging.getLogger("agentbolt.llm_proxy")

DEFAULT_MIDDLEWARES = ["rollout_attempt", "stream_conversion"]
DEFAULT_CALLBACKS = ["return_token_ids", "logprobs", "opentelemetry"]

MIDDLEWARE_ALIASES: Dict[str, str] = {
    "rollout_attempt": "Serve /rollout/{rollout_id}/attempt/{attempt_id} routes and bind calls to that attempt.",
    "stream_conversion": "Accepted for compatibility: streams are always relayed as they arrive and recorded whole.",
    "message_inspection": "Log request and response bodies at DEBUG level.",
}
"""Middleware aliases of the reference proxy and what each means here."""

CALLBACK_ALIASES: Dict[str, str] = {
    "return_token_ids": "Ask token-id capable backends for prompt and response token ids.",
    "logprobs": "Ask token-id capable backends for the logprob of each generated token.",
    "opentelemetry": "Write one span per call to the store.",
}
"""Callback aliases of the reference proxy and what each means here."""

_REQUIRED_CAPABILITY: Dict[str, str] = {"mp": "zero_copy", "thread": "thread_safe", "asyncio": "async_safe"}
_DEFAULT_TIMEOUT = 600.0

_active_proxy: Optional[LLMProxy] = None


class ModelConfig(TypedDict):
    """One ``model_list`` entry, in LiteLLM's format.

    ``litellm_params`` holds ``model`` (``hosted_vllm/<name>``, ``agentbolt/<name>`` or ``openai/<name>``),
    ``api_base``, and optionally ``api_key`` (or ``os.environ/VAR``), ``timeout`` and ``return_token_ids``.
    """

    model_name: str
    litellm_params: Dict[str, Any]


def get_active_llm_proxy() -> LLMProxy:
    """The proxy that was last initialized (started) in this process.

    Raises:
        ValueError: When no proxy has been initialized.
    """
    if _active_proxy is None:
        raise ValueError("No active LLMProxy: start one (or call set_active_llm_proxy) first.")
    return _active_proxy


def set_active_llm_proxy(proxy: LLMProxy) -> None:
    """Make ``proxy`` the one :func:`get_active_llm_proxy` returns."""
    global _active_proxy
    _active_proxy = proxy


def _resolve_aliases(
    values: Optional[Sequence[str]], default: List[str], known: Dict[str, str], kind: str
) -> List[str]:
    if isinstance(values, str):
        raise TypeError(f"{kind}s must be a list of aliases, got the string {values!r} (wrap it in a list)")
    chosen = list(default if values is None else values)
    for value in chosen:
        if not isinstance(value, str) or value not in known:
            raise ValueError(f"Invalid {kind} alias: {value!r}. Known aliases: {', '.join(known)}")
    return chosen


class LLMProxy:
    """An OpenAI-compatible gateway that forwards to the backends of ``model_list`` and records calls in a store.

    Args:
        port: Port to listen on (``None`` picks a free one). Not allowed together with ``launcher_args``.
        model_list: LiteLLM-style entries, see :class:`ModelConfig`.
        store: Store receiving the spans; required to start.
        host: Interface to bind (default ``127.0.0.1``). Not allowed together with ``launcher_args``.
        litellm_config: Extra settings in LiteLLM's config layout; ``litellm_settings.num_retries`` and
            ``litellm_settings.request_timeout`` are honoured.
        num_retries: Retries after a 429, a 500-504 answer or a connection that failed before the answer began
            (default for ``litellm_settings.num_retries``).
        num_workers: Server processes (``mp`` mode; more than one needs gunicorn).
        launch_mode: ``"mp"`` (forked process, store must be ``zero_copy``), ``"thread"`` (store must be
            ``thread_safe``) or ``"asyncio"`` (in the caller's loop, store must be ``async_safe``).
        launcher_args: Full launcher settings instead of ``port`` / ``host`` / ``launch_mode`` / ``num_workers``.
        middlewares: Feature aliases, default ``["rollout_attempt", "stream_conversion"]`` (see
            :data:`MIDDLEWARE_ALIASES`).
        callbacks: Feature aliases, default ``["return_token_ids", "logprobs", "opentelemetry"]`` (see
            :data:`CALLBACK_ALIASES`).
        api_key: Require ``Authorization: Bearer <api_key>`` on every route but ``/health`` (for non-local use);
            :meth:`as_resource` hands the key to agents.
        body_timeout: Seconds a request body may take to arrive after its headers; a slower client gets a 408 (the
            call is neither forwarded nor recorded) and its connection is closed.
        max_request_bytes: Largest request body accepted; a larger one gets a 413.

    Raises:
        ValueError: Conflicting launcher settings, an unknown alias, a malformed ``model_list``, or a
            ``body_timeout`` or ``max_request_bytes`` that is not positive.
        TypeError: ``body_timeout`` is not a number, or ``max_request_bytes`` not an integer (a bool is neither).
    """

    def __init__(
        self,
        port: Optional[int] = None,
        model_list: Optional[List[ModelConfig]] = None,
        store: Optional[LightningStore] = None,
        host: Optional[str] = None,
        litellm_config: Optional[Dict[str, Any]] = None,
        num_retries: int = 0,
        num_workers: int = 1,
        launch_mode: LaunchMode = "mp",
        launcher_args: Optional[PythonServerLauncherArgs] = None,
        middlewares: Optional[Sequence[str]] = None,
        callbacks: Optional[Sequence[str]] = None,
        *,
        api_key: Optional[str] = None,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        from agentbolt.gateway.app import Gateway, create_app

        if launcher_args is not None and (
            port is not None or host is not None or launch_mode != "mp" or num_workers != 1
        ):
            raise ValueError("Pass either launcher_args or port/host/launch_mode/num_workers, not both.")
        if num_retries < 0:
            raise ValueError("num_retries must be >= 0")
        check_positive(body_timeout, "body_timeout")
        check_count(max_request_bytes, "max_request_bytes")
        self.body_timeout = float(body_timeout)
        self.max_request_bytes = max_request_bytes
        self.store = store
        self.model_list: List[ModelConfig] = list(model_list or [])
        if litellm_config is not None and not isinstance(litellm_config, Mapping):
            raise TypeError(f"litellm_config must be a dict, got {type(litellm_config).__name__}")
        self.litellm_config: Dict[str, Any] = dict(litellm_config or {})
        litellm_settings = dict(self.litellm_config.get("litellm_settings") or {})
        litellm_settings.setdefault("num_retries", num_retries)
        self.litellm_config["litellm_settings"] = litellm_settings
        self.middlewares = _resolve_aliases(middlewares, DEFAULT_MIDDLEWARES, MIDDLEWARE_ALIASES, "middleware")
        self.callbacks = _resolve_aliases(callbacks, DEFAULT_CALLBACKS, CALLBACK_ALIASES, "callback")
        self.api_key = api_key
        self.server_launcher_args = launcher_args or PythonServerLauncherArgs(
            port=port,
            host=host,
            launch_mode=launch_mode,
            n_workers=num_workers,
            healthcheck_url="/health",
            startup_timeout=60.0,
        )
        self._gateway: Gateway = Gateway(self.model_list, store, self._settings())
        self.server_launcher = PythonServerLauncher(
            create_app(self._gateway), self.server_launcher_args, serve_context=self._gateway.serving
        )

    def _settings(self) -> GatewaySettings:
        from agentbolt.gateway.app import GatewaySettings

        litellm_settings = self.litellm_config.get("litellm_settings") or {}
        num_retries = litellm_settings.get("num_retries", 0)
        timeout = litellm_settings.get("request_timeout", _DEFAULT_TIMEOUT)
        if isinstance(num_retries, bool) or not isinstance(num_retries, int) or num_retries < 0:
            raise ValueError("litellm_settings.num_retries must be a non-negative integer")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError("litellm_settings.request_timeout must be a positive number of seconds")
        return GatewaySettings(
            num_retries=num_retries,
            timeout=float(timeout),
            return_token_ids="return_token_ids" in self.callbacks,
            logprobs="logprobs" in self.callbacks,
            record_spans="opentelemetry" in self.callbacks,
            rollout_routes="rollout_attempt" in self.middlewares,
            log_messages="message_inspection" in self.middlewares,
            api_key=self.api_key,
            max_request_bytes=self.max_request_bytes,
            body_timeout=self.body_timeout,
        )

    # -- configuration ---------------------------------------------------------------------------------------------

    def get_store(self) -> Optional[LightningStore]:
        """The store receiving spans."""
        return self.store

    def set_store(self, store: LightningStore) -> None:
        """Replace the store; a running server keeps writing to the previous one until :meth:`restart`."""
        self.store = store

    def update_model_list(self, model_list: List[ModelConfig]) -> None:
        """Replace the routing table.

        A server running in this process (``thread`` / ``asyncio``) routes new requests with it at once; an ``mp``
        server picks it up on :meth:`restart`.

        Raises:
            ValueError: When an entry is malformed (the current list is kept).
        """
        self._gateway.update_model_list(model_list)
        self.model_list = list(model_list)

    def is_running(self) -> bool:
        """Whether the server is serving."""
        return self.server_launcher.is_running()

    @property
    def port(self) -> int:
        """The listening port."""
        return self.server_launcher.port

    @property
    def endpoint(self) -> str:
        """``http://{access_host}:{port}``: the base URL clients use (routes exist with and without ``/v1``)."""
        return self.server_launcher.access_endpoint

    def initialize(self) -> None:
        """Apply the current configuration to the gateway and make this the active proxy.

        Raises:
            ValueError: When no store is set.
        """
        if self.store is None:
            raise ValueError("LLMProxy needs a store before it starts: pass store= or call set_store().")
        self._gateway.store = self.store
        self._gateway.settings = self._settings()
        self._gateway.update_model_list(self.model_list)
        set_active_llm_proxy(self)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start serving and return once ``/health`` answers.

        Raises:
            ValueError: When no store is set.
            RuntimeError: When the store cannot be used from the chosen launch mode, or the server fails to start.
        """
        if self.store is None:
            raise ValueError("LLMProxy needs a store before it starts: pass store= or call set_store().")
        mode = self.server_launcher_args.launch_mode
        capability = _REQUIRED_CAPABILITY[mode]
        if not self.store.capabilities.get(capability, False):
            raise RuntimeError(
                f"launch_mode={mode!r} needs a store with the {capability!r} capability, and "
                f"{type(self.store).__name__} does not have it. Wrap the store with LightningStoreServer / "
                f"LightningStoreClient (for 'mp') or choose another launch mode."
            )
        self.initialize()
        await self.server_launcher.start()

    async def stop(self) -> None:
        """Stop serving, after writing the spans of finished calls (no-op with a warning if not running)."""
        if not self.is_running():
            logger.warning("LLMProxy is not running; nothing to stop.")
            return
        await self.server_launcher.stop()

    async def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the span of every call the gateway has answered so far is in the store.

        The gateway writes spans off the request path, so when a rollout ends, the span of its last call may still
        be on its way (or buffered while the store is unreachable). An algorithm calls this once its rollouts are
        finished, before it reads their spans.

        Args:
            timeout: Seconds to wait at most (``math.inf``: until every span is written).

        Returns:
            True when every such span was written (or given up: rejected by the store, or dropped while the buffer
            was full; both are counted in ``/health``). False when ``timeout`` passed first (the spans stay buffered
            and are written later), when the gateway could not be asked, or when it runs several worker processes
            (one request reaches only one of them). True at once when the proxy is not running.

        Raises:
            ValueError: ``timeout`` is negative (or NaN).
        """
        import aiohttp

        if not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
        # JSON has no infinity: the gateway reads a null timeout as "no limit".
        limit = None if math.isinf(timeout) else timeout
        if not self.is_running():
            return True
        if self.server_launcher_args.n_workers > 1:
            logger.warning(
                "flush() cannot wait for every worker of a %d-worker gateway.", self.server_launcher_args.n_workers
            )
            return False
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=None if limit is None else limit + 10.0)
                ) as session,
                session.post(f"{self.endpoint}/flush", json={"timeout": limit}, headers=headers) as answer,
            ):
                body = await answer.read()
                if answer.status != 200:
                    logger.warning("The gateway answered the flush with HTTP %d: %s", answer.status, body[:200])
                    return False
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            logger.warning("Could not ask the gateway to flush its spans: %r", exc)
            return False
        data = json.loads(body)
        return isinstance(data, dict) and data.get("flushed") is True

    async def restart(self, *, _port: Optional[int] = None) -> None:
        """Stop (if running) and start again, applying the current ``model_list`` and store.

        Args:
            _port: Listen on this port from now on.
        """
        if self.is_running():
            await self.server_launcher.stop()
        if _port is not None and _port != self.server_launcher.port:
            self.server_launcher_args.port = _port
            self.server_launcher = PythonServerLauncher(
                self.server_launcher.app, self.server_launcher_args, serve_context=self._gateway.serving
            )
        await self.start()

    # -- resources -------------------------------------------------------------------------------------------------

    def _resolve_model(self, model: Optional[str]) -> str:
        if model is not None:
            return model
        names = list(dict.fromkeys(entry["model_name"] for entry in self.model_list))
        if not names:
            raise ValueError("No models found in model_list; pass model= or configure the proxy's model_list.")
        if len(names) > 1:
            raise ValueError(f"Several models are configured ({', '.join(names)}); pass model= to choose one.")
        return names[0]

    def as_resource(
        self,
        rollout_id: Optional[str] = None,
        attempt_id: Optional[str] = None,
        model: Optional[str] = None,
        sampling_parameters: Optional[Dict[str, Any]] = None,
    ) -> LLM:
        """This proxy as a resource for agents.

        Without ids: a :class:`~agentbolt.types.ProxyLLM` that each rollout binds to its attempt through
        ``get_base_url(rollout_id, attempt_id)``. With both ids: a plain :class:`~agentbolt.types.LLM` whose endpoint
        is already bound to that attempt.

        Args:
            rollout_id: Rollout to bind to.
            attempt_id: Attempt to bind to.
            model: Model name; defaults to the only configured one.
            sampling_parameters: Default sampling parameters for agents.

        Raises:
            ValueError: Exactly one id given, an id that cannot be one URL path segment (see
                :meth:`~agentbolt.types.ProxyLLM.get_base_url`), or the model cannot be chosen.
        """
        resolved = self._resolve_model(model)
        params = dict(sampling_parameters or {})
        proxy = ProxyLLM(endpoint=self.endpoint, model=resolved, api_key=self.api_key, sampling_parameters=params)
        if rollout_id is None and attempt_id is None:
            return proxy
        if rollout_id is None or attempt_id is None:
            raise ValueError("Pass both rollout_id and attempt_id, or neither.")
        return LLM(
            endpoint=proxy.get_base_url(rollout_id, attempt_id),
            model=resolved,
            api_key=self.api_key,
            sampling_parameters=params,
        )
