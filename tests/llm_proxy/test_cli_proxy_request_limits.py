"""``agentbolt proxy --max-request-bytes N --body-timeout S``: the limits reach the gateway the command serves, and
bad values are refused in one line with exit code 2."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from support.slow_clients import trickle

from agentbolt.utils.server_launcher import pick_free_port

from .conftest import model_list_for
from .fake_backend import FakeBackend
from .test_cli_proxy import CLI, _run, _wait_healthy

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


async def test_the_request_limit_flags_reach_the_gateway(backend: FakeBackend, tmp_path: Path) -> None:
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump(model_list_for(backend)[:1]))
    port = pick_free_port()
    args = ["--config", str(config), "--store", str(tmp_path / "store.db"), "--port", str(port)]
    args += ["--max-request-bytes", "2000", "--body-timeout", "0.5"]
    process = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        await _wait_healthy(url, process)
        async with httpx.AsyncClient(timeout=60) as client:
            large = {**CHAT, "messages": [{"role": "user", "content": "x" * 3_000}]}
            assert (await client.post(f"{url}/v1/chat/completions", json=large)).status_code == 413
            assert (await client.post(f"{url}/v1/chat/completions", json=CHAT)).status_code == 200
        body = orjson.dumps(CHAT) + b" " * 1_000
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        answer = await trickle(url, head + body[:100], b"")  # then silence: the rest never comes
        assert answer.status == 408 and answer.closed, answer
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--body-timeout", "0"], "--body-timeout must be a finite number > 0, got 0.0"),
        (["--body-timeout", "inf"], "--body-timeout must be a finite number > 0, got inf"),
        (["--max-request-bytes", "0"], "Invalid value for '--max-request-bytes'"),
    ],
)
def test_bad_request_limits_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump([{"model_name": "m", "litellm_params": {"model": "openai/m"}}]))
    result = _run(["--config", str(config), "--store", str(tmp_path / "s.db"), "--port", str(pick_free_port()), *args])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("agentbolt proxy: error: ") or result.stderr.startswith("agentbolt: error: ")
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.db").exists()
