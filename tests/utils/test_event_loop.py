"""The servers' event loop: uvloop when installed, asyncio's own on request, a clear error for a bad choice."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest

from agentbolt.utils import event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_servers_run_on_uvloop_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.delenv(event_loop.EVENT_LOOP_ENV_VAR, raising=False)
    assert event_loop.event_loop_name() == "uvloop"
    assert event_loop.run(_loop_module()).startswith("uvloop")


def test_the_standard_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.EVENT_LOOP_ENV_VAR, "asyncio")
    assert event_loop.run(_loop_module()) == "asyncio.unix_events"


def test_threads_get_loops_of_the_same_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.EVENT_LOOP_ENV_VAR, "asyncio")
    loop = event_loop.new_event_loop()
    try:
        assert type(loop).__module__ == "asyncio.unix_events"
    finally:
        loop.close()
    if importlib.util.find_spec("uvloop") is not None:
        monkeypatch.delenv(event_loop.EVENT_LOOP_ENV_VAR)
        loop = event_loop.new_event_loop()
        try:
            assert type(loop).__module__.startswith("uvloop")
        finally:
            loop.close()


def test_an_unknown_loop_is_refused_and_the_coroutine_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.EVENT_LOOP_ENV_VAR, "trio")
    coroutine = _loop_module()
    with pytest.raises(ValueError, match=r"AGENTBOLT_EVENT_LOOP='trio' is not one of auto, uvloop, asyncio"):
        event_loop.run(coroutine)
    assert coroutine.cr_frame is None  # closed: no "never awaited" warning


def test_asking_for_uvloop_without_it_is_a_clear_error() -> None:
    code = (
        "import sys; sys.modules['uvloop'] = None\n"
        "from agentbolt.utils import event_loop\n"
        "try:\n"
        "    event_loop.event_loop_name()\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    env = {"AGENTBOLT_EVENT_LOOP": "uvloop", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "uvloop is not installed" in result.stdout, result.stderr


def test_the_store_command_serves_on_uvloop() -> None:
    """`agentbolt store` logs the loop it runs on at DEBUG; with uvloop installed it is uvloop."""
    pytest.importorskip("uvloop")
    from agentbolt.utils.server_launcher import pick_free_port

    port = pick_free_port("127.0.0.1")
    command = [sys.executable, "-m", "agentbolt", "store", "--backend", "memory", "--port", str(port)]
    command += ["--log-level", "DEBUG"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if "Running on the" in line or len(lines) > 200:
                break
        assert any("Running on the uvloop event loop" in line for line in lines), "".join(lines)
    finally:
        process.terminate()
        process.wait(timeout=30)
