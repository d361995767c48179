"""The start-up checks of the examples' commands (examples/common/environment.py): a missing variable or a service
that does not answer stops the command at once with exit code 2 and one line naming it, never an SDK traceback."""

from __future__ import annotations

import argparse
import contextlib
import http.server
from typing import Iterator

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from support.examples import error_line, run_example
from support.fake_openai import FakeOpenAIServer
from support.servers import free_port, serving_in_thread, taken_port

from examples.common.environment import (
    CONFIGURATION_ERROR,
    missing_variables,
    require_openai_service,
    require_variables,
    unreachable_reason,
)

# Every command with a hosted mode, and what its message offers instead of the hosted service.
HOSTED_COMMANDS = {
    "azure capital agent": (["examples.azure.capital_agent", "--model", "gpt-4.1-mini"], "Azure OpenAI resource"),
    "chartqa agent": (["examples.chartqa.agent", "--model", "gpt-4o-mini"], "vllm serve"),
    "apo room_selector_apo": (["examples.apo.room_selector_apo", "--hosted"], "drop --hosted"),
    "apo fewshot_names": (["examples.apo.fewshot_names", "--hosted"], "drop --hosted"),
    "apo apo_debug": (["examples.apo.apo_debug", "--hosted"], "drop --hosted"),
    "apo custom algorithm runner": (["examples.apo.apo_custom_algorithm", "runner", "--hosted"], "drop --hosted"),
    "apo custom algorithm trainer": (["examples.apo.apo_custom_algorithm_trainer", "--hosted"], "drop --hosted"),
}


@pytest.mark.parametrize("name", sorted(HOSTED_COMMANDS))
def test_a_hosted_command_without_openai_api_key_exits_2_naming_it_and_the_alternative(name: str) -> None:
    args, alternative = HOSTED_COMMANDS[name]
    result = run_example(args, {})
    assert result.returncode == CONFIGURATION_ERROR, result.stderr[-2000:]
    assert "needs OPENAI_API_KEY" in result.stderr and alternative in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["chartqa agent", "apo fewshot_names"])
def test_a_hosted_command_whose_service_refuses_connections_exits_2_naming_the_address(name: str) -> None:
    args, alternative = HOSTED_COMMANDS[name]
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    result = run_example(args, {"OPENAI_API_KEY": "unused", "OPENAI_BASE_URL": base_url})
    assert result.returncode == CONFIGURATION_ERROR, result.stderr[-2000:]
    assert f"cannot reach the OpenAI-compatible service at {base_url}/models" in result.stderr
    assert alternative in result.stderr and "Traceback" not in result.stderr


def test_missing_variables_are_the_unset_and_empty_ones_in_order() -> None:
    environ = {"A": "1", "B": "", "D": "x"}
    assert missing_variables(["C", "A", "B", "D"], environ) == ["C", "B"]


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="example")


def test_require_variables_exits_2_with_every_missing_name_and_the_hint(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        require_variables(parser(), ["X_KEY", "X_URL", "X_SET"], needed_by="the run", hint="see the README",
                          environ={"X_SET": "1"})  # fmt: skip
    assert stopped.value.code == CONFIGURATION_ERROR
    assert capsys.readouterr().err == "error: the run needs X_KEY, X_URL; see the README\n"


def test_require_variables_returns_when_all_are_set() -> None:
    require_variables(parser(), ["X_KEY"], needed_by="the run", environ={"X_KEY": "k"})


def test_a_refused_connection_is_reported_with_its_reason() -> None:
    reason = unreachable_reason(f"http://127.0.0.1:{free_port()}/", timeout=5)
    assert reason is not None and reason.startswith("ConnectError")


def test_a_service_that_never_answers_is_reported_after_the_timeout() -> None:
    with taken_port() as port:  # listening, never answering
        assert unreachable_reason(f"http://127.0.0.1:{port}/", timeout=0.5) == "no answer within 0.5 s"


@contextlib.contextmanager
def answering_server(status: int) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every GET with ``status``; yields its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with serving_in_thread(Handler) as url:
        yield f"{url}/v1"


def test_any_http_answer_counts_as_reachable() -> None:
    with answering_server(status=401) as url:
        assert unreachable_reason(f"{url}/models", timeout=5) is None


def test_the_openai_check_passes_with_a_key_and_an_answering_service() -> None:
    with answering_server(status=404) as url:
        require_openai_service(parser(), needed_by="--hosted", alternative="drop --hosted",
                               environ={"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": url})  # fmt: skip


def test_the_openai_check_names_the_default_address_when_openai_base_url_is_unset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        require_openai_service(parser(), needed_by="--hosted", alternative="drop --hosted", environ={})
    assert stopped.value.code == CONFIGURATION_ERROR
    message = capsys.readouterr().err
    assert "needs OPENAI_API_KEY" in message and "https://api.openai.com/v1" in message


def refusing_service(status: int, message: str) -> FastAPI:
    """A stand-in for a hosted OpenAI-compatible API that refuses every chat call with ``status`` and ``message``
    (a wrong key: 401; a model it does not serve: 404)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)

    return app


REFUSED_COMMANDS = {
    "chartqa agent": ["examples.chartqa.agent", "--model", "vlm", "--limit", "1"],
    "azure capital agent": ["examples.azure.capital_agent", "--model", "gpt-4.1-mini", "--limit", "1"],
    "minimal llm_proxy hosted": ["examples.minimal.llm_proxy", "hosted"],
}


@pytest.mark.parametrize("name", sorted(REFUSED_COMMANDS))
@pytest.mark.parametrize(
    ("status", "message", "names"),
    [(401, "Incorrect API key provided: wrong.", "OPENAI_API_KEY"), (404, "The model does not exist.", "--model")],
)
def test_a_hosted_command_whose_service_refuses_the_call_exits_2_with_its_reason(
    name: str, status: int, message: str, names: str
) -> None:
    with FakeOpenAIServer(app=refusing_service(status, message)) as server:
        env = {"OPENAI_API_KEY": "wrong", "OPENAI_BASE_URL": server.base_url}
        line = error_line(run_example(REFUSED_COMMANDS[name], env))
    assert f"refused the request (HTTP {status}" in line and message in line and names in line
