"""Execution strategies against the contract (§11): Ctrl-C, role rules, port conflicts and exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import psutil
import pytest
from support.servers import taken_port

from agentbolt.execution import ClientServerExecutionStrategy, ExecutionEvent, SharedMemoryExecutionStrategy
from agentbolt.store.memory import InMemoryLightningStore


async def _wait_for(event: ExecutionEvent) -> None:
    while not event.is_set():
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------------------------------------------------
# Shared memory: Ctrl-C in the main thread


def _shm(main_thread: str, n_runners: int = 1) -> SharedMemoryExecutionStrategy:
    return SharedMemoryExecutionStrategy(
        n_runners=n_runners, main_thread=main_thread, graceful_delay=1.0, poll_interval=0.01, join_timeout=10
    )  # type: ignore[arg-type]


def test_shm_keyboard_interrupt_in_the_main_thread_algorithm_stops_the_runners_and_returns() -> None:
    stopped: List[int] = []

    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        await asyncio.sleep(0.2)
        raise KeyboardInterrupt

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        await _wait_for(event)
        stopped.append(worker_id)

    _shm("algorithm", n_runners=2).execute(algorithm, runner, InMemoryLightningStore())
    assert sorted(stopped) == [0, 1]
    assert not [t for t in threading.enumerate() if t.name.startswith("runner-")]


def test_shm_keyboard_interrupt_in_the_main_thread_runner_stops_the_algorithm_and_returns() -> None:
    stopped: List[str] = []

    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        await _wait_for(event)
        stopped.append("algorithm")

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        await asyncio.sleep(0.2)
        raise KeyboardInterrupt

    _shm("runner").execute(algorithm, runner, InMemoryLightningStore())
    assert stopped == ["algorithm"]
    assert not [t for t in threading.enumerate() if t.name == "algorithm"]


def test_shm_other_errors_still_propagate() -> None:
    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        raise ValueError("algorithm bug")

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        await _wait_for(event)

    with pytest.raises(ValueError, match="algorithm bug"):
        _shm("algorithm").execute(algorithm, runner, InMemoryLightningStore())


def test_shm_main_thread_runner_needs_exactly_one_runner() -> None:
    with pytest.raises(ValueError):
        SharedMemoryExecutionStrategy(n_runners=2, main_thread="runner")


def test_shm_runners_that_all_return_end_an_algorithm_still_waiting() -> None:
    """As when the one runner of main_thread="runner" returns: nobody is left to run what the algorithm waits for."""
    released = threading.Event()
    outcome: List[str] = []

    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        try:
            while not released.is_set():  # waits for rollouts, not for the event
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        await asyncio.sleep(0.1 * worker_id)  # e.g. done with its max_rollouts

    execute = threading.Thread(
        target=_shm("algorithm", n_runners=2).execute, args=(algorithm, runner, InMemoryLightningStore()), daemon=True
    )
    try:
        execute.start()
        execute.join(20)
        assert not execute.is_alive(), "execute still waits for an algorithm no runner works for"
        assert outcome == ["cancelled"]
    finally:
        released.set()
        execute.join(10)


SIGINT_SCRIPT = """
import asyncio, sys
from agentbolt.execution import SharedMemoryExecutionStrategy

main_thread = sys.argv[1]
ready = sys.argv[2]

async def wait(event):
    while not event.is_set():
        await asyncio.sleep(0.01)

async def algorithm(store, event):
    if main_thread == "algorithm":
        open(ready, "w").write("1")
    await wait(event)
    print("algorithm stopped", flush=True)

async def runner(store, worker_id, event):
    if main_thread == "runner":
        open(ready, "w").write("1")
    await wait(event)
    print("runner stopped", flush=True)

strategy = SharedMemoryExecutionStrategy(main_thread=main_thread, graceful_delay=2.0, poll_interval=0.01)
strategy.execute(algorithm, runner, None)
print("execute returned", flush=True)
"""


@pytest.mark.parametrize("main_thread", ["algorithm", "runner"])
def test_shm_real_ctrl_c_stops_both_sides_and_the_process_exits_cleanly(main_thread: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-c", SIGINT_SCRIPT, main_thread, str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the strategy did not start"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "execute returned" in stdout, stderr
    other = "runner" if main_thread == "algorithm" else "algorithm"
    assert f"{other} stopped" in stdout, stdout
    assert "Traceback" not in stderr, stderr


# ---------------------------------------------------------------------------------------------------------------
# Client-server: roles

NO_STORE: Any = None
"""The store of the unmanaged client-server runs below, whose bundles use none (an unmanaged store that lives in this
process, such as the in-memory one, is refused: see test_cs_environment.py)."""


@pytest.mark.parametrize(
    "kwargs",
    [
        {"main_process": "runner", "n_runners": 2},
        {"main_process": "runner", "role": "algorithm"},
        {"main_process": "runner", "role": "runner"},
        {"main_process": "nobody"},
        {"role": "boss"},
    ],
)
def test_cs_invalid_role_settings_are_value_errors(kwargs: Any) -> None:
    with pytest.raises(ValueError):
        ClientServerExecutionStrategy(**kwargs)


def test_cs_role_comes_from_the_argument_then_the_environment_then_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_CURRENT_ROLE", raising=False)
    assert ClientServerExecutionStrategy().role == "both"
    monkeypatch.setenv("AGL_CURRENT_ROLE", "runner")
    assert ClientServerExecutionStrategy().role == "runner"
    assert ClientServerExecutionStrategy(role="algorithm").role == "algorithm"
    monkeypatch.setenv("AGL_CURRENT_ROLE", "wizard")
    with pytest.raises(ValueError):
        ClientServerExecutionStrategy()
    monkeypatch.setenv("AGL_CURRENT_ROLE", "runner")
    with pytest.raises(ValueError):
        ClientServerExecutionStrategy(main_process="runner")  # needs role "both"


def test_cs_algorithm_role_runs_only_the_algorithm_in_process() -> None:
    ran: List[str] = []

    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        ran.append(f"algorithm pid={os.getpid()}")

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        ran.append("runner")

    strategy = ClientServerExecutionStrategy(role="algorithm", managed_store=False)
    strategy.execute(algorithm, runner, NO_STORE)
    assert ran == [f"algorithm pid={os.getpid()}"]


def test_cs_keyboard_interrupt_is_swallowed() -> None:
    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        raise KeyboardInterrupt

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None: ...

    ClientServerExecutionStrategy(role="algorithm", managed_store=False).execute(algorithm, runner, NO_STORE)


# ---------------------------------------------------------------------------------------------------------------
# Client-server: port conflicts


@pytest.fixture
def busy_port() -> Iterator[int]:
    with taken_port() as port:
        yield port


def _children() -> List[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if c.is_running()]


@pytest.mark.parametrize("role", ["algorithm", "both"])
def test_cs_port_conflict_is_a_runtime_error_and_leaves_no_process(role: str, busy_port: int) -> None:
    before = {c.pid for c in _children()}

    async def algorithm(store: Any, event: ExecutionEvent) -> None:
        raise AssertionError("must not run without its store server")

    async def runner(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        await _wait_for(event)

    strategy = ClientServerExecutionStrategy(
        role=role,  # type: ignore[arg-type]
        server_host="127.0.0.1",
        server_port=busy_port,
        n_runners=2,
        graceful_timeout=5,
        terminate_timeout=5,
    )
    with pytest.raises(RuntimeError, match="did not start up within"):
        strategy.execute(algorithm, runner, InMemoryLightningStore(thread_safe=True))
    assert {c.pid for c in _children()} <= before


# ---------------------------------------------------------------------------------------------------------------
# Client-server: exit codes


async def _runner_exiting_with(store: Any, worker_id: int, event: ExecutionEvent) -> None:
    if worker_id == 1:
        os._exit(3)


def _runner_strategy(**kwargs: Any) -> ClientServerExecutionStrategy:
    return ClientServerExecutionStrategy(
        role="runner", n_runners=2, managed_store=False, graceful_timeout=5, terminate_timeout=5, **kwargs
    )


async def _idle_algorithm(store: Any, event: ExecutionEvent) -> None: ...


def test_cs_unexpected_exit_code_of_a_child_is_a_runtime_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match=r"Subprocesses failed with unexpected exit codes: .*runner-1.*3"):
        _runner_strategy().execute(_idle_algorithm, _runner_exiting_with, NO_STORE)


def test_cs_allowed_exit_codes_are_accepted() -> None:
    strategy = _runner_strategy(allowed_exit_codes=[0, 3])
    assert strategy.allowed_exit_codes == (0, 3)
    strategy.execute(_idle_algorithm, _runner_exiting_with, NO_STORE)


def test_cs_exit_codes_only_warn_when_another_error_already_happened(caplog: pytest.LogCaptureFixture) -> None:
    async def failing_algorithm(store: Any, event: ExecutionEvent) -> None:
        await asyncio.sleep(1.0)  # the runners have exited by then
        raise ValueError("algorithm bug")

    strategy = ClientServerExecutionStrategy(
        role="both", n_runners=2, managed_store=False, graceful_timeout=5, terminate_timeout=5
    )
    with pytest.raises(ValueError, match="algorithm bug"):
        strategy.execute(failing_algorithm, _runner_exiting_with, NO_STORE)
    assert any("unexpected exit codes" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------------------------
# Client-server: a side never waits for processes that are gone


async def _algorithm_waiting_for_ever(store: Any, event: ExecutionEvent) -> None:
    """An algorithm that waits for rollouts nobody will run (it does not watch the stop event)."""
    await asyncio.sleep(3600)


def _both_sides(**kwargs: Any) -> ClientServerExecutionStrategy:
    return ClientServerExecutionStrategy(
        role="both", managed_store=False, graceful_timeout=0.5, terminate_timeout=5, **kwargs
    )


def test_cs_a_runner_process_that_dies_stops_the_algorithm_and_is_reported() -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"unexpected exit codes: .*runner-1=3"):
        _both_sides(n_runners=2).execute(_algorithm_waiting_for_ever, _runner_exiting_with, NO_STORE)
    assert time.monotonic() - started < 60  # it used to wait for ever


async def _runner_done_at_once(store: Any, worker_id: int, event: ExecutionEvent) -> None:
    """A runner that reached its rollout limit."""


def test_cs_runners_that_all_finish_end_an_algorithm_still_waiting(caplog: pytest.LogCaptureFixture) -> None:
    _both_sides(n_runners=2).execute(_algorithm_waiting_for_ever, _runner_done_at_once, NO_STORE)
    assert any("cancelling it" in record.getMessage() for record in caplog.records)


def test_cs_an_algorithm_process_that_dies_stops_the_runner_in_the_main_process() -> None:
    async def algorithm_dying(store: Any, event: ExecutionEvent) -> None:
        os._exit(4)

    async def runner_waiting(store: Any, worker_id: int, event: ExecutionEvent) -> None:
        await _wait_for(event)

    with pytest.raises(RuntimeError, match=r"unexpected exit codes: algorithm=4"):
        _both_sides(main_process="runner").execute(algorithm_dying, runner_waiting, NO_STORE)


CHILDREN_SCRIPT = """
import asyncio, os, sys
from agentbolt.execution.client_server import ClientServerExecutionStrategy

pids = os.path.join(sys.argv[1], "pids")

async def algorithm(store, event):
    while not os.path.exists(pids) or len(open(pids).read().split()) < 2:
        await asyncio.sleep(0.05)
    await asyncio.sleep(3600)

async def runner(store, worker_id, event):
    with open(pids, "a") as f:
        f.write(f"{os.getpid()} ")
    await asyncio.sleep(3600)  # does not watch the event: stopped by the escalation

strategy = ClientServerExecutionStrategy(
    role="both", n_runners=2, managed_store=False, graceful_timeout=1, terminate_timeout=2
)
strategy.execute(algorithm, runner, None)
print("execute returned", flush=True)
"""


def _children_started(path: Path, process: subprocess.Popen[str]) -> List[int]:
    deadline = time.monotonic() + 60
    while not path.exists() or len(path.read_text().split()) < 2:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the runners did not start"
        time.sleep(0.05)
    return [int(pid) for pid in path.read_text().split()]


def _gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` exits within ``within`` seconds (a zombie, exited but not reaped, counts)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def _run_with_two_children(
    tmp_path: Path, script: str = CHILDREN_SCRIPT
) -> Iterator[Tuple[subprocess.Popen[str], List[int]]]:
    """A process running ``script`` (a client-server strategy with two runner children, which write their pids to
    ``tmp_path / "pids"``); yields it and the children's pids.

    Every process is killed on the way out, whatever the test did to them.
    """
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    children: List[int] = []
    try:
        children = _children_started(tmp_path / "pids", process)
        yield process, children
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_cs_sigterm_stops_the_run_and_its_children(tmp_path: Path) -> None:
    with _run_with_two_children(tmp_path) as (process, children):
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
        assert "execute returned" in stdout, stderr
        assert all(_gone(pid, 5) for pid in children)


ORDER_SCRIPT = """
import asyncio, os, sys, time
from agentbolt.execution.client_server import ClientServerExecutionStrategy

folder = sys.argv[1]
pids = os.path.join(folder, "pids")

def interrupted():
    return [name for name in os.listdir(folder) if name.startswith("interrupted-")]

async def algorithm(store, event):
    while not os.path.exists(pids) or len(open(pids).read().split()) < 2:
        await asyncio.sleep(0.05)
    try:
        open(os.path.join(folder, "algorithm-waiting"), "w").close()
        await asyncio.sleep(3600)
    finally:  # the algorithm's clean-up (its model server would stop here): are the runners told already?
        deadline = time.monotonic() + 10
        while len(interrupted()) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        print(f"runners interrupted before the algorithm's clean-up ended: {len(interrupted())}", flush=True)

async def runner(store, worker_id, event):
    with open(pids, "a") as f:
        f.write(f"{os.getpid()} ")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        open(os.path.join(folder, f"interrupted-{os.getpid()}"), "w").close()
        raise

strategy = ClientServerExecutionStrategy(
    role="both", n_runners=2, managed_store=False, graceful_timeout=5, terminate_timeout=2
)
strategy.execute(algorithm, runner, None)
print("execute returned", flush=True)
"""


def test_cs_sigterm_interrupts_the_runners_before_the_algorithm_cleans_up(tmp_path: Path) -> None:
    """As a Ctrl-C in a terminal does: otherwise agents would see the algorithm's model server vanish mid-call."""
    with _run_with_two_children(tmp_path, ORDER_SCRIPT) as (process, _):
        deadline = time.monotonic() + 60
        while not (tmp_path / "algorithm-waiting").exists():
            assert process.poll() is None and time.monotonic() < deadline, "the algorithm did not start"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    assert "runners interrupted before the algorithm's clean-up ended: 2" in stdout, stdout + stderr
    assert "execute returned" in stdout, stderr


def test_cs_children_end_with_a_killed_parent(tmp_path: Path) -> None:
    with _run_with_two_children(tmp_path) as (process, children):
        process.kill()  # no chance to clean up
        process.wait()
        assert all(_gone(pid, 30) for pid in children)
