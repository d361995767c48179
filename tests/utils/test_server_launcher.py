"""PythonServerLauncher: asyncio, thread and forked-process modes, health checks, port conflicts, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List

import aiohttp
import pytest
from support.servers import taken_port

from agentbolt.utils import server_launcher
from agentbolt.utils.server_launcher import (
    MAX_FAILED_STARTS,
    RESTART_DELAY_SECONDS,
    LaunchMode,
    PythonServerLauncher,
    PythonServerLauncherArgs,
    on_shutdown_start,
    pick_free_port,
)


async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
    """A minimal ASGI app (module-level, hence picklable): /health, /pid, /unhealthy, /slow."""
    assert scope["type"] == "http"
    path = scope["path"]
    status, body = 200, b"ok"
    if path == "/pid":
        body = str(os.getpid()).encode()
    elif path == "/unhealthy":
        status, body = 503, b"no"
    elif path == "/slow":
        await asyncio.sleep(0.5)
        body = b"slow done"
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.text()


def args(mode: LaunchMode, **kwargs: Any) -> PythonServerLauncherArgs:
    return PythonServerLauncherArgs(launch_mode=mode, healthcheck_url="/health", startup_timeout=20, **kwargs)


@pytest.mark.parametrize("mode", ["asyncio", "thread", "mp"])
async def test_start_serve_stop_restart(mode: LaunchMode) -> None:
    launcher = PythonServerLauncher(app, args(mode))
    assert launcher.host == "127.0.0.1" and launcher.access_endpoint == f"http://127.0.0.1:{launcher.port}"
    assert launcher.health_url == launcher.access_endpoint + "/health"
    await launcher.start()
    try:
        assert launcher.is_running()
        status, pid = await get(launcher.access_endpoint + "/pid")
        assert status == 200
        assert (int(pid) != os.getpid()) == (mode == "mp")
        with pytest.raises(RuntimeError, match="already running"):
            await launcher.start()
        await launcher.reload()
        assert launcher.is_running()
        assert (await get(launcher.access_endpoint + "/health"))[0] == 200
    finally:
        await launcher.stop()
    assert not launcher.is_running()
    with pytest.raises(aiohttp.ClientConnectorError):
        await get(launcher.access_endpoint + "/health")


@pytest.mark.parametrize(("mode", "n_workers"), [("asyncio", 1), ("thread", 1), ("mp", 1), ("mp", 3)])
async def test_port_in_use(mode: LaunchMode, n_workers: int) -> None:
    with taken_port() as port:
        launcher = PythonServerLauncher(app, args(mode, port=port, n_workers=n_workers))
        with pytest.raises(RuntimeError, match="did not start up within") as info:
            await launcher.start()
        assert isinstance(info.value.__cause__, OSError)
    assert not launcher.is_running()


@pytest.mark.parametrize("mode", ["asyncio", "thread", "mp"])
async def test_unhealthy_server_is_killed(mode: LaunchMode) -> None:
    launcher = PythonServerLauncher(
        app, PythonServerLauncherArgs(launch_mode=mode, healthcheck_url="unhealthy", startup_timeout=2.0)
    )
    assert launcher.health_url is not None and launcher.health_url.endswith("/unhealthy")
    with pytest.raises(RuntimeError, match=r"is not healthy.*It has been killed"):
        await launcher.start()
    assert not launcher.is_running()
    with pytest.raises(aiohttp.ClientConnectorError):
        await get(launcher.access_endpoint + "/health")


async def test_unhealthy_server_can_be_kept() -> None:
    launcher = PythonServerLauncher(
        app,
        PythonServerLauncherArgs(healthcheck_url="/unhealthy", startup_timeout=2.0, kill_unhealthy_server=False),
    )
    await launcher.start()
    try:
        assert launcher.is_running()
        assert (await get(launcher.access_endpoint + "/pid"))[0] == 200
    finally:
        await launcher.stop()


async def test_in_flight_request_finishes_on_stop() -> None:
    launcher = PythonServerLauncher(app, args("thread"))
    await launcher.start()
    slow = asyncio.ensure_future(get(launcher.access_endpoint + "/slow"))
    await asyncio.sleep(0.2)
    await launcher.stop()
    assert await slow == (200, "slow done")


async def test_shutdown_hooks_run_once_per_stop_before_in_flight_requests_finish(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    calls: List[Any] = []
    long_poll_ended = asyncio.Event()

    async def long_poll(request: Any) -> PlainTextResponse:
        await long_poll_ended.wait()
        return PlainTextResponse("ended by the hook")

    def failing_hook(grace: float) -> None:
        raise RuntimeError("hook failure")

    def last_hook(grace: float) -> None:
        calls.append(("last", grace))
        long_poll_ended.set()

    starlette_app = Starlette(
        routes=[Route("/health", lambda request: PlainTextResponse("ok")), Route("/poll", long_poll)]
    )
    on_shutdown_start(starlette_app, lambda grace: calls.append(("first", grace)))
    on_shutdown_start(starlette_app, failing_hook)
    on_shutdown_start(starlette_app, last_hook)
    launcher = PythonServerLauncher(starlette_app, args("asyncio", thread_join_timeout=8))
    for stops in range(2):
        await launcher.start()
        long_poll_ended.clear()
        poll = asyncio.ensure_future(get(launcher.access_endpoint + "/poll"))
        await asyncio.sleep(0.2)
        assert calls == [("first", 4.0), ("last", 4.0)] * stops  # not before the server stops
        await launcher.stop()
        assert await poll == (200, "ended by the hook")
    assert calls == [("first", 4.0), ("last", 4.0)] * 2  # the grace period: half the join timeout
    assert caplog.text.count("A shutdown hook of the server failed") == 2


async def test_serve_context_wraps_serving() -> None:
    events: List[str] = []

    @contextlib.asynccontextmanager
    async def context() -> AsyncIterator[None]:
        events.append("enter")
        yield
        events.append("exit")

    launcher = PythonServerLauncher(app, args("asyncio"), serve_context=context)
    await launcher.start()
    await launcher.reload()  # a factory can be entered again
    await launcher.stop()
    assert events == ["enter", "exit", "enter", "exit"]


async def test_run_forever_stops_on_cancel() -> None:
    launcher = PythonServerLauncher(app, args("thread"))
    task = asyncio.ensure_future(launcher.run_forever())
    for _ in range(200):
        if launcher.is_running():
            break
        await asyncio.sleep(0.05)
    assert (await get(launcher.access_endpoint + "/health"))[0] == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not launcher.is_running()


async def test_pickled_launcher_keeps_its_address() -> None:
    launcher = PythonServerLauncher(app, args("asyncio", port=pick_free_port()))
    copy: PythonServerLauncher = pickle.loads(pickle.dumps(launcher))
    assert (copy.host, copy.port, copy.access_endpoint) == (launcher.host, launcher.port, launcher.access_endpoint)
    assert not copy.is_running()
    await copy.start()
    try:
        assert (await get(launcher.access_endpoint + "/health"))[0] == 200
    finally:
        await copy.stop()


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="launch mode"):
        PythonServerLauncher(app, PythonServerLauncherArgs(launch_mode="fork"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="launch_mode='mp'"):
        PythonServerLauncher(app, PythonServerLauncherArgs(n_workers=2))
    wildcard = PythonServerLauncher(app, PythonServerLauncherArgs(host="0.0.0.0", port=1234))
    assert wildcard.endpoint == "http://0.0.0.0:1234"
    assert wildcard.access_host != "0.0.0.0"
    explicit = PythonServerLauncher(app, PythonServerLauncherArgs(host="0.0.0.0", port=1, access_host="box.local"))
    assert explicit.access_endpoint == "http://box.local:1"
    assert PythonServerLauncher(app, PythonServerLauncherArgs(port=1)).health_url is None


async def test_several_workers_share_the_port_and_dead_ones_are_replaced() -> None:
    launcher = PythonServerLauncher(app, args("mp", n_workers=2))
    await launcher.start()
    try:
        pids = {int((await get(launcher.access_endpoint + "/pid"))[1]) for _ in range(40)}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
        workers = [process.pid for process in launcher._processes]
        assert len(workers) == 2 and pids <= set(workers)
        os.kill(workers[0], signal.SIGKILL)
        for _ in range(100):  # the supervisor notices within half a second and forks a replacement
            await asyncio.sleep(0.1)
            current = [process.pid for process in launcher._processes]
            if workers[0] not in current and all(process.is_alive() for process in launcher._processes):
                break
        else:
            raise AssertionError("the killed worker was not replaced")
        assert (await get(launcher.access_endpoint + "/health"))[0] == 200
        processes = list(launcher._processes)
    finally:
        await launcher.stop()
    assert not launcher.is_running()
    assert all(not process.is_alive() for process in processes)


def _fails_while(marker: Path) -> Any:
    """A serve context factory whose context fails to open while ``marker`` exists (a store that cannot open)."""

    @contextlib.asynccontextmanager
    async def context() -> AsyncIterator[None]:
        if marker.exists():
            raise RuntimeError(f"cannot open the store: {marker} is in the way")
        yield

    return context


async def _wait_until_stopped(launcher: PythonServerLauncher) -> None:
    for _ in range(1200):
        if not launcher.is_running():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the server kept running")


async def test_a_worker_that_can_never_restart_stops_the_whole_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "broken"
    launcher = PythonServerLauncher(app, args("mp", n_workers=2), serve_context=_fails_while(marker))
    await launcher.start()
    try:
        workers = list(launcher._processes)
        marker.touch()
        with caplog.at_level(logging.ERROR, logger="agentbolt.utils.server_launcher"):
            os.kill(workers[0].pid, signal.SIGKILL)
            await _wait_until_stopped(launcher)
        assert launcher.failure is not None
        assert f"worker 0 failed to start {MAX_FAILED_STARTS} times in a row" in launcher.failure
        assert f"{marker} is in the way" in launcher.failure
        given_up = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Stopping the server")]
        assert given_up == [f"Stopping the server: {launcher.failure}."]
        # The killed worker had just started: its death is the first failed start of the run.
        failed_starts = [r.getMessage() for r in caplog.records if "failed to start (" in r.getMessage()]
        assert len(failed_starts) == MAX_FAILED_STARTS - 1
        assert f"({MAX_FAILED_STARTS} of {MAX_FAILED_STARTS} failed starts in a row)" in failed_starts[-1]
        assert not workers[1].is_alive()  # the healthy worker was stopped with the rest
    finally:
        await launcher.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(launcher.access_endpoint + "/health")


async def test_run_forever_raises_when_a_worker_can_never_restart(tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    launcher = PythonServerLauncher(app, args("mp", n_workers=2), serve_context=_fails_while(marker))
    running = asyncio.ensure_future(launcher.run_forever())
    try:
        while len(launcher._processes) < 2 or not launcher.is_running():
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # past start-up: both workers serve
        marker.touch()
        os.kill(launcher._processes[1].pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=f"worker 1 failed to start {MAX_FAILED_STARTS} times"):
            await asyncio.wait_for(running, 120)
    finally:
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        await launcher.stop()


async def test_a_worker_that_served_for_a_while_is_replaced_however_often_it_dies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every worker counts as having served long enough: deaths never add up to a run of failed starts.
    monkeypatch.setattr(server_launcher, "WORKER_HEALTHY_SECONDS", 0.0)
    launcher = PythonServerLauncher(app, args("mp", n_workers=2))
    await launcher.start()
    try:
        for _ in range(MAX_FAILED_STARTS + 1):
            killed = launcher._processes[0].pid
            os.kill(killed, signal.SIGKILL)
            for _ in range(1200):  # until the replacement answers (each request is a new connection)
                replacement = launcher._processes[0].pid
                with contextlib.suppress(aiohttp.ClientError):
                    if replacement != killed and (await get(launcher.access_endpoint + "/pid"))[1] == str(replacement):
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the killed worker was not replaced")
        assert launcher.is_running() and launcher.failure is None
    finally:
        await launcher.stop()


def test_restarts_back_off_up_to_a_few_seconds() -> None:
    delays = [server_launcher.restart_delay(failures) for failures in range(8)]
    assert delays[0] == 0.0
    assert delays[1:4] == [RESTART_DELAY_SECONDS, 2 * RESTART_DELAY_SECONDS, 4 * RESTART_DELAY_SECONDS]
    assert max(delays) == server_launcher.MAX_RESTART_DELAY_SECONDS
