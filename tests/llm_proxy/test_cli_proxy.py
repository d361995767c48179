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
import pytest
import yaml

from agentbolt.store.sqlite import SqliteLightningStore
from agentbolt.utils.server_launcher import pick_free_port

from .conftest import model_list_for
from .fake_backend import RESPONSE_TOKENS, FakeBackend, running_backend

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


async def test_stopping_proxy_records_the_calls_it_cuts_off(tmp_path: Path) -> None:
    """SIGTERM while calls wait on a backend longer than the grace period: each call gets an error answer and a span."""
    db = tmp_path / "store.db"
    store = SqliteLightningStore(db)
    rollout = await store.start_rollout(input={"q": 1})
    await store.close()
    async with running_backend(slow_seconds=60.0) as backend:
        config = tmp_path / "models.yaml"
        config.write_text(yaml.safe_dump({"model_list": model_list_for(backend)}))
        port = pick_free_port()
        args = ["--config", str(config), "--store", f"sqlite:///{db}", "--port", str(port)]
        process = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        calls = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"
        try:
            await _wait_healthy(url, process)
            async with httpx.AsyncClient(timeout=60) as client:

                async def call(model: str, stream: bool) -> httpx.Response:
                    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
                    return await client.post(calls, json=body)

                # Waiting for headers (slow), and a stream that sent its first event, then stalls (gated).
                cases = [("slow", False), ("slow", True), ("gated", True)]
                tasks = [asyncio.create_task(call(model, stream)) for model, stream in cases]
                while len(backend.requests) < len(cases):
                    await asyncio.sleep(0.05)
                process.send_signal(signal.SIGTERM)
                answers = await asyncio.gather(*tasks)
        finally:
            backend.gate.set()
            _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert [answer.status_code for answer in answers[:2]] == [503, 503]
    assert answers[0].json()["error"]["type"] == "gateway_shutdown"
    assert answers[2].status_code == 200 and "gateway_shutdown" in answers[2].text  # the stream's last event

    store = SqliteLightningStore(db)
    spans = await store.query_spans(rollout.rollout_id)
    await store.close()
    assert len(spans) == len(cases)
    assert {span.attributes["error.type"] for span in spans} == {"gateway_shutdown"}


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

    no_scheme = _run(["--config", str(good), "--store", f"127.0.0.1:{port}"])
    assert no_scheme.returncode == 2 and f"write it as a URL, http://127.0.0.1:{port}" in no_scheme.stderr
    assert not Path(f"127.0.0.1:{port}").exists()

    for name, content, message in [
        ("empty.yaml", yaml.safe_dump({"model_list": []}), "lists no models"),
        (
            "settings.yaml",
            yaml.safe_dump({"model_list": [{"model_name": "m"}], "litellm_settings": 5}),
            "must be a mapping",
        ),
    ]:
        (tmp_path / name).write_text(content)
        result = _run(["--config", str(tmp_path / name), "--store", str(tmp_path / "s.db")])
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00model_list")
    binary = _run(["--config", str(tmp_path / "binary.yaml"), "--store", str(tmp_path / "s.db")])
    assert binary.returncode == 2 and "is not UTF-8 text" in binary.stderr
    assert not (tmp_path / "s.db").exists()


def test_proxy_command_needs_the_key_of_a_store_that_requires_one(tmp_path: Path) -> None:
    from agentbolt.store.client_server import LightningStoreServer

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump([{"model_name": "m", "litellm_params": {"model": "openai/m"}}]))
    server = LightningStoreServer(SqliteLightningStore(tmp_path / "s.db"), "127.0.0.1", pick_free_port(), api_key="k")
    asyncio.run(server.start())
    try:
        result = _run(["--config", str(good), "--store", server.endpoint, "--port", str(pick_free_port())])
        assert result.returncode == 1 and "requires an API key: pass --store-api-key" in result.stderr
    finally:
        asyncio.run(server.stop())


@pytest.mark.slow
async def test_proxy_command_in_front_of_agentbolt_serve(tmp_path: Path) -> None:
    """End to end with both commands as real processes: token ids recorded by the proxy equal the engine's."""
    pytest.importorskip("transformers")
    from agentbolt.models.tiny import create_tiny_model

    model_dir = create_tiny_model(tmp_path / "tiny", seed=0)
    serve_port, proxy_port = pick_free_port(), pick_free_port()
    serve_cmd = [sys.executable, "-c", "import sys; from agentbolt.cli import main; sys.exit(main())", "serve"]
    serve = subprocess.Popen(
        [*serve_cmd, str(model_dir), "--port", str(serve_port), "--dtype", "float32", "--served-name", "tiny"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    db = tmp_path / "store.db"
    store = SqliteLightningStore(db)
    rollout = await store.start_rollout(input={"q": 1})
    await store.close()
    config = tmp_path / "models.yaml"
    entry = {
        "model_name": "tiny",
        "litellm_params": {"model": "agentbolt/tiny", "api_base": f"http://127.0.0.1:{serve_port}/v1"},
    }
    config.write_text(yaml.safe_dump([entry]))
    proxy = subprocess.Popen(
        [*CLI, "--config", str(config), "--store", str(db), "--port", str(proxy_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "temperature": 0.0, "max_tokens": 6}
    try:
        await _wait_healthy(f"http://127.0.0.1:{serve_port}", serve, timeout=180)
        await _wait_healthy(f"http://127.0.0.1:{proxy_port}", proxy)
        async with httpx.AsyncClient(timeout=60) as client:
            truth = (
                await client.post(
                    f"http://127.0.0.1:{serve_port}/v1/chat/completions", json={**body, "return_token_ids": True}
                )
            ).json()
            bound = f"http://127.0.0.1:{proxy_port}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}"
            proxied = await client.post(f"{bound}/v1/chat/completions", json=body)
        assert proxied.status_code == 200
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.communicate(timeout=30)
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
    store = SqliteLightningStore(db)
    [span] = await store.query_spans(rollout.rollout_id)
    await store.close()
    assert span.attributes["prompt_token_ids"] == truth["prompt_token_ids"]
    assert span.attributes["response_token_ids"] == truth["choices"][0]["token_ids"]
    assert len(span.attributes["response_logprobs"]) == len(truth["choices"][0]["token_ids"])
