"""Run the algorithm and the runners in separate processes talking to the store over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Coroutine, Iterable, Iterator, List, Literal, NoReturn, Optional, Sequence, Tuple

from agentbolt.env_var import (
    STORE_SERVER_ID_ENV_VAR,
    LightningEnvVar,
    resolve_int_env_var,
    resolve_str_env_var,
    setting_source,
)
from agentbolt.store.client_server import LightningStoreClient, LightningStoreServer
from agentbolt.utils.checks import check_count, check_port

from .base import (
    AlgorithmBundle,
    ExecutionStrategy,
    RunnerBundle,
    check_store_port_free,
    check_unmanaged_store_shareable,
    resolve_managed_store_setting,
    resolve_server_host,
    stopping_on_failure,
)
from .events import ExecutionEvent, MultiprocessingEvent

__all__ = ["ClientServerExecutionStrategy", "run_runner_with_client", "wait_for_own_server"]

logger = logging.getLogger("agentbolt.execution.client_server")

Role = Literal["algorithm", "runner", "both"]


async def wait_for_own_server(
    client: LightningStoreClient, server_id: str, stop_evt: ExecutionEvent, timeout: float
) -> bool:
    """Wait until the store server at the client's address is the one with ``server_id``.

    Returns:
        True once it answers; False when the stop event is set first (the algorithm side failed or finished).

    Raises:
        RuntimeError: Nothing with that id answered within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    reported_other = False
    while not stop_evt.is_set():
        try:
            current = await client.get_server_id()
        except Exception:  # not serving yet
            current = None
        if current == server_id:
            return True
        if current is not None and not reported_other:
            reported_other = True
            logger.warning(
                "The store server at %s belongs to another run (id %s); waiting for this run's store.",
                client.server_address_root,
                current,
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"The store server of this run did not answer at {client.server_address_root} within "
                f"{timeout:g} seconds" + (" (another run's store server holds the address)." if reported_other else ".")
            )
        await asyncio.sleep(0.1)
    return False


async def run_runner_with_client(
    runner: RunnerBundle, worker_id: int, client: LightningStoreClient, stop_evt: ExecutionEvent, timeout: float
) -> None:
    """Run the runner bundle against ``client``'s store server, then close the client.

    When the client expects a server id, the bundle starts only once that server answers (see
    :func:`wait_for_own_server`, which ``timeout`` is passed to); it does not start when the stop event comes first.
    """
    try:
        server_id = client.expected_server_id
        if server_id is None or await wait_for_own_server(client, server_id, stop_evt, timeout):
            await runner(client, worker_id, stop_evt)
    finally:
        await client.close()


def _split_role_server_id() -> Optional[str]:
    """``$AGENTBOLT_STORE_SERVER_ID``, the identity an algorithm and its runners started separately agree on.

    Raises:
        ValueError: The variable is empty, holds spaces or unprintable characters, or is longer than 128 characters.
    """
    value = resolve_str_env_var(STORE_SERVER_ID_ENV_VAR)
    if value is not None and (not value or len(value) > 128 or not value.isprintable() or " " in value):
        raise ValueError(
            f"{STORE_SERVER_ID_ENV_VAR}={value!r} cannot name a store server: give 1 to 128 printable characters "
            "without spaces (the same value for the algorithm and its runners)."
        )
    return value


_SUPERVISE_INTERVAL_SECONDS = 0.2
"""How often a side checks the processes of the other side while it runs."""


INTERRUPTED_EXIT_CODE = 130
"""Exit code of a child process stopped by SIGINT (Ctrl-C reaches the whole process group)."""


async def _stopped_by_sigint(side: Callable[[], Coroutine[Any, Any, None]], handle_sigint: bool) -> None:
    """Run ``side``; with ``handle_sigint``, SIGINT cancels it (its clean-up runs)."""
    task = asyncio.current_task()
    assert task is not None

    def on_sigint() -> None:
        global _got_sigint
        if _got_sigint:  # a terminal's Ctrl-C and the parent's forwarded one: the clean-up must not be cut short
            return
        _got_sigint = True
        task.cancel()

    if handle_sigint:
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, on_sigint)
    await side()


_got_sigint = False
"""Set in a child process once SIGINT arrived (see :func:`_run_in_event_loop`)."""


def _run_in_event_loop(side: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Entry point of a child process: run one side of the run to its end (and end with the parent).

    SIGINT stops the side as a cancellation (its clean-up runs) and the process exits quietly with
    :data:`INTERRUPTED_EXIT_CODE`: a Ctrl-C in a terminal reaches every process of the group, and the parent, which
    got it too, reports the interruption once.
    """
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler (see ``execute``) is not the child's
        threading.Thread(target=_end_with_parent, name="parent-watch", daemon=True).start()
        # As asyncio.run does, SIGINT is handled only where Python's default handler is set (a process started with
        # SIGINT ignored keeps ignoring it).
        asyncio.run(_stopped_by_sigint(side, signal.getsignal(signal.SIGINT) is signal.default_int_handler))
    except KeyboardInterrupt:  # SIGINT before the event loop ran
        _exit_interrupted()
    except asyncio.CancelledError:
        if not _got_sigint:
            raise
        _exit_interrupted()
    # The side is done and the process exits: a SIGINT the parent forwards now must not turn that into a failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _exit_interrupted() -> NoReturn:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a repeated Ctrl-C must not interrupt the exit
    raise SystemExit(INTERRUPTED_EXIT_CODE) from None


def _end_with_parent() -> None:
    """Terminate this child process once its parent is gone, so that no runner (or store server) is orphaned."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    logger.warning("The parent process %s is gone; stopping %s", parent.pid, multiprocessing.current_process().name)
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def _sigterm_interrupts(children: Callable[[], Sequence[BaseProcess]]) -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM stops the run as a Ctrl-C in a terminal does.

    A Ctrl-C reaches every process of the group at once: the runners stop their agents while this process stops
    the algorithm (and the model server the agents call). A SIGTERM reaches this process only, so it passes SIGINT
    on to the live ``children()`` first, then raises :class:`KeyboardInterrupt` here; otherwise the agents would see
    their model server vanish mid-call and fail with connection errors before being told to stop.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        for child in children():
            if child.pid is not None and child.is_alive():
                with contextlib.suppress(ProcessLookupError, OSError):
                    os.kill(child.pid, signal.SIGINT)
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ClientServerExecutionStrategy(ExecutionStrategy):
    """The algorithm process serves the store over HTTP; runner processes connect as clients (alias ``"cs"``).

    Roles and addresses come from the arguments or from ``AGL_CURRENT_ROLE``, ``AGL_SERVER_HOST``,
    ``AGL_SERVER_PORT`` and ``AGL_MANAGED_STORE``, so the same script can run as the algorithm on one machine and as
    runners on others. An argument wins over its variable; a variable's value is read without surrounding whitespace
    (the role in any case). A malformed value, or settings that contradict each other, is a :class:`ValueError`
    naming the variable (or argument) each setting came from, raised here, before anything starts. Shutdown
    escalates: stop event, then SIGINT, then terminate, then kill.

    Runners only ever work for the store they were started with. With ``role="both"`` and a managed store, each
    :meth:`execute` gives its store server a fresh random id and hands it to its runners: a runner waits until the
    server at its address reports that id, and every request it sends carries the id, so the store server of
    another run at the same address (another ``Trainer`` on the default port, say) refuses it instead of handing
    it work. With the roles started separately, set the same ``AGENTBOLT_STORE_SERVER_ID`` for the algorithm and its
    runners to get the same guarantee (unset, a split-role runner works for whichever store answers at its address).
    Before any runner starts, the algorithm side checks that its port is free; a taken port is a
    :class:`RuntimeError` naming it.

    Args:
        role: ``"algorithm"``, ``"runner"`` or ``"both"`` (default from ``AGL_CURRENT_ROLE``, else ``"both"``).
        server_host: Host of the store server (default ``AGL_SERVER_HOST`` or ``"localhost"``).
        server_port: Port of the store server (default ``AGL_SERVER_PORT`` or 4747); 0 picks a free port each time
            :meth:`execute` runs (role ``"both"`` only: the runners it spawns learn the port from it).
        n_runners: Number of runner processes.
        graceful_timeout: Seconds runner processes get to exit after the stop event.
        terminate_timeout: Seconds to wait after each escalation step.
        main_process: Which side runs in the current process when ``role == "both"``.
        managed_store: Serve the given store (algorithm side) / connect a client (runner side). When False the store
            passed to :meth:`execute` is used as it is on both sides.
        allowed_exit_codes: Exit codes of child processes that count as success.
        startup_timeout: Seconds a runner waits for its own store server to answer before failing.

    Attributes:
        interrupted: Whether the last :meth:`execute` was stopped by Ctrl-C (or SIGTERM). ``execute`` then returns
            normally, as the contract asks, so a caller that must tell an interrupted run from a finished one (the
            ``agentbolt train`` command, which exits with 130) reads this flag.
    """

    alias = "cs"

    def __init__(
        self,
        role: Optional[Role] = None,
        server_host: Optional[str] = None,
        server_port: Optional[int] = None,
        n_runners: int = 1,
        graceful_timeout: float = 10.0,
        terminate_timeout: float = 10.0,
        main_process: Literal["algorithm", "runner"] = "algorithm",
        managed_store: Optional[bool] = None,
        allowed_exit_codes: Iterable[int] = (0, -15),
        startup_timeout: float = 120.0,
    ) -> None:
        # Values read from the environment may carry surrounding whitespace; a role is read in any case. Errors name
        # the variable a value came from, or the argument.
        self._role_source = setting_source(LightningEnvVar.AGL_CURRENT_ROLE, role, "role")
        resolved_role = resolve_str_env_var(LightningEnvVar.AGL_CURRENT_ROLE, override=role, fallback="both")
        if self._role_source != "role":
            resolved_role = resolved_role.strip().lower()  # type: ignore[union-attr]
        if resolved_role not in ("algorithm", "runner", "both"):
            raise ValueError(f"{self._role_source} must be 'algorithm', 'runner' or 'both', got {resolved_role!r}")
        if main_process not in ("algorithm", "runner"):
            raise ValueError(f"main_process must be 'algorithm' or 'runner', got {main_process!r}")
        if main_process == "runner" and (resolved_role != "both" or n_runners != 1):
            raise ValueError(
                "main_process='runner' requires role='both' and n_runners == 1, got "
                f"{self._role_source}={resolved_role!r} and n_runners={n_runners!r}"
            )
        check_count(n_runners, "n_runners")
        self.role: Role = resolved_role  # type: ignore[assignment]
        self.server_host: str = resolve_server_host(server_host, "localhost")  # type: ignore[assignment]
        self.server_port: int = 0
        self._set_server_port(
            resolve_int_env_var(LightningEnvVar.AGL_SERVER_PORT, override=server_port, fallback=4747),  # type: ignore[arg-type]
            setting_source(LightningEnvVar.AGL_SERVER_PORT, server_port, "server_port"),
        )
        self.n_runners = n_runners
        self.graceful_timeout = graceful_timeout
        self.terminate_timeout = terminate_timeout
        self.main_process = main_process
        self.managed_store, self._managed_store_source = resolve_managed_store_setting(managed_store)
        self.allowed_exit_codes: Tuple[int, ...] = tuple(allowed_exit_codes)
        self.startup_timeout = startup_timeout
        self.interrupted = False
        self._split_role_server_id = None if self.role == "both" else _split_role_server_id()

    def _set_server_port(self, port: int, source: str = "port") -> None:
        """Use ``port`` for the store server; ``source`` names the setting it came from in the errors.

        Raises:
            TypeError: ``port`` is not an integer.
            ValueError: ``port`` is outside 0-65535, or 0 (any free port) while this process has one role only.
        """
        check_port(port, source)
        if port == 0 and self.role != "both":
            raise ValueError(
                f"{source}=0 (any free port) needs role='both', got {self._role_source}={self.role!r}: separate "
                "processes cannot agree on a port picked at random; give the algorithm and the runners one fixed port"
            )
        self.server_port = port

    # ------------------------------------------------------------------ bundles in the current process

    async def _execute_algorithm(
        self,
        algorithm: AlgorithmBundle,
        store: Any,
        stop_evt: ExecutionEvent,
        runner_processes: Sequence[BaseProcess] = (),
        server_id: Optional[str] = None,
    ) -> None:
        server: Optional[LightningStoreServer] = None
        interrupted = False
        try:
            with stopping_on_failure(stop_evt):
                if self.managed_store:
                    server = LightningStoreServer(
                        store, host=self.server_host, port=self.server_port, server_id=server_id
                    )
                    server.launcher_args.log_level = logging.WARNING  # internal plumbing: no uvicorn lifecycle lines
                    await server.start()
                    logger.info("Store served at %s", server.endpoint)
                    store = server
                await self._supervised(algorithm(store, stop_evt), runner_processes, stop_evt, "algorithm")
                stop_evt.set()
                if server is not None:
                    # The algorithm is done: keep serving while the local runners finish their current rollout and
                    # exit, so their last writes do not hit a store that is already gone.
                    await asyncio.to_thread(self._join_until_deadline, list(runner_processes), self.graceful_timeout)
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            raise
        finally:
            try:
                if server is not None and interrupted:
                    await self._interrupt_runners_while_serving(runner_processes)
            finally:
                if server is not None:
                    await server.stop()

    async def _interrupt_runners_while_serving(self, runner_processes: Sequence[BaseProcess]) -> None:
        """Pass an interruption of this process (Ctrl-C, SIGTERM) on to the runner processes, and wait for them.

        A runner does not watch the stop event while its agent runs; SIGINT cancels the agent, and the runner
        records the attempt as failed. The store is still served meanwhile (for up to ``graceful_timeout`` seconds),
        so those last writes reach it: the rollouts are not left running in a durable store, and the runners do not
        wait for a store that is gone.
        """
        alive = [process for process in runner_processes if process.is_alive()]
        if not alive:
            return
        logger.info("Stopping %s", ", ".join(process.name for process in alive))
        self._signal_processes(alive, "sigint")
        await asyncio.to_thread(self._join_until_deadline, alive, self.graceful_timeout)

    async def _execute_runner(
        self,
        runner: RunnerBundle,
        worker_id: int,
        store: Any,
        stop_evt: ExecutionEvent,
        server_id: Optional[str] = None,
    ) -> None:
        with stopping_on_failure(stop_evt):
            if self.managed_store:
                client = LightningStoreClient(
                    f"http://{self.server_host}:{self.server_port}", expected_server_id=server_id
                )
                await run_runner_with_client(runner, worker_id, client, stop_evt, self.startup_timeout)
            else:
                await runner(store, worker_id, stop_evt)

    async def _supervised(
        self, side: Coroutine[Any, Any, None], others: Sequence[BaseProcess], stop_evt: ExecutionEvent, name: str
    ) -> None:
        """Run ``side`` (this process's side) while watching the processes of the other side.

        A process of the other side that dies with an exit code outside ``allowed_exit_codes`` (a crash, an
        out-of-memory kill) stops the run, as a side that raises does. Once the stop event is set by the other side,
        or every one of its processes has exited, ``side`` gets ``graceful_timeout`` seconds to return and is then
        cancelled: it never waits for work from processes that are gone.
        """
        task = asyncio.ensure_future(side)
        if not others:
            await task
            return
        allowed = set(self.allowed_exit_codes)
        deadline: Optional[float] = None
        while True:
            done, _ = await asyncio.wait({task}, timeout=_SUPERVISE_INTERVAL_SECONDS)
            if done:
                await task
                return
            exited = [process for process in others if not process.is_alive()]
            crashed = [process for process in exited if process.exitcode not in allowed]
            if crashed and not stop_evt.is_set():
                logger.error(
                    "%s exited with code %s; stopping the run",
                    ", ".join(process.name for process in crashed),
                    ", ".join(str(process.exitcode) for process in crashed),
                )
                stop_evt.set()
            if deadline is None and (stop_evt.is_set() or len(exited) == len(others)):
                deadline = time.monotonic() + self.graceful_timeout
            if deadline is not None and time.monotonic() >= deadline:
                break
        logger.warning(
            "The %s is still running %g s after the other side stopped (%s); cancelling it",
            name,
            self.graceful_timeout,
            ", ".join(f"{process.name} exit code {process.exitcode}" for process in others),
        )
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _run_server_id(self) -> Optional[str]:
        """The store server's identity for this run: with both roles, a fresh random one known to this run's runners
        only; with the roles started separately, ``$AGENTBOLT_STORE_SERVER_ID`` (None when unset)."""
        if self.role == "both":
            return uuid.uuid4().hex if self.managed_store else None
        return self._split_role_server_id

    # ------------------------------------------------------------------ child processes

    @staticmethod
    def _start_process(ctx: BaseContext, name: str, side: Callable[[], Coroutine[Any, Any, None]]) -> BaseProcess:
        """Start a child process that runs ``side`` (one side's coroutine) in an event loop of its own."""
        process = ctx.Process(target=_run_in_event_loop, args=(side,), name=name)  # type: ignore[attr-defined]
        process.start()
        return process

    def _spawn_runners(
        self,
        runner: RunnerBundle,
        store: Any,
        stop_evt: ExecutionEvent,
        *,
        ctx: BaseContext,
        server_id: Optional[str] = None,
    ) -> List[BaseProcess]:
        if ctx.get_start_method() == "fork":
            # Forked runners share this process's memory until a page is written, and a garbage collection writes to
            # every object it visits. Frozen objects are never visited, so their pages stay shared; they stay frozen
            # here too while the runners live, since this process's collections would otherwise copy the same pages
            # (``execute`` thaws them once the runners are gone).
            gc.collect()
            gc.freeze()
        # Managed runners connect a client of their own: the store stays here (under the spawn and forkserver start
        # methods it would have to be pickled, and a store holds locks and connections).
        runner_store = None if self.managed_store else store
        return [
            self._start_process(
                ctx,
                f"runner-{worker_id}",
                functools.partial(self._execute_runner, runner, worker_id, runner_store, stop_evt, server_id),
            )
            for worker_id in range(self.n_runners)
        ]

    # ------------------------------------------------------------------ orchestration

    def execute(self, algorithm: AlgorithmBundle, runner: RunnerBundle, store: Any) -> None:
        """Run this process's role; spawn and supervise the other processes; always clean them up.

        Raises:
            ValueError: The store is unmanaged (``managed_store=False`` or ``AGL_MANAGED_STORE=false``) and cannot be
                shared across processes (checked before anything starts).
            RuntimeError: The store server's port is taken (checked before any process starts), or a child process
                exited with a code outside ``allowed_exit_codes``.
        """
        check_unmanaged_store_shareable(store, self.managed_store, self._managed_store_source)
        ctx = multiprocessing.get_context()
        stop_evt = MultiprocessingEvent(ctx=ctx)
        processes: List[BaseProcess] = []
        failed = False
        self.interrupted = False
        frozen_before = gc.get_freeze_count()
        stack = contextlib.ExitStack()
        server_id = self._run_server_id()
        any_port = self.server_port == 0
        if any_port:
            from agentbolt.utils.server_launcher import pick_free_port

            self.server_port = pick_free_port(self.server_host)
        try:
            stack.enter_context(_sigterm_interrupts(lambda: processes))
            if self.managed_store and self.role != "runner":
                check_store_port_free(
                    self.server_host,
                    self.server_port,
                    failure="The store server did not start up within its start-up time",
                    option="Trainer(port=...)",
                )
            if self.role == "algorithm":
                asyncio.run(self._execute_algorithm(algorithm, store, stop_evt, server_id=server_id))
            elif self.role == "runner":
                if self.n_runners == 1:
                    asyncio.run(self._execute_runner(runner, 0, store, stop_evt, server_id))
                else:
                    processes = self._spawn_runners(runner, store, stop_evt, ctx=ctx, server_id=server_id)
                    for process in processes:
                        process.join()
            elif self.main_process == "algorithm":
                processes = self._spawn_runners(runner, store, stop_evt, ctx=ctx, server_id=server_id)
                asyncio.run(self._execute_algorithm(algorithm, store, stop_evt, processes, server_id))
            else:
                side = functools.partial(self._execute_algorithm, algorithm, store, stop_evt, server_id=server_id)
                processes = [self._start_process(ctx, "algorithm", side)]
                own = self._execute_runner(runner, 0, store, stop_evt, server_id)
                asyncio.run(self._supervised(own, processes, stop_evt, "runner"))
                processes[0].join()
        except KeyboardInterrupt:
            failed = True
            self.interrupted = True
            logger.warning("Interrupted; stopping every process")
            stop_evt.set()
        except BaseException:
            failed = True
            stop_evt.set()
            raise
        finally:
            try:
                self._shutdown_processes(processes, stop_evt, interrupted=self.interrupted)
            finally:
                stack.close()  # SIGTERM kills again only once the children are stopped
                if not frozen_before and gc.get_freeze_count():
                    # Frozen for the forked runners, which are gone: what became garbage since is collected again
                    # (frozen, it would never be, in a process that trains one run after another).
                    gc.unfreeze()
            if any_port:
                self.server_port = 0
            self._check_process_exitcodes(processes, warn_only=failed)

    def _shutdown_processes(
        self, processes: List[BaseProcess], stop_evt: ExecutionEvent, *, interrupted: bool = False
    ) -> None:
        """Stop children: event, then SIGINT, terminate and kill, each followed by a bounded wait.

        When this process was interrupted (Ctrl-C, SIGTERM), the children get SIGINT at once with the event, as a
        Ctrl-C in a terminal would give it to them: a runner does not watch the event while its agent runs.
        """
        stop_evt.set()
        if not processes:
            return
        actions: Tuple[Literal["sigint", "terminate", "kill"], ...] = ("sigint", "terminate", "kill")
        if interrupted:
            self._signal_processes([process for process in processes if process.is_alive()], "sigint")
            actions = ("terminate", "kill")
        alive = self._join_until_deadline(processes, self.graceful_timeout)
        for action in actions:
            if not alive:
                return
            logger.warning("Sending %s to %s", action, ", ".join(p.name for p in alive))
            self._signal_processes(alive, action)
            alive = self._join_until_deadline(alive, self.terminate_timeout)
        if alive:
            logger.error("Processes still alive after kill: %s", ", ".join(p.name for p in alive))

    @staticmethod
    def _join_until_deadline(processes: List[BaseProcess], timeout: float) -> List[BaseProcess]:
        deadline = time.monotonic() + timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        return [p for p in processes if p.is_alive()]

    @staticmethod
    def _signal_processes(processes: List[BaseProcess], action: Literal["sigint", "terminate", "kill"]) -> None:
        for process in processes:
            try:
                if action == "sigint" and process.pid is not None:
                    os.kill(process.pid, signal.SIGINT)
                elif action == "terminate":
                    process.terminate()
                elif action == "kill":
                    process.kill()
            except (ProcessLookupError, OSError) as exc:
                logger.debug("Could not %s %s: %s", action, process.name, exc)

    def _check_process_exitcodes(self, processes: List[BaseProcess], warn_only: bool = False) -> None:
        allowed = set(self.allowed_exit_codes)
        if self.interrupted:  # the children got the same Ctrl-C and stopped as asked
            allowed |= {INTERRUPTED_EXIT_CODE, -signal.SIGINT}
        bad = [(p.name, p.exitcode) for p in processes if p.exitcode is not None and p.exitcode not in allowed]
        if not bad:
            return
        message = "Subprocesses failed with unexpected exit codes: " + ", ".join(f"{n}={c}" for n, c in bad)
        if warn_only:
            logger.warning(message)
        else:
            raise RuntimeError(message)
