"""The command lines of examples/minimal: a bad value, a taken port, a service that does not answer or a missing key
stops the script at once with exit code 2 and one error line naming it, never a traceback or a silent run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from support.examples import error_line, run_example
from support.servers import free_port, taken_port, wait_healthy


def test_write_metrics_on_a_taken_port_names_the_port() -> None:
    with taken_port() as port:
        line = error_line(run_example(["examples.minimal.write_metrics", "--port", str(port)]))
    assert line.startswith(f"error: --port {port}: cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--events", "-5"], "argument --events: must be at least 0, got -5"),
        (["--keep-serving", "-3"], "argument --keep-serving: must be at least 0, got -3"),
        (["--port", "70000"], "argument --port: must be at most 65535, got 70000"),
    ],
)
def test_write_metrics_refuses_a_value_out_of_range(args: List[str], message: str) -> None:
    assert message in error_line(run_example(["examples.minimal.write_metrics", *args]))


def test_write_traces_refuses_a_store_that_is_neither_memory_server_nor_url() -> None:
    line = error_line(run_example(["examples.minimal.write_traces", "--store", "sqlite.db"]))
    assert line == "error: --store must be 'memory', 'server' or an http(s) URL, not 'sqlite.db'"


def test_write_traces_to_a_store_url_that_refuses_connections_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = error_line(run_example(["examples.minimal.write_traces", "--store", url]))
    assert line.startswith(f"error: cannot reach the store server at {url} (")


def test_write_traces_with_an_llm_that_refuses_connections_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    line = error_line(run_example(["examples.minimal.write_traces", "--llm-base-url", url]))
    assert line.startswith(f"error: cannot reach the OpenAI-compatible endpoint at {url}/models (")


def test_llm_proxy_hosted_without_a_key_names_the_variable_and_the_local_backend() -> None:
    line = error_line(run_example(["examples.minimal.llm_proxy", "hosted"]))
    assert line.startswith("error: hosted needs OPENAI_API_KEY") and "llm_proxy local" in line


def test_llm_proxy_local_with_a_base_url_that_refuses_connections_names_it() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    line = error_line(run_example(["examples.minimal.llm_proxy", "local", "--base-url", url]))
    assert line.startswith(f"error: cannot reach the local engine at {url}/models (")


def test_engine_lifecycle_with_an_unknown_model_names_it() -> None:
    line = error_line(run_example(["examples.minimal.engine_lifecycle", "--model", "no-such-model"]))
    assert line.startswith("error: --model: model 'no-such-model' is neither a registry name")


def test_engine_lifecycle_refuses_an_unknown_dtype() -> None:
    line = error_line(run_example(["examples.minimal.engine_lifecycle", "--dtype", "fp8"]))
    assert "argument --dtype: invalid choice: 'fp8'" in line


def test_llm_proxy_local_with_an_unknown_model_to_start_names_it() -> None:
    line = error_line(run_example(["examples.minimal.llm_proxy", "local", "--start", "no-such-model"]))
    assert line.startswith("error: --start: model 'no-such-model' is neither a registry name")


def test_llm_proxy_local_refuses_both_a_server_to_attach_to_and_one_to_start() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ["examples.minimal.llm_proxy", "local", "--base-url", url, "--start", "smollm2-135m-instruct"]
    assert "argument --start: not allowed with argument --base-url" in error_line(run_example(args))


def test_llm_proxy_local_with_a_base_url_that_lists_no_model_names_it(tmp_path: Path) -> None:
    (tmp_path / "models").write_text("<html>sign in</html>")  # a web page where the model list should be
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/models", server)
        result = run_example(["examples.minimal.llm_proxy", "local", "--base-url", f"http://127.0.0.1:{port}"])
    finally:
        server.terminate()
        server.wait(timeout=30)
    line = error_line(result)
    assert line.startswith(f"error: --base-url: http://127.0.0.1:{port}/models answered HTTP 200 without a model list")
