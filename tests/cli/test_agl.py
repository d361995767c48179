"""The ``agl`` command line: the reference's command name and flags for ``store``, ``prometheus`` and ``vllm``.

The installed ``agl`` console script runs as a subprocess (``agl store --port N``, then its health route); flag
errors are checked in process through :func:`agentbolt.cli.agl_main`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import httpx
import pytest
from support.servers import free_port, wait_healthy

from agentbolt.cli import agl_main

AGL = Path(sys.executable).with_name("agl")
STARTUP = 180.0  # seconds a server may take to answer its health route on a loaded machine


def _start(args: List[str], cwd: Path, env: dict) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(AGL), *args], cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.fixture(scope="module")
def agl_script() -> Path:
    if not AGL.exists():
        pytest.fail(f"the agl console script is not installed beside {sys.executable}: reinstall the package")
    return AGL


def test_agl_store_serves_health_and_data(agl_script: Path, tmp_path: Path) -> None:
    port = free_port()
    process = _start(["store", "--port", str(port), "--log-level", "WARNING"], tmp_path, {})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, timeout=STARTUP)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/agl/health", timeout=5).json()["status"] == "ok"
    finally:
        assert _stop(process) == 0
    # The default backend is SQLite, in the working directory: the data outlives the process.
    assert (tmp_path / "agentbolt-store.db").exists()


def test_agl_store_takes_the_reference_flags(agl_script: Path, tmp_path: Path) -> None:
    """``--tracker prometheus console`` (several trackers after one flag), ``--n-workers``, ``--cors-origin``."""
    port = free_port()
    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    args = ["store", "--host", "127.0.0.1", "--port", str(port), "--backend", "sqlite", "--cors-origin", "*"]
    args += ["--log-level", "INFO", "--n-workers", "2", "--tracker", "prometheus", "console"]
    process = _start(args, tmp_path, {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, timeout=STARTUP)
        preflight = httpx.options(
            f"http://127.0.0.1:{port}/v1/agl/health",
            headers={"Origin": "http://example.test", "Access-Control-Request-Method": "GET"},
            timeout=5,
        )
        assert preflight.headers.get("access-control-allow-origin") in ("*", "http://example.test")
        scrape = httpx.get(f"http://127.0.0.1:{port}/v1/prometheus/", timeout=5)
        assert scrape.status_code == 200
    finally:
        assert _stop(process) == 0
    assert any(metrics_dir.iterdir()), "the prometheus tracker wrote nothing to PROMETHEUS_MULTIPROC_DIR"


def test_agl_prometheus_serves_health(agl_script: Path, tmp_path: Path) -> None:
    port = free_port()
    process = _start(["prometheus", "--port", str(port)], tmp_path, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, timeout=STARTUP)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/prometheus", timeout=5).status_code == 200
    finally:
        assert _stop(process) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["store", "--port", "0"], "--port"),
        (["store", "--port", "many"], "--port"),
        (["store", "--n-workers", "0"], "--n-workers"),
        (["store", "--log-level", "LOUD"], "--log-level"),
        (["store", "--backend", "redis"], "--backend"),
        (["store", "--tracker", "statsd"], "--tracker"),
        (["store", "--tracker", "console", "loud"], "'loud'"),
        (["store", "stray"], "'stray'"),
        (["store", "--backend", "mongo"], "MongoDB is not a store backend"),
        (["store", "--mongo-uri", "mongodb://localhost:27017/"], "MongoDB is not a store backend"),
        (["store", "--backend", "memory", "--n-workers", "2"], "--workers > 1"),
        (["store", "--no-such-flag"], "--no-such-flag"),
        (["prometheus", "--port", "70000"], "--port"),
        (["teleport"], "teleport"),
    ],
)
def test_flag_errors_exit_2_with_one_line(args: List[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert agl_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agl: error:"), err
    assert message in err
    assert len(err.splitlines()) == 1, err


def test_prometheus_without_its_directory_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert agl_main(["prometheus", "--port", str(free_port())]) != 0
    assert "PROMETHEUS_MULTIPROC_DIR" in capsys.readouterr().err


def test_help_names_the_program_agl(capsys: pytest.CaptureFixture[str]) -> None:
    assert agl_main(["store", "--help"]) == 0
    out = capsys.readouterr().out
    assert "agl store" in out
    for flag in ("--host", "--port", "--cors-origin", "--log-level", "--tracker", "--n-workers", "--backend"):
        assert flag in out


def test_agl_vllm_without_vllm_names_the_extra(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("vllm") or _importable("vllm"):
        pytest.skip("vllm is installed here; this checks the message shown without it")
    assert agl_main(["vllm", "serve", "some-model"]) != 0
    assert "vllm" in capsys.readouterr().err


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_prometheus_directory_that_cannot_be_created_is_a_clear_error(
    file_in_the_way: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(file_in_the_way / "metrics"))
    assert agl_main(["prometheus", "--port", str(free_port())]) == 2
    assert capsys.readouterr().err.endswith("cannot create it (Not a directory)\n")


def test_store_tracker_with_a_directory_that_cannot_be_created_is_a_clear_error(
    file_in_the_way: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(file_in_the_way / "metrics"))
    args = ["store", "--backend", "memory", "--port", str(free_port()), "--tracker", "prometheus"]
    assert agl_main(args) == 2
    assert capsys.readouterr().err.endswith("cannot create it (Not a directory)\n")
