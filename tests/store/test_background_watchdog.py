"""The store server applies rollout time limits on its own, while no request comes in: a background watchdog scans
every debounce period (once per period among the worker processes of ``agentbolt store --workers``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from pathlib import Path
from typing import List

import httpx
import pytest
from support.servers import free_port, start_store_process, wait_serving

from agentbolt.store.base import LightningStore
from agentbolt.store.http import LightningStoreClient, LightningStoreServer
from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.store.threading import LightningStoreThreaded
from agentbolt.types import RolloutConfig


async def _attempt_statuses_on_disk(db: Path, rollout_id: str, wanted: str) -> List[str]:
    """The rollout's attempt statuses as stored in the file, read without running any watchdog (a read-only store
    never scans), polled until the latest is ``wanted`` or a minute passes."""
    reader = SqliteLightningStore(str(db), read_only=True)
    try:
        statuses: List[str] = []
        for _ in range(600):
            statuses = [attempt.status for attempt in await reader.query_attempts(rollout_id)]
            if statuses and statuses[-1] == wanted:
                break
            await asyncio.sleep(0.1)
        return statuses
    finally:
        await reader.close()


@pytest.mark.parametrize("threaded", [False, True], ids=["store", "threaded-store"])
async def test_a_rollout_times_out_while_nobody_calls_the_server(tmp_path: Path, threaded: bool) -> None:
    """Also when the served store is wrapped in a :class:`LightningStoreThreaded`."""
    db = tmp_path / "idle.db"
    store = SqliteLightningStore(str(db), scan_debounce_seconds=0.2)
    served: LightningStore = LightningStoreThreaded(store) if threaded else store
    server = LightningStoreServer(served, "127.0.0.1", free_port())
    await server.start()
    try:
        client = LightningStoreClient(server.endpoint)
        try:
            started = await client.start_rollout({"task": "slow"}, config=RolloutConfig(timeout_seconds=0.5))
        finally:
            await client.close()
        # No further call reaches the server from here on.
        assert await _attempt_statuses_on_disk(db, started.rollout_id, "timeout") == ["timeout"]
        assert server.is_running()
    finally:
        await server.stop()
        await store.close()


async def test_a_failing_background_scan_is_logged_and_the_server_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteLightningStore(str(tmp_path / "closed.db"), scan_debounce_seconds=0.1)
    server = LightningStoreServer(store, "127.0.0.1", free_port())
    await server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="agentbolt.store.server"):
            await store.close()  # every scan from now on fails
            for _ in range(600):
                if caplog.text.count("background watchdog scan failed") >= 2:
                    break
                await asyncio.sleep(0.05)
        assert caplog.text.count("background watchdog scan failed") >= 2  # it failed, and ran again
        assert server.is_running()
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{server.endpoint}/v1/agl/health")).status_code == 200
    finally:
        await server.stop()


async def test_worker_processes_time_out_rollouts_while_nobody_calls_them(tmp_path: Path) -> None:
    """``agentbolt store --workers 2 --scan-debounce-seconds 0.3``: the timeout is applied within a period or two of
    it passing, with no request after the rollout started."""
    db = tmp_path / "workers.db"
    port = free_port()
    options = ["--workers", "2", "--scan-debounce-seconds", "0.3"]
    server = start_store_process(db, port, options, stderr=subprocess.DEVNULL)
    try:
        await asyncio.to_thread(wait_serving, server)
        client = LightningStoreClient(f"http://127.0.0.1:{port}")
        try:
            started = await client.start_rollout({"task": "slow"}, config=RolloutConfig(timeout_seconds=0.5))
        finally:
            await client.close()
        assert await _attempt_statuses_on_disk(db, started.rollout_id, "timeout") == ["timeout"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_scan_period_that_cannot_work_is_refused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentbolt.cli.app import run

    assert (
        run(["store", "--port", str(free_port()), "--path", str(tmp_path / "s.db"), "--scan-debounce-seconds", value])
        == 2
    )
    err = capsys.readouterr().err
    assert "--scan-debounce-seconds must be a finite number >= 0" in err and not list(tmp_path.iterdir())
