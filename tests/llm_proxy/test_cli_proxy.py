"""``agentbolt proxy`` as a real subprocess: YAML config, SQLite store file, clean shutdown, argument errors."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import httpx
import yaml

from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.utils.server_launcher import pick_free_port

from .conftest import model_list_for
from .fake_backend import RESPONSE_TOKENS, FakeBackend

CLI = [sys.executable, "-c", "import sys; from agentbolt.cli.proxy import main; sys.exit(main(sys.argv[1:]))"]


def _run(args: List[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


async def _wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("proxy did not become healthy")


async def test_proxy_command_records_into_a_sqlite_file(backend: FakeBackend, tmp_path: Path) -> None:
    config = tmp_path / "models.yaml"
    config.write_text(
        yaml.safe_dump({"model_list": model_list_for(backend)[:1], "litellm_settings": {"num_retries": 1}})
    )
    db = tmp_path / "store.db"
    store = SqliteLightningStore(db)
    rollout = await store.start_rollout(input={"q": 1})
    await store.close()

    port = pick_free_port()
    args = ["--config", str(config), "--store", f"sqlite:///{db}", "--port", str(port)]
    process = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        await _wait_healthy(url, process)
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions",
                json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert response.status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert f"serving {url}/v1 (models: echo)" in out and "stopped" in out

    store = SqliteLightningStore(db)
    spans = await store.query_spans(rollout.rollout_id)
    await store.close()
    assert len(spans) == 1 and spans[0].attributes["response_token_ids"] == RESPONSE_TOKENS


def test_proxy_command_argument_errors(tmp_path: Path) -> None:
    missing = _run(["--config", str(tmp_path / "nope.yaml"), "--store", str(tmp_path / "s.db")])
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump([{"model_name": "m", "litellm_params": {"model": "hosted_vllm/m"}}]))
    invalid = _run(["--config", str(bad), "--store", str(tmp_path / "s.db")])
    assert invalid.returncode == 2 and "api_base is required" in invalid.stderr
    assert not (tmp_path / "s.db").exists()

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump([{"model_name": "m", "litellm_params": {"model": "openai/m"}}]))
    port = pick_free_port()
    unreachable = _run(["--config", str(good), "--store", f"http://127.0.0.1:{port}", "--port", str(pick_free_port())])
    assert unreachable.returncode == 1 and "no store answers" in unreachable.stderr
