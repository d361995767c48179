"""``agentbolt store``: a real server process over a SQLite file, clean shutdown on signals, argument errors."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional

import aiohttp
import pytest
from support.servers import free_port, taken_port
from support.slow_clients import trickle

from agentbolt.cli.app import run
from agentbolt.cli.store import main as store_main
from agentbolt.store.client_server import LightningStoreClient

from .conftest import make_span


class StoreProcess:
    """``python -m agentbolt store ...`` running as a child process."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.port = port
        self.output: List[str] = []
        self.endpoint = f"http://127.0.0.1:{port}"

    @classmethod
    async def start(cls, *args: str, env: Optional[Dict[str, str]] = None) -> StoreProcess:
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentbolt",
            "store",
            "--port",
            str(port),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        started = cls(proc, port)
        await started.read_until("agentbolt store: serving")
        return started

    async def read_until(self, marker: str, timeout: float = 60.0) -> str:
        assert self.proc.stdout is not None

        async def scan() -> str:
            while True:
                raw = await self.proc.stdout.readline()  # type: ignore[union-attr]
                if not raw:
                    raise AssertionError(f"process ended before {marker!r}:\n" + "".join(self.output))
                line = raw.decode()
                self.output.append(line)
                if marker in line:
                    return line

        return await asyncio.wait_for(scan(), timeout)

    async def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return await self.finish()

    async def finish(self) -> int:
        """Collect the remaining output and the exit code."""
        assert self.proc.stdout is not None
        rest = await asyncio.wait_for(self.proc.stdout.read(), timeout=60)
        self.output.append(rest.decode())
        return await asyncio.wait_for(self.proc.wait(), timeout=60)

    @property
    def text(self) -> str:
        return "".join(self.output)


def client_for(endpoint: str, **kwargs: str) -> LightningStoreClient:
    return LightningStoreClient(endpoint, retry_delays=(), health_retry_delays=(), **kwargs)


async def test_sigterm_then_restart_keeps_data(tmp_path: Path) -> None:
    db = tmp_path / "runs" / "exp1" / "store.db"  # missing folders are created
    first = await StoreProcess.start("--path", str(db))
    try:
        assert f"data in {db} (sqlite)" in first.text
        assert f"serving {first.endpoint}/v1/agl" in first.text
        client = client_for(first.endpoint)
        queued = await client.enqueue_rollout({"task": "kept"})
        running = await client.start_rollout({"task": "running"})
        sequence_id = await client.get_next_span_sequence_id(running.rollout_id, running.attempt.attempt_id)
        await client.add_span(make_span(running.rollout_id, running.attempt.attempt_id, sequence_id, "s1"))
        await client.close()
    finally:
        code = await first.stop(signal.SIGTERM)
    assert code == 0, first.text
    assert "agentbolt store: stopped" in first.text

    second = await StoreProcess.start("--path", str(db))
    try:
        client = client_for(second.endpoint)
        assert (await client.get_rollout_by_id(queued.rollout_id)).status == "queuing"  # type: ignore[union-attr]
        spans = await client.query_spans(running.rollout_id)
        assert [s.span_id for s in spans] == ["s1"]
        assert await client.get_next_span_sequence_id(running.rollout_id, running.attempt.attempt_id) == 2
        claimed = await client.dequeue_rollout()
        assert claimed is not None and claimed.rollout_id == queued.rollout_id
        await client.close()
    finally:
        code = await second.stop(signal.SIGINT)
    assert code == 0, second.text


async def test_in_flight_request_finishes_on_sigterm(tmp_path: Path) -> None:
    proc = await StoreProcess.start("--path", str(tmp_path / "s.db"))
    try:
        async with aiohttp.ClientSession() as http:
            # A request the server holds for a while: waiting (1.5 s) for a rollout that never finishes.
            created = await (await http.post(f"{proc.endpoint}/v1/agl/rollouts", json={"input": 1})).json()
            in_flight = asyncio.ensure_future(
                http.post(
                    f"{proc.endpoint}/v1/agl/waits/rollouts",
                    json={"rollout_ids": [created["rollout_id"]], "timeout": 1.5},
                )
            )
            await asyncio.sleep(0.3)
            proc.proc.send_signal(signal.SIGTERM)
            response = await asyncio.wait_for(in_flight, timeout=30)
            assert response.status == 200
            assert await response.json() == []
        code = await proc.finish()
    finally:
        if proc.proc.returncode is None:
            await proc.stop(signal.SIGKILL)
    assert code == 0, proc.text
    assert "agentbolt store: stopped" in proc.text


async def test_memory_backend_and_api_key_from_environment() -> None:
    proc = await StoreProcess.start("--backend", "memory", env={"AGENTBOLT_API_KEY": "tok"})
    try:
        assert "data in memory" in proc.text
        assert "bearer token required" in proc.text
        async with aiohttp.ClientSession() as http, http.get(f"{proc.endpoint}/v1/agl/statistics") as response:
            assert response.status == 401
        client = client_for(proc.endpoint, api_key="tok")
        assert (await client.statistics())["name"] == "InMemoryLightningStore"
        await client.close()
    finally:
        assert await proc.stop(signal.SIGINT) == 0


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_request_limits_apply_in_every_launch_mode(tmp_path: Path, workers: str) -> None:
    """``--max-request-bytes`` and ``--body-timeout`` reach the app, whether one process serves it or several."""
    proc = await StoreProcess.start(
        "--path", str(tmp_path / "s.db"), "--workers", workers, "--max-request-bytes", "2000", "--body-timeout", "0.5"
    )
    try:
        async with aiohttp.ClientSession() as http:
            too_large = {"input": "x" * 3000}
            async with http.post(f"{proc.endpoint}/v1/agl/rollouts", json=too_large) as response:
                assert response.status == 413
        body = b'{"input": "slow"}'
        head = (
            f"POST /v1/agl/rollouts HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        answer = await trickle(proc.endpoint, head, body, interval=0.2)
        assert answer.status == 408 and answer.closed
        client = client_for(proc.endpoint)
        try:
            assert (await client.query_rollouts()).total == 0  # neither request stored anything
        finally:
            await client.close()
    finally:
        assert await proc.stop(signal.SIGTERM) == 0, proc.text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "postgresql"], "Invalid value for '--backend'"),
        (["--port", "http"], "Invalid value for '--port'"),
        (["--port", "70000"], "Invalid value for '--port'"),
        (["--log-level", "LOUD"], "Invalid value for '--log-level'"),
        (["--path", "/dev/null/runs/x.db"], "/dev/null is a file, not a folder"),
        (["--backend", "memory", "--path", "x.db"], "--path only applies to --backend sqlite"),
        (["--frobnicate"], "No such option"),
        (["--backend", "memory", "--workers", "2"], "needs a store shared between processes"),
        (["--backend", "postgres"], "--backend postgres needs --dsn"),
        (
            ["--backend", "postgres", "--dsn", f"host=127.0.0.1 port={free_port()} dbname=x connect_timeout=2"],
            "cannot open the store: Cannot connect to PostgreSQL",
        ),
        (["--backend", "postgres", "--dsn", "x=1", "--schema", "1bad"], "Invalid schema name"),
        (["--body-timeout", "0"], "--body-timeout must be a finite number > 0"),
        (["--body-timeout", "nan"], "--body-timeout must be a finite number > 0"),
        (["--max-request-bytes", "0"], "Invalid value for '--max-request-bytes'"),
    ],
)
def test_bad_arguments_exit_2(args: List[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    if "--port" not in args:  # the errors checked after the port's: never depend on the default port being free
        args = [*args, "--port", str(free_port())]
    assert run(["store", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentbolt: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_path_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert store_main(["--path", str(tmp_path)]) == 2  # a directory, through the compatibility entry point
    assert "is a directory" in capsys.readouterr().err
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    assert run(["store", "--port", str(free_port()), "--path", str(garbage)]) == 2
    err = capsys.readouterr().err
    assert f"cannot open the store at {garbage}" in err
    assert garbage.read_bytes() == b"this is not a database" * 100
    if os.geteuid() != 0:  # root can read anything
        locked = tmp_path / "locked.db"
        locked.write_bytes(b"")
        locked.chmod(0)
        assert run(["store", "--path", str(locked)]) == 2
        assert "not readable and writable" in capsys.readouterr().err


def test_port_in_use_exits_2_without_touching_the_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with taken_port() as port:
        assert run(["store", "--port", str(port), "--path", str(tmp_path / "s.db")]) == 2
        assert run(["store", "--port", str(port), "--path", str(tmp_path / "runs" / "s.db")]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()
    assert not (tmp_path / "runs").exists()


async def test_module_entry_point_reports_errors() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentbolt", "store", "--backend", "nope", stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2
    assert err.decode().startswith("agentbolt: error: Invalid value for '--backend'")


def test_a_dsn_in_the_environment_with_another_backend_is_named_in_a_warning(tmp_path: Path) -> None:
    import subprocess

    env = dict(os.environ, AGENTBOLT_STORE_DSN="host=127.0.0.1 dbname=runs", COLUMNS="400")
    # --workers 2 on the memory backend is refused right after the options are read: nothing is served.
    command = [sys.executable, "-m", "agentbolt", "store", "--port", str(free_port()), "--backend", "memory"]
    result = subprocess.run([*command, "--workers", "2"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    output = result.stdout + result.stderr
    assert "$AGENTBOLT_STORE_DSN is set but the backend is memory: the DSN is not used" in output
    assert "add --backend postgres" in output and "dbname=runs" not in output
