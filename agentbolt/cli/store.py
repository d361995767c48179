"""``agentbolt store``: serve a LightningStore over HTTP.

SQLite is the default backend, so the data outlives the process; the command prints where it lives.
SIGINT / SIGTERM shut the server down cleanly: in-flight requests finish, then the store is closed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

import typer

from agentbolt.cli.errors import CliError
from agentbolt.cli.invocation import run_command
from agentbolt.cli.lifecycle import shutdown_signals, wait_until_stopped
from agentbolt.env_var import API_KEY_ENV_VAR

__all__ = ["HELP", "DEFAULT_DB_FILE", "main", "store_command"]

logger = logging.getLogger(__name__)

HELP = "Serve a LightningStore over HTTP (SQLite by default: data survives restarts)."
DEFAULT_DB_FILE = "agentbolt-store.db"


class Backend(str, Enum):
    """Store backends available from the command line."""

    sqlite = "sqlite"
    memory = "memory"


class LogLevel(str, Enum):
    """Logging levels."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class Tracker(str, Enum):
    """Metrics backends."""

    console = "console"
    prometheus = "prometheus"


def store_command(
    host: str = typer.Option("127.0.0.1", help="Interface to bind; use 0.0.0.0 to accept remote clients."),
    port: int = typer.Option(4747, min=1, max=65535, help="Port to listen on."),
    backend: Backend = typer.Option(Backend.sqlite, case_sensitive=False, help="Where the data lives."),
    path: Optional[Path] = typer.Option(
        None, help=f"SQLite database file (created when missing). Default: ./{DEFAULT_DB_FILE}."
    ),
    log_level: LogLevel = typer.Option(LogLevel.INFO, case_sensitive=False, help="Logging level."),
    api_key: Optional[str] = typer.Option(
        None, envvar=API_KEY_ENV_VAR, show_envvar=True, help="Require this bearer token on every request."
    ),
    cors_origin: Optional[List[str]] = typer.Option(None, help="Allow this CORS origin (repeatable; '*' for any)."),
    tracker: Optional[List[Tracker]] = typer.Option(None, case_sensitive=False, help="Record HTTP/store metrics."),
    n_workers: int = typer.Option(1, min=1, help="Server processes (more than one needs a zero-copy backend)."),
) -> int:
    """Serve a LightningStore over HTTP until SIGINT or SIGTERM."""
    from agentbolt.logging import setup as setup_logging

    debug = log_level is LogLevel.DEBUG
    # At DEBUG, every request is logged (uvicorn's access log, through agentbolt's handlers).
    setup_logging(log_level.value, apply_to=["uvicorn.access"] if debug else None)
    if backend is Backend.memory and path is not None:
        raise CliError("--path only applies to --backend sqlite")
    db_path = _resolve_db_path(path) if backend is Backend.sqlite else None
    _check_port_free(host, port)
    return asyncio.run(
        _serve(
            host=host,
            port=port,
            db_path=db_path,
            api_key=api_key or None,
            cors_origins=list(cors_origin or []),
            trackers=[t.value for t in (tracker or [])],
            n_workers=n_workers,
            access_log=debug,
        )
    )


def _resolve_db_path(path: Optional[Path]) -> Path:
    """Absolute database path, checked to be usable: the file readable and writable, or creatable (missing folders
    are created when the store opens, so the nearest existing folder must be writable)."""
    resolved = (path if path is not None else Path(DEFAULT_DB_FILE)).expanduser().absolute()
    if resolved.is_dir():
        raise CliError(f"--path {resolved} is a directory; give a database file")
    if resolved.exists():
        if not os.access(resolved, os.R_OK | os.W_OK):
            raise CliError(f"--path {resolved} is not readable and writable")
        return resolved
    existing = resolved.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(f"--path {resolved}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CliError(f"--path {resolved}: folder {existing} is not writable")
    return resolved


def _check_port_free(host: str, port: int) -> None:
    """Fail early, before any data file is touched, when the address is taken."""
    from agentbolt.utils.server_launcher import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def _make_tracker(names: List[str], n_workers: int) -> Any:
    if not names:
        return None
    from agentbolt.utils import metrics

    backends: List[Any] = []
    for name in dict.fromkeys(names):
        if name == "prometheus":
            if n_workers > 1:
                metrics.setup_multiprocess_prometheus()
            try:
                backends.append(metrics.PrometheusMetricsBackend())
            except ImportError as exc:
                raise CliError(f"--tracker prometheus needs prometheus-client ({exc})") from exc
        else:
            backends.append(metrics.ConsoleMetricsBackend())
    return backends[0] if len(backends) == 1 else metrics.MultiMetricsBackend(backends)


def _open_store(db_path: Optional[Path], tracker: Any) -> Any:
    if db_path is None:
        from agentbolt.store.memory import InMemoryLightningStore

        return InMemoryLightningStore(thread_safe=True, tracker=tracker)
    from agentbolt.store.sqlite import SqliteLightningStore

    try:
        return SqliteLightningStore(db_path, tracker=tracker)
    except Exception as exc:
        raise CliError(f"cannot open the store at {db_path}: {exc}") from exc


async def _close_store(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        await close()


async def _serve(
    *,
    host: str,
    port: int,
    db_path: Optional[Path],
    api_key: Optional[str],
    cors_origins: List[str],
    trackers: List[str],
    n_workers: int,
    access_log: bool,
) -> int:
    from agentbolt.store.client_server import API_V1_AGL_PREFIX, LightningStoreServer
    from agentbolt.utils.server_launcher import PythonServerLauncherArgs

    tracker = _make_tracker(trackers, n_workers)
    store = _open_store(db_path, tracker)
    async with shutdown_signals() as stop:
        try:
            try:
                launcher_args = PythonServerLauncherArgs(
                    host=host,
                    port=port,
                    launch_mode="mp" if n_workers > 1 else "asyncio",
                    n_workers=n_workers,
                    healthcheck_url=API_V1_AGL_PREFIX + "/health",
                    access_log=access_log,
                    log_level=logging.DEBUG if access_log else logging.WARNING,
                )
                server = LightningStoreServer(
                    store,
                    cors_allow_origins=cors_origins or None,
                    launcher_args=launcher_args,
                    tracker=tracker,
                    api_key=api_key,
                )
            except ValueError as exc:
                raise CliError(str(exc)) from exc
            try:
                await server.start()
            except RuntimeError as exc:
                cause = exc.__cause__
                if isinstance(cause, OSError):
                    raise CliError(f"cannot listen on {host}:{port}: {cause.strerror or cause}") from exc
                raise CliError(str(exc), exit_code=1) from exc
            # What is alive now (modules, the app, the store) lives as long as the server: keep it out of the cyclic
            # collector's scans, which otherwise add long pauses to request latencies.
            gc.collect()
            gc.freeze()
            where = f"{db_path} (sqlite)" if db_path is not None else "in memory (lost when the server stops)"
            print(f"agentbolt store: data in {where}", flush=True)
            if api_key:
                print("agentbolt store: bearer token required", flush=True)
            print(f"agentbolt store: serving {server.endpoint}/v1/agl", flush=True)
            await wait_until_stopped(stop, server)
            print("agentbolt store: shutting down", flush=True)
            await server.stop()
        finally:
            await _close_store(store)
    print("agentbolt store: stopped", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``agentbolt store`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(store_command, "store", HELP, argv)
