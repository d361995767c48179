"""``agentbolt proxy``: run the LLM gateway in front of the backends of a model list, recording calls in a store.

``--config`` is a YAML file holding either a list of LiteLLM-style entries or a mapping with ``model_list`` (and
optionally ``litellm_settings``: ``num_retries``, ``request_timeout``)::

    model_list:
      - model_name: qwen
        litellm_params: {model: hosted_vllm/Qwen/Qwen2.5-0.5B-Instruct, api_base: http://127.0.0.1:8000/v1}

``--store`` is the URL of a running ``agentbolt store`` (``http://127.0.0.1:4747``), or a SQLite file
(``path/to/store.db`` or ``sqlite:///path/to/store.db``) opened inside the proxy process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import typer

from agentbolt.cli.errors import CliError, check_port_free
from agentbolt.cli.invocation import run_command
from agentbolt.cli.lifecycle import shutdown_signals, stop_when_asked
from agentbolt.cli.request_limits import body_timeout_option, max_request_bytes_option
from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.utils import event_loop

__all__ = ["HELP", "main", "proxy_command", "load_config"]

HELP = "Run the LLM gateway: an OpenAI-compatible proxy that records every call (with token ids) in a store."
PROXY_API_KEY_ENV_VAR = "AGENTBOLT_PROXY_API_KEY"


def load_config(path: Path) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Read a model-list YAML file.

    Returns:
        The ``model_list`` entries and the remaining settings (LiteLLM config layout).

    Raises:
        CliError: When the file is missing, not YAML, or has the wrong shape.
    """
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"--config {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise CliError(f"--config {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise CliError(f"--config {path} is not valid YAML: {exc}") from exc
    if isinstance(data, list):
        model_list, settings = data, {}
    elif isinstance(data, dict) and isinstance(data.get("model_list"), list):
        model_list = data["model_list"]
        settings = {key: value for key, value in data.items() if key != "model_list"}
    else:
        raise CliError(f"--config {path} must hold a list of model entries or a mapping with a 'model_list' list")
    if not model_list:
        raise CliError(f"--config {path} lists no models: the gateway would have nothing to serve")
    if not isinstance(settings.get("litellm_settings") or {}, dict):
        raise CliError(f"--config {path}: litellm_settings must be a mapping")
    return model_list, settings


def _open_store(spec: str, api_key: Optional[str]) -> Any:
    if spec.startswith(("http://", "https://")):
        from agentbolt.store.client_server import LightningStoreClient

        return LightningStoreClient(spec, api_key=api_key)
    if re.fullmatch(r"[\w.-]+:\d+", spec):
        raise CliError(f"--store {spec} looks like a server address: write it as a URL, http://{spec}")
    path = Path(spec[len("sqlite:///") :] if spec.startswith("sqlite:///") else spec).expanduser().absolute()
    if path.is_dir():
        raise CliError(f"--store {spec}: {path} is a directory; give a store URL or a SQLite file")
    if not path.parent.is_dir():
        raise CliError(f"--store {spec}: directory {path.parent} does not exist")
    from agentbolt.store.sqlite import SqliteLightningStore

    try:
        return SqliteLightningStore(path)
    except Exception as exc:
        raise CliError(f"--store {spec}: cannot open the SQLite store: {exc}") from exc


async def _check_store_reachable(store: Any, api_key: Optional[str]) -> None:
    url = getattr(store, "server_address", None)
    if url is None:
        return
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            response = await client.get(f"{url}/health")
            if response.status_code == 200:  # and may spans be written: /health answers without a token
                response = await client.get(f"{url}/statistics", headers=headers)
    except httpx.HTTPError as exc:
        raise CliError(f"--store: no store answers at {store.server_address_root} ({exc!r})", exit_code=1) from exc
    if response.status_code == 401:
        raise CliError(
            f"--store: {store.server_address_root} requires an API key: pass --store-api-key or set {API_KEY_ENV_VAR}",
            exit_code=1,
        )
    if response.status_code != 200:
        raise CliError(f"--store: {response.url} answered HTTP {response.status_code}", exit_code=1)


def proxy_command(
    config: Path = typer.Option(..., help="YAML file with the model list (LiteLLM format)."),
    store: str = typer.Option(..., help="Store URL (http://host:4747 from `agentbolt store`) or a SQLite file."),
    port: int = typer.Option(4000, min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; use 0.0.0.0 to accept remote agents."),
    num_retries: Optional[int] = typer.Option(
        None, min=0, help="Retries after a 429, a 5xx or a connection error (default: config, else 0)."
    ),
    timeout: Optional[float] = typer.Option(
        None, min=0.001, help="Seconds allowed to connect and for each wait for backend data (default 600)."
    ),
    log_level: str = typer.Option("INFO", help="Logging level (DEBUG, INFO, WARNING, ERROR)."),
    api_key: Optional[str] = typer.Option(
        None, envvar=PROXY_API_KEY_ENV_VAR, show_envvar=True, help="Require this bearer token from agents."
    ),
    store_api_key: Optional[str] = typer.Option(
        None, envvar=API_KEY_ENV_VAR, show_envvar=True, help="Bearer token of a store server that requires one."
    ),
    max_request_bytes: int = max_request_bytes_option(),
    body_timeout: float = body_timeout_option(),
) -> int:
    """Serve the LLM gateway until SIGINT or SIGTERM."""
    from agentbolt.logging import setup as setup_logging

    level = log_level.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise CliError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    setup_logging(level)
    model_list, litellm_config = load_config(config)
    settings = dict(litellm_config.get("litellm_settings") or {})
    if num_retries is not None:
        settings["num_retries"] = num_retries
    if timeout is not None:
        settings["request_timeout"] = timeout
    litellm_config["litellm_settings"] = settings
    check_port_free(host, port, "--port")
    return event_loop.run(
        _serve(
            model_list,
            litellm_config,
            store,
            host,
            port,
            api_key or None,
            store_api_key or None,
            body_timeout=body_timeout,
            max_request_bytes=max_request_bytes,
        )
    )


async def _serve(
    model_list: List[Dict[str, Any]],
    litellm_config: Dict[str, Any],
    store_spec: str,
    host: str,
    port: int,
    api_key: Optional[str],
    store_api_key: Optional[str],
    *,
    body_timeout: float,
    max_request_bytes: int,
) -> int:
    from agentbolt.llm_proxy import LLMProxy

    try:
        proxy = LLMProxy(
            port=port,
            host=host,
            model_list=model_list,  # type: ignore[arg-type]
            litellm_config=litellm_config,
            launch_mode="asyncio",
            api_key=api_key,
            body_timeout=body_timeout,
            max_request_bytes=max_request_bytes,
        )
    except ValueError as exc:
        raise CliError(f"--config: {exc}") from exc
    store = _open_store(store_spec, store_api_key)
    # Signals are handled over the whole run, shutdown included, so a second Ctrl-C cannot cut the flush of
    # queued spans or the closing of the store.
    async with shutdown_signals() as stop:
        try:
            await _check_store_reachable(store, store_api_key)
            proxy.set_store(store)
            try:
                await proxy.start()
            except RuntimeError as exc:
                raise CliError(f"cannot start the proxy on {host}:{port}: {exc}", exit_code=1) from exc
            models = ", ".join(dict.fromkeys(entry["model_name"] for entry in model_list)) or "(none)"
            print(f"agentbolt proxy: recording calls under /rollout/<id>/attempt/<id>/v1 into {store_spec}", flush=True)
            print(f"agentbolt proxy: serving {proxy.endpoint}/v1 (models: {models})", flush=True)
            await stop_when_asked("proxy", stop, proxy)
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                await close()
    print("agentbolt proxy: stopped", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``agentbolt proxy`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(proxy_command, "proxy", HELP, argv)
