"""``agentbolt store``: serve a LightningStore over HTTP.

SQLite is the default backend, so the data outlives the process; the command prints where it lives. PostgreSQL
(``--backend postgres --dsn ...``) serves one database to many processes and machines. ``--workers N`` serves the
store from N processes sharing the port (SQLite in WAL mode or PostgreSQL), each with its own connections.
SIGINT / SIGTERM shut the server down cleanly: in-flight requests finish, then the store is closed.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import uuid
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

import typer

from agentbolt.cli.errors import CliError, check_port_free
from agentbolt.cli.invocation import run_command
from agentbolt.cli.lifecycle import shutdown_signals, stop_when_asked
from agentbolt.cli.request_limits import body_timeout_option, max_request_bytes_option
from agentbolt.env_var import API_KEY_ENV_VAR
from agentbolt.store.mongo import MONGO_REFUSAL
from agentbolt.utils import event_loop

__all__ = [
    "CONTEXT_SETTINGS",
    "HELP",
    "DEFAULT_DB_FILE",
    "DSN_ENV_VAR",
    "WORKERS_PER_CPU",
    "StoreSpec",
    "main",
    "max_workers",
    "store_command",
]

logger = logging.getLogger(__name__)

HELP = "Serve a LightningStore over HTTP (SQLite by default: data survives restarts)."
DEFAULT_DB_FILE = "agentbolt-store.db"
DSN_ENV_VAR = "AGENTBOLT_STORE_DSN"
SQLITE_WRITE_LOCK_WAIT_SECONDS = 30.0
"""How long a write waits while another process (a worker, another server on the same file) holds the SQLite file's
write lock, before it fails as locked."""

WORKERS_PER_CPU = 4
"""``--workers`` may ask for at most this many server processes per CPU of the machine."""


def max_workers() -> int:
    """The largest ``--workers`` accepted on this machine: :data:`WORKERS_PER_CPU` per CPU.

    Workers pay off up to about one per core; far more only fill the machine with processes (each holding its own
    database connections) and, with a typo such as ``--workers 1000``, would fork until the machine chokes.
    """
    return WORKERS_PER_CPU * (os.cpu_count() or 1)


CONTEXT_SETTINGS: Dict[str, Any] = {"allow_extra_args": True}
"""Words after the options reach the command, which accepts them only as further ``--tracker`` values: the reference
takes several trackers after one flag (``--tracker prometheus console``)."""


class Backend(str, Enum):
    """Store backends available from the command line."""

    sqlite = "sqlite"
    memory = "memory"
    postgres = "postgres"


_BACKEND_CHOICES = "<" + "|".join(backend.value for backend in Backend) + ">"
"""The choices ``--help`` shows for ``--backend``."""

_MONGO_REFUSAL = (
    f"{MONGO_REFUSAL}: use --backend sqlite (the default, durable), "
    "--backend postgres --dsn URI (shared by many processes and machines) or --backend memory"
)
"""Answer to the reference's ``--backend mongo`` and ``--mongo-uri``: accepted only to be refused with this message."""


def _parse_backend(value: Any) -> Backend:
    """The ``--backend`` value (in any case) as a :class:`Backend`.

    ``mongo``, the reference's backend, is not one of the choices (neither ``--help`` nor the error about an unknown
    value lists it), but it gets its own message naming the backends that exist.

    Raises:
        CliError: ``value`` is ``mongo``.
        ValueError: ``value`` is no backend (the command line shows it as an invalid ``--backend`` value).
    """
    if isinstance(value, Backend):
        return value
    text = str(value).lower()
    if text == "mongo":
        raise CliError(_MONGO_REFUSAL)
    try:
        return Backend(text)
    except ValueError:
        raise ValueError(f"{value!r} is not one of {', '.join(repr(b.value) for b in Backend)}.") from None


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
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", help="Interface to bind; use 0.0.0.0 to accept remote clients."),
    port: int = typer.Option(4747, min=1, max=65535, help="Port to listen on."),
    backend: Backend = typer.Option(
        Backend.sqlite,
        parser=_parse_backend,
        metavar=_BACKEND_CHOICES,
        help="Where the data lives.",
    ),
    path: Optional[Path] = typer.Option(
        None, help=f"SQLite database file (created when missing). Default: ./{DEFAULT_DB_FILE}."
    ),
    dsn: Optional[str] = typer.Option(
        None,
        envvar=DSN_ENV_VAR,
        show_envvar=True,
        help="PostgreSQL connection string or URI (--backend postgres), e.g. postgresql://user:pw@host/db.",
    ),
    schema: str = typer.Option("agentbolt", help="PostgreSQL schema holding the store's tables."),
    pool_size: int = typer.Option(10, min=1, help="Most PostgreSQL connections per worker process."),
    log_level: LogLevel = typer.Option(LogLevel.INFO, case_sensitive=False, help="Logging level."),
    api_key: Optional[str] = typer.Option(
        None, envvar=API_KEY_ENV_VAR, show_envvar=True, help="Require this bearer token on every request."
    ),
    cors_origin: Optional[List[str]] = typer.Option(None, help="Allow this CORS origin (repeatable; '*' for any)."),
    tracker: Optional[List[Tracker]] = typer.Option(None, case_sensitive=False, help="Record HTTP/store metrics."),
    workers: int = typer.Option(
        1,
        "--workers",
        "--n-workers",
        min=1,
        help="Server processes sharing the port (sqlite or postgres; each opens its own connections).",
    ),
    scan_debounce_seconds: float = typer.Option(
        10.0,
        help="Seconds between two watchdog scans for timed-out and unresponsive rollouts (among all workers; also "
        "run in the background while no request comes in). 0 scans before every call.",
    ),
    max_request_bytes: int = max_request_bytes_option(),
    body_timeout: float = body_timeout_option(),
    mongo_uri: Optional[str] = typer.Option(None, hidden=True, help="The reference's MongoDB URI (not supported)."),
) -> int:
    """Serve a LightningStore over HTTP until SIGINT or SIGTERM."""
    from agentbolt.logging import setup as setup_logging

    trackers = _trackers(tracker, list(ctx.args))
    if mongo_uri is not None:
        raise CliError(_MONGO_REFUSAL)

    debug = log_level is LogLevel.DEBUG
    # At DEBUG, every request is logged (uvicorn's access log, through agentbolt's handlers).
    setup_logging(log_level.value, apply_to=["uvicorn.access"] if debug else None)
    if backend is not Backend.sqlite and path is not None:
        raise CliError("--path only applies to --backend sqlite")
    if backend is not Backend.postgres:
        _refuse_postgres_options(ctx)
    if backend is Backend.postgres and not dsn:
        raise CliError(f"--backend postgres needs --dsn (or ${DSN_ENV_VAR})")
    if backend is Backend.memory and workers > 1:
        raise CliError("--workers > 1 needs a store shared between processes: --backend sqlite or postgres")
    if not math.isfinite(scan_debounce_seconds) or scan_debounce_seconds < 0:
        raise CliError(f"--scan-debounce-seconds must be a finite number >= 0, got {scan_debounce_seconds}")
    if workers > max_workers():
        raise CliError(
            f"--workers {workers} is too many: at most {max_workers()} on this machine "
            f"({WORKERS_PER_CPU} per CPU; about one per core is best)"
        )
    spec = StoreSpec(
        backend=backend.value,
        path=str(_resolve_db_path(path)) if backend is Backend.sqlite else None,
        dsn=dsn if backend is Backend.postgres else None,
        schema=schema,
        pool_size=pool_size,
        workers=workers,
        scan_debounce_seconds=scan_debounce_seconds,
    )
    check_port_free(host, port)
    return event_loop.run(
        _serve(
            host=host,
            port=port,
            spec=spec,
            limits=_RequestLimits(
                api_key=api_key or None,
                cors_origins=tuple(cors_origin or ()),
                max_request_bytes=max_request_bytes,
                body_timeout=body_timeout,
            ),
            trackers=trackers,
            access_log=debug,
        )
    )


def _refuse_postgres_options(ctx: typer.Context) -> None:
    """Refuse the PostgreSQL options given on the command line to another backend. ``$AGENTBOLT_STORE_DSN`` may be set
    for other commands, so it only earns a warning here.

    Raises:
        CliError: ``--dsn``, ``--schema`` or ``--pool-size`` was given.
    """
    for name in ("dsn", "schema", "pool_size"):
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            option = "--" + name.replace("_", "-")
            raise CliError(f"{option} only applies to --backend postgres (add --backend postgres)")
    source = ctx.get_parameter_source("dsn")
    if source is not None and source.name == "ENVIRONMENT":
        logger.warning(
            "$%s is set but the backend is %s: the DSN is not used (add --backend postgres to serve PostgreSQL)",
            DSN_ENV_VAR,
            ctx.params.get("backend", Backend.sqlite).value,
        )


def _trackers(flagged: Optional[List[Tracker]], extra_words: List[str]) -> List[str]:
    """The tracker names: each ``--tracker`` value, then the words that followed (``--tracker prometheus console``).

    Raises:
        CliError: A word that is not a tracker name, or words without any ``--tracker``.
    """
    names = [t.value for t in (flagged or [])]
    valid = {t.value for t in Tracker}
    unknown = [word for word in extra_words if word.lower() not in valid]
    if unknown or (extra_words and not names):
        raise CliError(
            f"unexpected argument {' '.join(unknown or extra_words)!r}: the store takes no arguments, only options "
            f"(words after --tracker must be tracker names: {', '.join(sorted(valid))})"
        )
    return names + [word.lower() for word in extra_words]


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


def _make_tracker(names: List[str], n_workers: int) -> Any:
    if not names:
        return None
    from agentbolt.utils import metrics

    backends: List[Any] = []
    for name in dict.fromkeys(names):
        if name == "prometheus":
            if n_workers > 1:
                try:
                    metrics.setup_multiprocess_prometheus()
                except ValueError as exc:
                    raise CliError(f"--tracker prometheus: {exc}") from None
            try:
                backends.append(metrics.PrometheusMetricsBackend())
            except ImportError as exc:
                raise CliError(f"--tracker prometheus needs prometheus-client ({exc})") from exc
            except ValueError as exc:  # a PROMETHEUS_MULTIPROC_DIR that cannot be created
                raise CliError(f"--tracker prometheus: {exc}") from None
            dead = metrics.mark_exited_processes_dead()
            if dead:
                logger.info("Marked %d exited processes dead in PROMETHEUS_MULTIPROC_DIR", len(dead))
        else:
            backends.append(metrics.ConsoleMetricsBackend())
    return backends[0] if len(backends) == 1 else metrics.MultiMetricsBackend(backends)


@dataclass(frozen=True)
class _RequestLimits:
    """Who may call the server and what a request may be: the options every launch mode passes to the store's app."""

    api_key: Optional[str]
    cors_origins: Tuple[str, ...]
    max_request_bytes: int
    body_timeout: float


@dataclass(frozen=True)
class StoreSpec:
    """How to open the served store: in the server process, or in each worker process (picklable)."""

    backend: str
    path: Optional[str] = None
    dsn: Optional[str] = None
    schema: str = "agentbolt"
    pool_size: int = 10
    workers: int = 1
    scan_debounce_seconds: float = 10.0

    def describe(self) -> str:
        """Where the data lives, for the start-up message ("data in ..."): a path, a database or ``memory``."""
        if self.backend == "sqlite":
            return f"{self.path} (sqlite)"
        if self.backend == "postgres":
            from agentbolt.store.collection.postgres import redact_dsn

            return f"{redact_dsn(self.dsn or '')} schema {self.schema} (postgres)"
        return "memory (lost when the server stops)"

    def open(self, tracker: Any = None) -> Any:
        """Open the store.

        Raises:
            CliError: The store cannot be opened (the message says why).
        """
        scan = self.scan_debounce_seconds
        if self.backend == "memory":
            from agentbolt.store.memory import InMemoryLightningStore

            return InMemoryLightningStore(thread_safe=True, tracker=tracker, scan_debounce_seconds=scan)
        try:
            if self.backend == "sqlite":
                from agentbolt.store.sqlite import SqliteLightningStore

                # Other processes on the file (workers, another server) take turns with their write transactions.
                return SqliteLightningStore(
                    self.path or DEFAULT_DB_FILE,
                    tracker=tracker,
                    busy_timeout=SQLITE_WRITE_LOCK_WAIT_SECONDS,
                    scan_debounce_seconds=scan,
                )
            from agentbolt.store.postgres import PostgresLightningStore

            return PostgresLightningStore(
                self.dsn or "",
                schema=self.schema,
                pool_max_size=self.pool_size,
                tracker=tracker,
                scan_debounce_seconds=scan,
            )
        except ImportError as exc:
            raise CliError(f"cannot open the store: {exc}") from exc
        except Exception as exc:
            # PostgreSQL errors name the database themselves.
            where = "" if self.backend == "postgres" else f" at {self.describe()}"
            raise CliError(f"cannot open the store{where}: {exc}") from exc


async def _close_store(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        await close()


async def _serve(
    *,
    host: str,
    port: int,
    spec: StoreSpec,
    limits: _RequestLimits,
    trackers: List[str],
    access_log: bool,
) -> int:
    from agentbolt.store.http import API_V1_AGL_PREFIX
    from agentbolt.utils.server_launcher import PythonServerLauncherArgs

    tracker = _make_tracker(trackers, spec.workers)
    launcher_args = PythonServerLauncherArgs(
        host=host,
        port=port,
        launch_mode="mp" if spec.workers > 1 else "asyncio",
        n_workers=spec.workers,
        healthcheck_url=API_V1_AGL_PREFIX + "/health",
        access_log=access_log,
        log_level=logging.DEBUG if access_log else logging.WARNING,
    )
    async with shutdown_signals() as stop:
        if spec.workers > 1:
            server, store = _worker_server(spec, launcher_args, limits, tracker), None
        else:
            store = spec.open(tracker)
            server = _single_server(store, launcher_args, limits, tracker)
        try:
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
            print(f"agentbolt store: data in {spec.describe()}", flush=True)
            if spec.workers > 1:
                print(f"agentbolt store: {spec.workers} worker processes", flush=True)
            if limits.api_key:
                print("agentbolt store: bearer token required", flush=True)
            print(f"agentbolt store: serving {_endpoint(server)}/v1/agl", flush=True)
            print(f"agentbolt store: dashboard at {_endpoint(server)}/", flush=True)
            await stop_when_asked("store", stop, server)
        finally:
            if store is not None:
                await _close_store(store)
            if trackers:
                from agentbolt.utils.metrics import mark_process_dead

                mark_process_dead(os.getpid())
    failure = getattr(server, "failure", None)
    if failure is not None:
        raise CliError(f"the server stopped: {failure}", exit_code=1)
    print("agentbolt store: stopped", flush=True)
    return 0


def _endpoint(server: Any) -> str:
    return str(getattr(server, "endpoint", None) or server.access_endpoint)


def _single_server(store: Any, launcher_args: Any, limits: _RequestLimits, tracker: Any) -> Any:
    from agentbolt.store.http import LightningStoreServer

    try:
        return LightningStoreServer(
            store,
            cors_allow_origins=list(limits.cors_origins) or None,
            launcher_args=launcher_args,
            tracker=tracker,
            api_key=limits.api_key,
            max_request_bytes=limits.max_request_bytes,
            body_timeout=limits.body_timeout,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def _worker_server(spec: StoreSpec, launcher_args: Any, limits: _RequestLimits, tracker: Any) -> Any:
    """A launcher serving one app from ``spec.workers`` forked processes, each opening its own store object.

    The store is opened (and closed) once here first, so that a bad path, DSN or schema fails before any worker
    starts, with one message.
    """
    from agentbolt.store.http import build_store_app
    from agentbolt.store.http.server import background_watchdog
    from agentbolt.utils.server_launcher import PythonServerLauncher

    _check_store_opens(spec)
    stores: Dict[str, Any] = {}

    async def call(name: str, /, *args: Any, **kwargs: Any) -> Any:
        return await getattr(stores["store"], name)(*args, **kwargs)

    @contextlib.asynccontextmanager
    async def worker_store() -> AsyncIterator[None]:
        stores["store"] = spec.open(tracker)
        try:
            async with background_watchdog(stores["store"]):
                yield
        finally:
            await _close_store(stores.pop("store"))

    app = build_store_app(
        call,
        server_id=uuid.uuid4().hex,
        api_key=limits.api_key,
        cors_origins=limits.cors_origins,
        tracker=tracker,
        max_request_bytes=limits.max_request_bytes,
        body_timeout=limits.body_timeout,
    )
    return PythonServerLauncher(app, launcher_args, serve_context=worker_store)


def _check_store_opens(spec: StoreSpec) -> None:
    store = spec.open()
    close_sync = getattr(getattr(store, "collections", None), "close_sync", None)
    if close_sync is not None:
        close_sync()


def main(argv: Optional[List[str]] = None) -> int:
    """``agentbolt store`` with ``argv`` (default ``sys.argv[1:]``) as its arguments; returns the exit code."""
    return run_command(store_command, "store", HELP, argv, context_settings=CONTEXT_SETTINGS)
