"""Run an ASGI app with uvicorn in the current event loop, in a thread, or in forked processes.

The launcher binds the listening socket itself before serving, so a port that is already in use surfaces as a
clear :class:`RuntimeError` in the caller instead of uvicorn exiting the process. uvicorn's own signal handling is
disabled: whoever owns the process (the CLI, a forked child) decides what SIGINT/SIGTERM do.

Our servers bind ``127.0.0.1`` unless a host is given (the reference binds ``0.0.0.0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, AsyncContextManager, AsyncIterator, Callable, Iterator, List, Literal, Optional, Union

import uvicorn

from agentbolt.utils import event_loop
from agentbolt.utils.checks import check_port, check_positive
from agentbolt.utils.metrics import mark_process_dead
from agentbolt.utils.request_limits import DEFAULT_HEADER_TIMEOUT, header_timeout_protocol

__all__ = ["PythonServerLauncher", "PythonServerLauncherArgs", "LaunchMode", "on_shutdown_start"]

logger = logging.getLogger(__name__)

LaunchMode = Literal["asyncio", "thread", "mp"]
"""Where the server runs: in the caller's event loop, in a daemon thread with its own loop, or in forked processes."""

DEFAULT_HOST = "127.0.0.1"

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Host names that reach only this machine: a server bound to one needs no API key to be safe."""

ServeContext = Union[AsyncContextManager[Any], Callable[[], AsyncContextManager[Any]]]
"""An async context manager entered around serving, or a factory of one (a factory allows restarts)."""


@dataclass
class PythonServerLauncherArgs:
    """How to launch a server.

    Attributes:
        port: Port to listen on; ``None`` picks a free port when the launcher is created.
        host: Interface to bind; ``None`` means ``127.0.0.1``.
        access_host: Host clients should use; derived from ``host`` when ``None``.
        launch_mode: ``"asyncio"``, ``"thread"`` or ``"mp"``.
        n_workers: Number of worker processes (``mp`` mode only), all serving one listening socket.
        healthcheck_url: Path polled after start-up until it answers 200 (``None`` skips the check).
        log_level: Level of uvicorn's loggers.
        access_log: Whether uvicorn logs every request.
        startup_timeout: Seconds allowed for the server to start and become healthy.
        kill_unhealthy_server: Stop a server that started but never became healthy.
        thread_join_timeout: Seconds to wait for the server thread on stop.
        process_join_timeout: Seconds to wait for server processes on stop before killing them.
        timeout_keep_alive: Seconds an idle keep-alive connection stays open.
        timeout_request_headers: Seconds a request's head (request line and headers) may take to arrive, from the
            connection's opening or the request's first byte; a client that misses it gets a 408 and the connection
            is closed (see :mod:`agentbolt.utils.request_limits`).
    """

    port: Optional[int] = None
    host: Optional[str] = None
    access_host: Optional[str] = None
    launch_mode: LaunchMode = "asyncio"
    n_workers: int = 1
    healthcheck_url: Optional[str] = None
    log_level: int = logging.INFO
    access_log: bool = False
    startup_timeout: float = 60.0
    kill_unhealthy_server: bool = True
    thread_join_timeout: float = 10.0
    process_join_timeout: float = 10.0
    timeout_keep_alive: int = 30
    timeout_request_headers: float = DEFAULT_HEADER_TIMEOUT

    def __post_init__(self) -> None:
        check_port(self.port)
        check_positive(self.timeout_request_headers, "timeout_request_headers")


@dataclass
class ChildEvent:
    """Start-up report sent by a server thread or process to the launcher."""

    kind: Literal["ready", "error"]
    exc_type: Optional[str] = None
    message: Optional[str] = None
    traceback: Optional[str] = None


_SHUTDOWN_HOOKS = "agentbolt_shutdown_hooks"


def on_shutdown_start(app: Any, hook: Callable[[float], None]) -> None:
    """Have ``hook(grace_seconds)`` called on the serving event loop when a server of ``app`` (a Starlette or FastAPI
    app) begins to shut down, before it waits up to ``grace_seconds`` for the requests in flight.

    A request that would outlast the grace period (a long poll) can then end at once, instead of holding up the
    shutdown until the grace period runs out and being cancelled with a 500. Called once per shutdown, in every
    process serving the app.
    """
    hooks: List[Callable[[float], None]] = getattr(app.state, _SHUTDOWN_HOOKS, [])
    setattr(app.state, _SHUTDOWN_HOOKS, [*hooks, hook])


class _Server(uvicorn.Server):
    """uvicorn server that leaves signal handling to the owner of the process and runs the app's shutdown hooks."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: Optional[List[socket.socket]] = None) -> None:
        state = getattr(self.config.app, "state", None)
        grace = self.config.timeout_graceful_shutdown
        for hook in getattr(state, _SHUTDOWN_HOOKS, ()):
            try:
                hook(math.inf if grace is None else float(grace))
            except Exception:
                logger.exception("A shutdown hook of the server failed")
        await super().shutdown(sockets=sockets)


def pick_free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port that is currently free on ``host`` (the OS picks it by binding port 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket, raising :class:`OSError` when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP (not 0) so asyncio enables TCP_NODELAY on accepted connections; without it, responses written
    # in two parts wait ~40 ms for the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def _default_outbound_ip() -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _resolve_access_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return _default_outbound_ip()
    return host


@contextlib.asynccontextmanager
async def noop_context() -> AsyncIterator[None]:
    """An async context manager that does nothing."""
    yield


def _open_context(serve_context: Optional[ServeContext]) -> AsyncContextManager[Any]:
    if serve_context is None:
        return noop_context()
    if hasattr(serve_context, "__aenter__"):
        return serve_context  # type: ignore[return-value]
    return serve_context()  # type: ignore[operator]


async def shutdown_uvicorn_server(server: uvicorn.Server, task: asyncio.Task[Any], timeout: float = 5.0) -> None:
    """Ask a uvicorn server to exit, letting in-flight requests finish, and wait for its task.

    After ``timeout`` seconds the server is forced to exit; the task is cancelled as a last resort.
    """
    server.should_exit = True
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        logger.warning("Server did not shut down within %.1f seconds; forcing exit.", timeout)
        server.force_exit = True
        done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return
    with contextlib.suppress(asyncio.CancelledError):
        exc = task.exception()
        if exc is not None:
            logger.error("Server task ended with an error: %r", exc)


async def _poll_health(url: str, deadline: float) -> bool:
    """GET ``url`` until it answers 200 or ``deadline`` (monotonic) passes."""
    import aiohttp

    delay = 0.02
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return True
                    logger.debug("Health check %s answered %d", url, response.status)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                logger.debug("Health check %s failed: %r", url, exc)
            if time.monotonic() + delay > deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


async def run_uvicorn_asyncio(
    uvicorn_server: uvicorn.Server,
    serve_context: Optional[ServeContext] = None,
    timeout: float = 60.0,
    health_url: Optional[str] = None,
    wait_for_serve: bool = True,
    kill_unhealthy_server: bool = True,
    *,
    sockets: Optional[List[socket.socket]] = None,
) -> asyncio.Task[None]:
    """Serve in the running event loop and wait until the server is up (and healthy when ``health_url`` is given).

    Args:
        uvicorn_server: The server to run.
        serve_context: Async context manager (or factory) entered around serving.
        timeout: Seconds allowed for start-up and the health check together.
        health_url: URL polled until it answers 200.
        wait_for_serve: Await the end of serving before returning; otherwise return the serving task once up.
        kill_unhealthy_server: Shut down a server that never became healthy.
        sockets: Pre-bound listening sockets to serve on.

    Returns:
        The task serving requests.

    Raises:
        RuntimeError: The server did not start or did not become healthy in time, or serving failed.
    """

    async def serve() -> None:
        async with _open_context(serve_context):
            await uvicorn_server.serve(sockets=sockets)

    serve_task: asyncio.Task[None] = asyncio.ensure_future(serve())
    deadline = time.monotonic() + timeout
    try:
        while not uvicorn_server.started:
            if serve_task.done():
                exc = serve_task.exception()
                raise RuntimeError(f"Server failed to start: {exc!r}") from exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"Server did not start up within {timeout:g} seconds.")
            await asyncio.sleep(0.01)
        if health_url is not None and not await _poll_health(health_url, deadline):
            if kill_unhealthy_server:
                await shutdown_uvicorn_server(uvicorn_server, serve_task)
                raise RuntimeError(
                    f"Server at {health_url} is not healthy after {timeout:g} seconds. It has been killed."
                )
            logger.error("Server at %s is not healthy after %g seconds; leaving it running.", health_url, timeout)
    except BaseException:
        if not serve_task.done():
            await shutdown_uvicorn_server(uvicorn_server, serve_task)
        raise
    if wait_for_serve:
        try:
            await serve_task
        except Exception as exc:
            raise RuntimeError("Uvicorn server failed to serve") from exc
    return serve_task


def _error_event(exc: BaseException) -> ChildEvent:
    return ChildEvent(
        kind="error",
        exc_type=type(exc).__name__,
        message=str(exc),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


async def _serve_and_report(
    uvicorn_server: uvicorn.Server,
    serve_context: Optional[ServeContext],
    event_queue: Any,
    timeout: float,
    health_url: Optional[str],
    sockets: Optional[List[socket.socket]],
) -> Optional[asyncio.Task[None]]:
    """Start serving and post the outcome (``ready`` or ``error``) on ``event_queue``; the serving task, if up."""
    try:
        task = await run_uvicorn_asyncio(
            uvicorn_server, serve_context, timeout, health_url, wait_for_serve=False, sockets=sockets
        )
    except BaseException as exc:
        event_queue.put(_error_event(exc))
        return None
    event_queue.put(ChildEvent(kind="ready"))
    return task


def run_uvicorn_thread(
    uvicorn_server: uvicorn.Server,
    serve_context: Optional[ServeContext],
    event_queue: queue.Queue[ChildEvent],
    stop_event: threading.Event,
    timeout: float = 60.0,
    health_url: Optional[str] = None,
    *,
    sockets: Optional[List[socket.socket]] = None,
    on_loop: Optional[Callable[[asyncio.AbstractEventLoop], None]] = None,
) -> None:
    """Thread body: serve with a private event loop until ``stop_event`` is set, reporting start-up on the queue.

    ``on_loop`` receives the thread's event loop before serving starts.
    """

    async def main() -> None:
        if on_loop is not None:
            on_loop(asyncio.get_running_loop())
        task = await _serve_and_report(uvicorn_server, serve_context, event_queue, timeout, health_url, sockets)
        if task is None:
            return
        while not stop_event.is_set() and not task.done():
            await asyncio.sleep(0.05)
        await shutdown_uvicorn_server(uvicorn_server, task)

    event_loop.run(main())


def run_uvicorn_subprocess(
    uvicorn_server: uvicorn.Server,
    serve_context: Optional[ServeContext],
    event_queue: Any,
    timeout: float = 60.0,
    health_url: Optional[str] = None,
    *,
    sockets: Optional[List[socket.socket]] = None,
    parent_pid: Optional[int] = None,
) -> None:
    """Process body: serve until SIGTERM or SIGINT, reporting start-up on the (multiprocessing) queue.

    With ``parent_pid``, the process also stops (cleanly, as on SIGTERM) once that process is gone, so that a
    launcher killed with SIGKILL leaves no worker serving its port on its own.
    """

    # A forked process inherits the launcher's signal set-up, including the wake-up socket of the launcher's event
    # loop: a signal sent to this process before its own loop handles signals (or after that loop closed) would be
    # written to that socket and taken by the launcher as its own (a SIGTERM to a failed worker stopping the server).
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watch = asyncio.ensure_future(_stop_when_orphaned(parent_pid, stop)) if parent_pid is not None else None
        try:
            task = await _serve_and_report(uvicorn_server, serve_context, event_queue, timeout, health_url, sockets)
            if task is None:
                return
            stop_task = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            stop_task.cancel()
            await shutdown_uvicorn_server(uvicorn_server, task)
        finally:
            if watch is not None:
                watch.cancel()

    event_loop.run(main())


ORPHAN_CHECK_SECONDS = 0.5
"""How often a worker process checks that its launcher is still alive."""

SUPERVISE_INTERVAL_SECONDS = 0.5
"""How often the launcher checks that its worker processes are alive."""

MAX_FAILED_STARTS = 5
"""Failed starts in a row of one worker after which the launcher gives up and stops the whole server."""

RESTART_DELAY_SECONDS = 0.5
"""Wait before the second start of a worker that failed to start; it doubles with each further failure."""

MAX_RESTART_DELAY_SECONDS = 4.0
"""Longest wait between two starts of a worker that keeps failing."""

WORKER_HEALTHY_SECONDS = 30.0
"""A worker that served this long before it exited had started well: its replacement starts at once, with a fresh
run of :data:`MAX_FAILED_STARTS`. One that exits sooner counts as a failed start."""


def restart_delay(failures: int) -> float:
    """Seconds to wait before starting a worker again after ``failures`` failed starts in a row."""
    if failures <= 0:
        return 0.0
    return min(RESTART_DELAY_SECONDS * 2 ** (failures - 1), MAX_RESTART_DELAY_SECONDS)


async def _stop_when_orphaned(parent_pid: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once this process's parent is no longer ``parent_pid`` (the parent died; the process was
    re-parented)."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(ORPHAN_CHECK_SECONDS)
    logger.warning("The server's main process (pid %d) is gone; this worker stops.", parent_pid)
    stop.set()


class PythonServerLauncher:
    """Start, stop and restart an ASGI app served by uvicorn.

    Args:
        app: The ASGI application.
        args: Launch options.
        serve_context: Async context manager (or factory of one) entered around serving, in the serving loop.
    """

    def __init__(self, app: Any, args: PythonServerLauncherArgs, serve_context: Optional[ServeContext] = None) -> None:
        if args.launch_mode not in ("asyncio", "thread", "mp"):
            raise ValueError(f"Unknown launch mode {args.launch_mode!r}; expected 'asyncio', 'thread' or 'mp'.")
        if args.n_workers < 1:
            raise ValueError("n_workers must be at least 1")
        if args.n_workers > 1 and args.launch_mode != "mp":
            raise ValueError("n_workers > 1 requires launch_mode='mp'")
        self.app = app
        self.args = args
        self.serve_context = serve_context
        self._host = args.host or DEFAULT_HOST
        self._port = args.port if args.port is not None else pick_free_port(self._host)
        self._access_host = args.access_host or _resolve_access_host(self._host)
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._server: Optional[uvicorn.Server] = None
        self._serve_task: Optional[asyncio.Task[None]] = None
        self._thread: Optional[threading.Thread] = None
        self._stop_event: Optional[threading.Event] = None
        self._processes: List[Any] = []
        self._mp_context: Optional[Any] = None
        self._events: Optional[Any] = None
        self._supervisor: Optional[asyncio.Future[None]] = None
        self._socket: Optional[socket.socket] = None
        self._serving_loop: Optional[asyncio.AbstractEventLoop] = None
        self._failure: Optional[str] = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "args": self.args,
            "serve_context": self.serve_context,
            "_host": self._host,
            "_port": self._port,
            "_access_host": self._access_host,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime_state()

    @property
    def host(self) -> str:
        """The bound interface."""
        return self._host

    @property
    def port(self) -> int:
        """The listening port."""
        return self._port

    @property
    def access_host(self) -> str:
        """The host clients should connect to."""
        return self._access_host

    @property
    def endpoint(self) -> str:
        """``http://{host}:{port}``."""
        return f"http://{_url_host(self._host)}:{self._port}"

    @property
    def access_endpoint(self) -> str:
        """``http://{access_host}:{port}``: the URL clients should use."""
        return f"http://{_url_host(self._access_host)}:{self._port}"

    @property
    def health_url(self) -> Optional[str]:
        """Full health-check URL, or ``None`` when no health check is configured."""
        path = self.args.healthcheck_url
        if path is None:
            return None
        if not path.startswith("/"):
            path = "/" + path
        return self.access_endpoint + path

    @property
    def serving_loop(self) -> Optional[asyncio.AbstractEventLoop]:
        """Event loop serving requests in this process (asyncio and thread modes), or ``None``."""
        return self._serving_loop

    @property
    def failure(self) -> Optional[str]:
        """Why the server stopped on its own (a worker that kept failing to start), or ``None``."""
        return self._failure

    def is_running(self) -> bool:
        """Whether the server is currently serving (with several workers: while it replaces those that die, even
        when all of them died at once; no longer once it gave up replacing one, see :attr:`failure`)."""
        if self._failure is not None:
            return False
        if self._supervisor is not None and not self._supervisor.done():
            return True
        return self._alive()

    def _alive(self) -> bool:
        """Whether the serving task, thread or any worker process is alive."""
        if self._serve_task is not None:
            return not self._serve_task.done()
        if self._thread is not None:
            return self._thread.is_alive()
        return any(process.is_alive() for process in self._processes)

    def _make_server(self) -> uvicorn.Server:
        config = uvicorn.Config(
            self.app,
            host=self._host,
            port=self._port,
            log_level=self.args.log_level,
            access_log=self.args.access_log,
            timeout_keep_alive=self.args.timeout_keep_alive,
            http=header_timeout_protocol(self.args.timeout_request_headers),
            timeout_graceful_shutdown=max(1, int(self.args.thread_join_timeout / 2)),
            lifespan="off",
            log_config=None,
        )
        return _Server(config)

    def _bind(self) -> socket.socket:
        try:
            return bind_socket(self._host, self._port)
        except OSError as exc:
            raise RuntimeError(
                f"Server did not start up within {self.args.startup_timeout:g} seconds: "
                f"cannot listen on {self._host}:{self._port} ({exc.strerror or exc})."
            ) from exc

    async def start(self) -> None:
        """Start serving and return once the server is up and healthy.

        Raises:
            RuntimeError: Already running, the port is taken, or the server failed to start or become healthy.
        """
        if self.is_running():
            raise RuntimeError("Server is already running.")
        self._init_runtime_state()
        self._socket = self._bind()
        try:
            mode = self.args.launch_mode
            if mode == "asyncio":
                await self._start_asyncio()
            elif mode == "thread":
                await self._start_thread()
            else:
                await self._start_mp()
        except BaseException:
            self._close_socket()
            raise
        logger.info("Server listening on %s (%s mode).", self.access_endpoint, self.args.launch_mode)

    async def _start_asyncio(self) -> None:
        assert self._socket is not None
        self._server = self._make_server()
        self._serving_loop = asyncio.get_running_loop()
        self._serve_task = await run_uvicorn_asyncio(
            self._server,
            self.serve_context,
            timeout=self.args.startup_timeout,
            health_url=self.health_url,
            wait_for_serve=False,
            kill_unhealthy_server=self.args.kill_unhealthy_server,
            sockets=[self._socket],
        )

    async def _start_thread(self) -> None:
        assert self._socket is not None
        self._server = self._make_server()
        events: queue.Queue[ChildEvent] = queue.Queue()
        self._stop_event = threading.Event()
        self._thread = threading.Thread(
            target=run_uvicorn_thread,
            args=(self._server, self.serve_context, events, self._stop_event, self.args.startup_timeout),
            kwargs={"health_url": self.health_url, "sockets": [self._socket], "on_loop": self._set_serving_loop},
            name=f"agentbolt-server-{self._port}",
            daemon=True,
        )
        self._thread.start()
        event = await self._wait_event(events.get, self.args.startup_timeout * 2)
        if event.kind != "ready":
            await asyncio.to_thread(self._thread.join, self.args.thread_join_timeout)
            self._thread = None
            raise RuntimeError(event.message or "Server failed to start.")

    def _set_serving_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._serving_loop = loop

    async def _start_mp(self) -> None:
        assert self._socket is not None
        try:
            self._mp_context = multiprocessing.get_context("fork")
        except ValueError as exc:
            raise RuntimeError("launch_mode='mp' needs the 'fork' start method, unavailable here.") from exc
        self._events = self._mp_context.Queue()
        # Every worker serves the same listening socket (the kernel spreads connections among them); the launcher
        # keeps it open to replace a worker that dies.
        self._processes = [self._fork_worker(index) for index in range(self.args.n_workers)]
        try:
            for _ in self._processes:
                event = await self._wait_event(self._events.get, self.args.startup_timeout * 2)
                if event.kind != "ready":
                    raise RuntimeError(event.message or "Server process failed to start.")
            if self.health_url is not None and not await _poll_health(
                self.health_url, time.monotonic() + self.args.startup_timeout
            ):
                raise RuntimeError(f"Server at {self.health_url} is not healthy. It has been killed.")
        except BaseException:
            await self._stop_processes()
            raise
        if self.args.n_workers > 1:
            self._supervisor = asyncio.ensure_future(self._supervise())

    def _fork_worker(self, index: int) -> Any:
        """Start worker ``index``: a forked process serving the shared socket until SIGTERM."""
        assert self._mp_context is not None and self._socket is not None
        process = self._mp_context.Process(
            target=run_uvicorn_subprocess,
            args=(self._make_server(), self.serve_context, self._events, self.args.startup_timeout),
            kwargs={"sockets": [self._socket], "parent_pid": os.getpid()},
            name=f"agentbolt-server-{self._port}-{index}",
            daemon=False,
        )
        process.start()
        return process

    async def _supervise(self) -> None:
        """Replace workers that die while the server runs (the others keep serving meanwhile).

        A worker that fails to start, or exits within :data:`WORKER_HEALTHY_SECONDS` of its start, counts as a
        failed start; each further start of it waits longer (:func:`restart_delay`). After
        :data:`MAX_FAILED_STARTS` failed starts in a row the launcher gives up: it stops every worker, logs one
        error naming the worker and its last error, and :attr:`failure` says why (:meth:`is_running` is then
        False).
        """
        started = [time.monotonic()] * len(self._processes)
        failures = [0] * len(self._processes)
        while True:
            await asyncio.sleep(SUPERVISE_INTERVAL_SECONDS)
            for index, process in enumerate(self._processes):
                if process.is_alive():
                    continue
                await self._reap(process)
                lived = time.monotonic() - started[index]
                failures[index] = 0 if lived >= WORKER_HEALTHY_SECONDS else failures[index] + 1
                error = f"exited with code {process.exitcode} after {lived:.1f} seconds"
                logger.error("Server worker %d (pid %s) %s; starting a new one.", index, process.pid, error)
                while failures[index] < MAX_FAILED_STARTS:
                    await asyncio.sleep(restart_delay(failures[index]))
                    started[index] = time.monotonic()
                    start_error = await self._start_replacement(index)
                    if start_error is None:
                        break
                    error = start_error
                    failures[index] += 1
                    logger.error(
                        "Server worker %d failed to start (%d of %d failed starts in a row): %s",
                        index,
                        failures[index],
                        MAX_FAILED_STARTS,
                        error,
                    )
                if failures[index] >= MAX_FAILED_STARTS:
                    await self._give_up(index, failures[index], error)
                    return

    async def _start_replacement(self, index: int) -> Optional[str]:
        """Start a new worker ``index``; ``None`` once it is serving, else its error (the process is then gone)."""
        assert self._events is not None
        process = self._processes[index] = self._fork_worker(index)
        try:
            event = await self._wait_event(self._events.get, self.args.startup_timeout * 2, process)
        except RuntimeError as exc:  # start-up timed out
            event = ChildEvent(kind="error", message=str(exc))
        if event.kind == "ready":
            return None
        if event.traceback:
            logger.debug("Server worker %d (pid %s) failed to start:\n%s", index, process.pid, event.traceback)
        await self._reap(process)
        return event.message or "no error message"

    async def _give_up(self, index: int, failures: int, error: str) -> None:
        """Stop the whole server because worker ``index`` failed to start ``failures`` times in a row."""
        failure = f"server worker {index} failed to start {failures} times in a row (last error: {error})"
        logger.error("Stopping the server: %s.", failure)
        try:
            await self._terminate_workers()
        except RuntimeError as exc:
            logger.error("%s", exc)
        self._failure = failure

    async def _reap(self, process: Any) -> None:
        """Wait for an exiting worker (killing it if it lingers) and mark it dead for prometheus-client."""
        await asyncio.to_thread(process.join, self.args.process_join_timeout)
        if process.is_alive():
            logger.warning("Server process %s did not exit; killing it.", process.pid)
            process.kill()
            await asyncio.to_thread(process.join, self.args.process_join_timeout)
        mark_process_dead(process.pid)

    async def _wait_event(
        self, get: Callable[..., ChildEvent], timeout: float, process: Optional[Any] = None
    ) -> ChildEvent:
        """The next start-up event; an error event once ``process`` (default: every thread or process of the
        server) has exited without posting one."""

        def exited() -> bool:
            return not process.is_alive() if process is not None else not self._alive()

        def wait() -> ChildEvent:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return get(timeout=0.1)
                except queue.Empty:
                    if exited():
                        try:  # an event posted just before the exit may still be on its way
                            return get(timeout=0.1)
                        except queue.Empty:
                            code = f" with code {process.exitcode}" if process is not None else ""
                            return ChildEvent(kind="error", message=f"Server exited{code} during start-up.")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Server did not start up within {timeout:g} seconds.") from None

        return await asyncio.to_thread(wait)

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def stop(self) -> None:
        """Stop serving: in-flight requests finish, then the server exits.

        Raises:
            RuntimeError: A server thread or process did not exit in time.
        """
        try:
            if self._serve_task is not None and self._server is not None:
                await shutdown_uvicorn_server(self._server, self._serve_task, timeout=self.args.thread_join_timeout)
            elif self._thread is not None and self._stop_event is not None:
                self._stop_event.set()
                await asyncio.to_thread(self._thread.join, self.args.thread_join_timeout)
                if self._thread.is_alive():
                    raise RuntimeError(f"Server thread did not stop within {self.args.thread_join_timeout:g} seconds.")
            elif self._processes:
                await self._stop_processes()
        finally:
            self._close_socket()
            self._serve_task = None
            self._thread = None
            self._serving_loop = None

    async def _stop_processes(self) -> None:
        """Stop replacing workers, then stop them all (:meth:`_terminate_workers`)."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
            self._supervisor = None
        await self._terminate_workers()

    async def _terminate_workers(self) -> None:
        """SIGTERM every worker, wait, then SIGKILL those still alive; mark each dead for prometheus-client."""
        processes, self._processes = self._processes, []
        for process in processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + self.args.process_join_timeout
        stubborn = []
        for process in processes:
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("Server process %s ignored SIGTERM; killing it.", process.pid)
                process.kill()
                stubborn.append(process)
        for process in stubborn:
            await asyncio.to_thread(process.join, self.args.process_join_timeout)
            if process.is_alive():
                raise RuntimeError(f"Server process {process.pid} could not be stopped.")
        for process in processes:
            mark_process_dead(process.pid)

    async def reload(self) -> None:
        """Stop (if running) and start again on the same port."""
        if self.is_running():
            await self.stop()
        await self.start()

    async def run_forever(self) -> None:
        """Start, then block until the server exits; on cancellation (also during start-up) stop it and re-raise.

        Raises:
            RuntimeError: The server could not start, or stopped on its own because a worker kept failing to start
                (the message is :attr:`failure`).
        """
        try:
            await self.start()
            while self.is_running():
                if self._serve_task is not None:
                    await asyncio.wait({self._serve_task})
                else:
                    await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            await self.stop()
            raise
        await self.stop()
        if self._failure is not None:
            raise RuntimeError(self._failure)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
