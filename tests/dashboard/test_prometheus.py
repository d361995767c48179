"""``agentbolt prometheus`` aggregates the metrics of several processes; a store with ``--tracker prometheus``
records ``agl.http.*``; a scrape reads them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import httpx
import pytest
from support.servers import REPO, free_port, wait_healthy

pytest.importorskip("prometheus_client")

from agentbolt.cli.prometheus import create_prometheus_app, ensure_prometheus_dir


def _env(**extra: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


@pytest.fixture
def multiproc_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    return directory


@pytest.fixture
def exporter(multiproc_dir: Path) -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "agentbolt", "prometheus", "--port", str(port), "--log-level", "WARNING"]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_metrics_of_a_store_and_of_a_runner_process_are_scraped_together(
    tmp_path: Path, multiproc_dir: Path, exporter: str
) -> None:
    # A store server recording agl.http.* into the shared directory, and a few requests to it.
    port = free_port()
    store = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentbolt",
            "store",
            "--backend",
            "memory",
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--tracker",
            "prometheus",
        ],
        cwd=REPO,
        env=_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base + "/v1/agl/health", store)
        created = httpx.post(base + "/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": "x"}]}).json()
        httpx.get(f"{base}/v1/agl/rollouts/{created[0]['rollout_id']}")
        httpx.get(f"{base}/v1/agl/rollouts/ro-unknown")
        # The store's own /v1/prometheus mount serves the same registry.
        own = httpx.get(base + "/v1/prometheus/")
        assert own.status_code == 200 and "agl_http_total" in own.text
    finally:
        store.terminate()
        store.wait(timeout=30)
    # Another process recording runner metrics through AGENTBOLT_METRICS.
    script = textwrap.dedent(
        """
        import asyncio
        from agentbolt.runner.metrics import runner_metrics
        metrics = runner_metrics()
        asyncio.run(metrics.record("succeeded", "train", 1.5))
        asyncio.run(metrics.record("failed", None, 0.5))
        """
    )
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        check=True,
        env=_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir), AGENTBOLT_METRICS="prometheus"),
    )

    scraped = httpx.get(exporter + "/v1/prometheus").text

    assert 'agl_http_total{method="GET",path="/v1/agl/rollouts/{rollout_id}",status="200"} 2.0' in scraped
    assert 'agl_http_total{method="POST",path="/v1/agl/queues/rollouts/enqueue",status="201"} 1.0' in scraped
    assert 'agl_http_latency_count{method="GET",path="/v1/agl/rollouts/{rollout_id}",status="200"} 2.0' in scraped
    assert 'agentbolt_runner_rollouts_total{mode="train",status="succeeded"} 1.0' in scraped
    assert 'agentbolt_runner_rollouts_total{mode="none",status="failed"} 1.0' in scraped
    assert 'agentbolt_runner_rollout_duration_sum{mode="train",status="succeeded"} 1.5' in scraped
    assert httpx.get(exporter + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--metrics-path", "metrics"], True, "must start with '/'"),
        (["--metrics-path", "/"], True, "cannot be the root"),
        ([], False, "PROMETHEUS_MULTIPROC_DIR is not set"),
        (["--log-level", "LOUD"], True, "--log-level"),
    ],
)
def test_bad_options_fail_with_one_line_and_exit_code_2(tmp_path: Path, args: list, env: bool, message: str) -> None:
    environment = _env()
    environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if env:
        environment["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "dir")
    result = subprocess.run(
        [sys.executable, "-m", "agentbolt", "prometheus", "--port", str(free_port()), *args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_directory_is_created_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "new"))
    assert ensure_prometheus_dir() == str(tmp_path / "new") and (tmp_path / "new").is_dir()
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    with pytest.raises(ValueError, match="not set"):
        ensure_prometheus_dir()


@pytest.mark.parametrize("path", ["metrics", "/", "", "//"])
def test_the_app_refuses_a_bad_metrics_path(path: str) -> None:
    with pytest.raises(ValueError):
        create_prometheus_app(path)


def test_the_grafana_dashboard_queries_only_metrics_agentbolt_records() -> None:
    import json
    import re

    from agentbolt.algorithm.grpo.metrics import TRAINER_METRICS
    from agentbolt.gateway.metrics import GATEWAY_METRICS
    from agentbolt.runner.metrics import RUNNER_METRICS

    store_metrics = ["agl.http.total", "agl.http.latency", "agl.rollouts.total", "agl.rollouts.duration"]

    def base(name: str) -> str:  # without what Prometheus appends to counters and histograms
        return re.sub(r"_(total|bucket|sum|count)$", "", name.replace(".", "_"))

    known = {base(n) for n in [*GATEWAY_METRICS, *RUNNER_METRICS, *TRAINER_METRICS, *store_metrics]}
    dashboard = json.loads((REPO / "docs" / "grafana" / "agentbolt.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {base(m) for q in queries for m in re.findall(r"\b(?:agl|agentbolt)_\w+", q)}
    assert used and used <= known, used - known
    documented = (REPO / "docs" / "metrics.md").read_text()
    assert all(f"`{name}`" in documented or name in documented for name in [*GATEWAY_METRICS, *RUNNER_METRICS])


KEY = "prometheus-key"


@pytest.fixture
def store_refusal() -> Dict[str, object]:
    """What the store server answers a request without its key: the status, WWW-Authenticate and the body."""
    import asyncio

    from agentbolt.store.client_server import LightningStoreServer
    from agentbolt.store.memory import InMemoryLightningStore

    async def refusal() -> Dict[str, object]:
        server = LightningStoreServer(
            InMemoryLightningStore(thread_safe=True), "127.0.0.1", free_port(), launch_mode="asyncio", api_key=KEY
        )
        await server.start()
        try:
            async with httpx.AsyncClient() as client:
                answer = await client.get(server.endpoint + "/v1/agl/rollouts")
        finally:
            await server.stop()
        return {"status": answer.status_code, "www-authenticate": answer.headers["www-authenticate"], **answer.json()}

    return asyncio.run(refusal())


def _start_exporter(multiproc_dir: Path, args: List[str], **env: str) -> Tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "agentbolt", "prometheus", "--port", str(port), "--log-level", "WARNING", *args]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir), **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", process)
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        raise
    return process, url


@pytest.mark.parametrize("given_by", ["flag", "environment"])
def test_with_an_api_key_every_path_but_health_is_refused_as_the_store_refuses(
    multiproc_dir: Path, store_refusal: Dict[str, object], given_by: str
) -> None:
    if given_by == "flag":
        process, url = _start_exporter(multiproc_dir, ["--api-key", KEY])
    else:
        process, url = _start_exporter(multiproc_dir, [], AGENTBOLT_PROMETHEUS_API_KEY=KEY)
    try:
        paths = [
            ("GET", "/v1/prometheus"),
            ("GET", "/v1/prometheus/"),
            ("OPTIONS", "/v1/prometheus"),
            ("GET", "/no-such-path"),
            ("POST", "/health/../v1/prometheus"),
        ]
        refused = [
            httpx.request(method, url + path, headers=headers, timeout=10)
            for method, path in paths
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY})
        ]
        scraped = httpx.get(url + "/v1/prometheus", headers={"authorization": f"bearer {KEY}"}, timeout=10)
        health = httpx.get(url + "/health", timeout=10)
    finally:
        process.terminate()
        process.wait(timeout=30)
    for answer in refused:
        seen = {"status": answer.status_code, "www-authenticate": answer.headers.get("www-authenticate")}
        assert {**seen, **answer.json()} == store_refusal, (answer.request.url, answer.text)
    assert scraped.status_code == 200 and "text/plain" in scraped.headers["content-type"]
    assert health.json() == {"status": "ok"}


def test_without_an_api_key_the_metrics_are_open(exporter: str) -> None:
    assert httpx.get(exporter + "/v1/prometheus", timeout=10).status_code == 200


def test_an_empty_api_key_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        create_prometheus_app(api_key="")
