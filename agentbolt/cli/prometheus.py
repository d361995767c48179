"""``agentbolt prometheus``: serve the Prometheus metrics that agentbolt processes write to a shared directory.

Every process started with ``PROMETHEUS_MULTIPROC_DIR`` set (and ``AGENTBOLT_METRICS=prometheus``, or a store started
with ``--tracker prometheus``) writes its counters and histograms there; this command aggregates them across processes
(prometheus-client's multiprocess collector) and serves them for Prometheus to scrape at ``--metrics-path``, with
``GET /health`` for liveness. The metric names are listed in ``docs/metrics.md``.

With ``--api-key`` (or ``$AGENTBOLT_PROMETHEUS_API_KEY``) every path but ``/health`` requires
``Authorization: Bearer <key>``, refused as the store server refuses it (401 and the store's error body).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Optional

import typer

from agentbolt.cli.errors import CliError
from agentbolt.cli.invocation import run_command
from agentbolt.cli.lifecycle import shutdown_signals, stop_when_asked

__all__ = [
    "HELP",
    "DEFAULT_METRICS_PATH",
    "PROMETHEUS_API_KEY_ENV_VAR",
    "create_prometheus_app",
    "ensure_prometheus_dir",
    "main",
    "prometheus_command",
]

logger = logging.getLogger(__name__)

HELP = "Serve the Prometheus metrics of every agentbolt process sharing $PROMETHEUS_MULTIPROC_DIR."
DEFAULT_METRICS_PATH = "/v1/prometheus"
MULTIPROC_ENV_VAR = "PROMETHEUS_MULTIPROC_DIR"
PROMETHEUS_API_KEY_ENV_VAR = "AGENTBOLT_PROMETHEUS_API_KEY"
"""Bearer token ``agentbolt prometheus`` requires (``--api-key``)."""


def ensure_prometheus_dir() -> str:
    """The multiprocess directory named by ``PROMETHEUS_MULTIPROC_DIR``, created when missing.

    Raises:
        ValueError: The variable is not set, or the directory cannot be created.
    """
    directory = os.environ.get(MULTIPROC_ENV_VAR, "").strip()
    if not directory:
        raise ValueError(
            f"{MULTIPROC_ENV_VAR} is not set: point it to the directory the agentbolt processes write their "
            "metrics to (the same value in every process)"
        )
    from agentbolt.utils.metrics import make_metrics_dir

    return make_metrics_dir(directory)


def create_prometheus_app(metrics_path: str = DEFAULT_METRICS_PATH, api_key: Optional[str] = None) -> Any:
    """A FastAPI app serving the multiprocess registry at ``metrics_path`` and ``GET /health``.

    Args:
        metrics_path: Path Prometheus scrapes.
        api_key: When set, every path but ``/health`` requires ``Authorization: Bearer <api_key>`` (401 otherwise,
            with the store server's error body; compared in constant time).

    Raises:
        ValueError: ``metrics_path`` does not start with ``/`` or is the root, or ``api_key`` is empty.
        ImportError: ``prometheus-client`` is not installed.
    """
    if api_key is not None and not api_key:
        raise ValueError("the API key must not be empty")
    if not metrics_path.startswith("/"):
        raise ValueError(f"metrics path must start with '/', got {metrics_path!r}")
    path = metrics_path.rstrip("/")
    if not path:
        raise ValueError("metrics path cannot be the root '/'")
    try:
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            generate_latest,
            make_asgi_app,
            multiprocess,
        )
    except ImportError as exc:
        raise ImportError("agentbolt prometheus needs prometheus-client: pip install 'agentbolt[prometheus]'") from exc
    from fastapi import FastAPI
    from starlette.responses import Response

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    app = FastAPI(title="agentbolt Prometheus metrics", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    # The path itself answers (a mount alone would redirect it to ``path/``); reading the files runs off the loop.
    @app.get(path, include_in_schema=False)
    def scrape() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.mount(path, make_asgi_app(registry=registry))
    if api_key is not None:
        from agentbolt.store.http.middleware import unauthorized_response
        from agentbolt.utils.http_auth import BearerAuthMiddleware

        app.add_middleware(
            BearerAuthMiddleware, api_key=api_key, open_paths=("/health",), refusal=unauthorized_response
        )
    return app


def prometheus_command(
    host: str = typer.Option("127.0.0.1", help="Interface to bind; use 0.0.0.0 to let a remote Prometheus scrape."),
    port: int = typer.Option(4748, min=1, max=65535, help="Port to listen on."),
    metrics_path: str = typer.Option(DEFAULT_METRICS_PATH, help="Path Prometheus scrapes."),
    log_level: str = typer.Option("INFO", help="Logging level (DEBUG, INFO, WARNING, ERROR)."),
    access_log: bool = typer.Option(False, "--access-log", help="Log every request."),
    api_key: Optional[str] = typer.Option(
        None,
        envvar=PROMETHEUS_API_KEY_ENV_VAR,
        show_envvar=True,
        help="Require this bearer token on every path but /health.",
    ),
) -> int:
    """Serve the aggregated Prometheus metrics until SIGINT or SIGTERM."""
    from agentbolt.logging import setup as setup_logging
    from agentbolt.utils.server_launcher import LOOPBACK_HOSTS

    level = log_level.upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise CliError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    setup_logging(level, apply_to=["uvicorn.access"] if access_log else None)
    try:
        directory = ensure_prometheus_dir()
        app = create_prometheus_app(metrics_path, api_key or None)
    except (ValueError, ImportError) as exc:
        raise CliError(str(exc)) from exc
    if host not in LOOPBACK_HOSTS and not api_key:
        logger.warning(
            "Serving metrics on %s without an API key: anyone who reaches this address can read them "
            "(set --api-key or %s).",
            host,
            PROMETHEUS_API_KEY_ENV_VAR,
        )
    return asyncio.run(_serve(app, host, port, metrics_path.rstrip("/"), directory, access_log))


async def _serve(app: Any, host: str, port: int, path: str, directory: str, access_log: bool) -> int:
    from agentbolt.utils.server_launcher import PythonServerLauncher, PythonServerLauncherArgs

    launcher = PythonServerLauncher(
        app,
        PythonServerLauncherArgs(
            host=host,
            port=port,
            launch_mode="asyncio",
            healthcheck_url="/health",
            access_log=access_log,
            log_level=logging.INFO if access_log else logging.WARNING,
        ),
    )
    async with shutdown_signals() as stop:
        try:
            await launcher.start()
        except RuntimeError as exc:
            raise CliError(f"cannot serve on {host}:{port}: {exc}", exit_code=1) from exc
        print(f"agentbolt prometheus: aggregating {directory}", flush=True)
        print(f"agentbolt prometheus: serving {launcher.access_endpoint}{path}", flush=True)
        await stop_when_asked("prometheus", stop, launcher)
    return 0


def main(argv: Optional[list] = None) -> int:
    """``agentbolt prometheus`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(prometheus_command, "prometheus", HELP, argv)
