"""vLLM without a GPU: the ``agentbolt vllm`` command, its instrumentation, and the :class:`VllmServer` launcher.

vLLM needs CUDA, so a stand-in ``vllm`` package (``tests/support/vllm_stand_in``) takes its place: it lives at
vLLM's module paths, parses ``serve`` like vLLM, and speaks the routes agentbolt uses. The launcher starts it
through the real ``agentbolt vllm serve`` command, so argument building, instrumentation, readiness, LoRA
hot-loading by GRPO's publisher, token ids through the gateway, and teardown are all exercised for real.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import httpx
import psutil
import pytest
from support.servers import REPO, taken_port
from support.vllm import STAND_IN_PATH, stand_in_env, stand_in_server

from agentbolt.serving.vllm import INSTRUMENTED_VLLM, VllmServer, VllmServerError


def _chat(server: VllmServer, **extra: Any) -> Dict[str, Any]:
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra}
    answer = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=30)
    answer.raise_for_status()
    return answer.json()


def _log_lines(server: VllmServer, prefix: str) -> List[str]:
    assert server.log_path is not None
    return [line[len(prefix) :] for line in server.log_path.read_text().splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def server() -> Iterator[VllmServer]:
    with stand_in_server(extra_args=["--tensor-parallel-size", "1"]) as running:
        yield running


# ---------------------------------------------------------------------------------------------------------------
# the command line


def test_the_launcher_builds_vllms_command_line_run_by_agentbolt_vllm() -> None:
    launcher = VllmServer(
        "Qwen/Qwen2.5-0.5B-Instruct", port=8123, served_name="policy", api_key="k", max_model_len=4096
    )
    argv = launcher.command.argv
    assert argv[: len(INSTRUMENTED_VLLM)] == INSTRUMENTED_VLLM
    assert argv[len(INSTRUMENTED_VLLM) :] == [
        "serve", "Qwen/Qwen2.5-0.5B-Instruct", "--host", "127.0.0.1", "--port", "8123", "--dtype", "bfloat16",
        "--max-num-seqs", "256", "--enable-lora", "--max-lora-rank", "64", "--generation-config", "vllm",
        "--served-model-name", "policy", "--max-model-len", "4096", "--api-key", "k",
    ]  # fmt: skip
    assert launcher.command.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert launcher.base_url == "http://127.0.0.1:8123/v1"
    assert launcher.model_config() == {
        "model_name": "policy",
        "litellm_params": {"model": "hosted_vllm/policy", "api_base": "http://127.0.0.1:8123/v1", "api_key": "k"},
    }
    plain = VllmServer("m", port=1, program=["vllm"], host="0.0.0.0")
    assert plain.command.argv[:3] == ["vllm", "serve", "m"] and plain.root_url == "http://127.0.0.1:1"


def test_agentbolt_vllm_without_vllm_installed_is_a_one_line_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentbolt", "vllm", "serve", "some/model"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "agentbolt: error: vLLM is not installed: pip install 'agentbolt[vllm]' (needs a CUDA GPU)"
    )


def test_agentbolt_vllm_passes_every_argument_and_exit_code_to_vllms_cli() -> None:
    env = {**os.environ, **stand_in_env()}
    result = subprocess.run(
        [sys.executable, "-m", "agentbolt", "vllm", "serve", "m", "--no-such-option"],
        capture_output=True, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2 and "unrecognized arguments: --no-such-option" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# the instrumentation, in this process, over the stand-in's handler classes


@pytest.fixture
def stand_in_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from agentbolt.instrumentation.vllm import uninstrument_vllm

    monkeypatch.syspath_prepend(str(STAND_IN_PATH))
    yield
    uninstrument_vllm()
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def test_instrumentation_defaults_return_token_ids_and_respects_an_explicit_choice(
    stand_in_vllm: None, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat  # type: ignore[import-not-found]
    from vllm.entrypoints.openai.completion.serving import (  # type: ignore[import-not-found]
        OpenAIServingCompletion,
        Request,
    )

    from agentbolt.instrumentation.vllm import instrument_vllm, is_vllm_instrumented, uninstrument_vllm

    original = OpenAIServingChat.create_chat_completion
    instrument_vllm()
    assert is_vllm_instrumented() and OpenAIServingChat.create_chat_completion is not original
    chat = OpenAIServingChat(["m"])
    unset = asyncio.run(
        chat.create_chat_completion(Request({"model": "m", "messages": [{"role": "user", "content": "a"}]}))
    )
    assert unset["prompt_token_ids"] and unset["choices"][0]["token_ids"] == [ord(c) for c in "echo: a"]
    refused = asyncio.run(
        chat.create_chat_completion(Request({"model": "m", "messages": [], "return_token_ids": False}))
    )
    assert "prompt_token_ids" not in refused
    completion = asyncio.run(OpenAIServingCompletion(["m"]).create_completion(Request({"prompt": "x"})))
    assert completion["choices"][0]["prompt_token_ids"] == [ord("x")]

    instrument_vllm()
    assert "already instrumented" in caplog.text
    uninstrument_vllm()
    assert OpenAIServingChat.create_chat_completion is original and not is_vllm_instrumented()


# ---------------------------------------------------------------------------------------------------------------
# the launcher against the stand-in


def test_the_server_is_ready_with_the_arguments_and_environment_it_was_given(server: VllmServer) -> None:
    assert server.is_running()
    (argv,) = _log_lines(server, "argv ")
    assert json.loads(argv) == server.command.argv[len(INSTRUMENTED_VLLM) :]
    assert _log_lines(server, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=") == ["True"]
    models = httpx.get(f"{server.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["policy"]


def test_responses_carry_token_ids_and_logprobs_by_default(server: VllmServer) -> None:
    answer = _chat(server, logprobs=True)
    choice = answer["choices"][0]
    assert choice["token_ids"] == [ord(c) for c in "echo: hi"]
    assert answer["prompt_token_ids"] == [ord(c) for c in "<user>hi<assistant>"]
    assert [entry["logprob"] for entry in choice["logprobs"]["content"]] == [-0.5] * len("echo: hi")
    assert "prompt_token_ids" not in _chat(server, return_token_ids=False)


def test_the_gateway_records_the_servers_token_ids(server: VllmServer, tmp_path: Path) -> None:
    import agentbolt as agl
    from agentbolt.semconv import AGL_LLM_CALL
    from agentbolt.store.memory import InMemoryLightningStore

    async def run() -> None:
        store = InMemoryLightningStore()
        proxy = agl.LLMProxy(model_list=[server.model_config()], store=store, launch_mode="asyncio")
        await proxy.start()
        try:
            attempted = await store.start_rollout(input={"q": 1})
            url = f"{proxy.endpoint}/rollout/{attempted.rollout_id}/attempt/{attempted.attempt.attempt_id}/v1"
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": "policy", "messages": [{"role": "user", "content": "hey"}], "max_tokens": 16}
                (await client.post(f"{url}/chat/completions", json=body)).raise_for_status()
            assert await proxy.flush()
        finally:
            await proxy.stop()
        (triplet,) = agl.LlmProxyTraceToTriplet().adapt(list(await store.query_spans(attempted.rollout_id)))
        assert triplet.prompt["token_ids"] == [ord(c) for c in "<user>hey<assistant>"]
        assert triplet.response["token_ids"] == [ord(c) for c in "echo: hey"]
        assert triplet.response["logprobs"] == [-0.5] * len("echo: hey")
        spans = await store.query_spans(attempted.rollout_id)
        assert [s.name for s in spans] == [AGL_LLM_CALL]

    asyncio.run(run())


def test_grpo_publishes_each_update_as_a_lora_adapter_on_the_server(server: VllmServer, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from agentbolt.algorithm.grpo.config import GRPOConfig
    from agentbolt.algorithm.grpo.serving import RemoteAdapterPolicyServer
    from agentbolt.algorithm.grpo.trainer import PolicyTrainer
    from agentbolt.models.tiny import create_tiny_model

    model = AutoModelForCausalLM.from_pretrained(create_tiny_model(tmp_path / "tiny"), dtype=torch.float32)
    trainer = PolicyTrainer(model, GRPOConfig(learning_rate=0.05, max_grad_norm=None))
    remote = RemoteAdapterPolicyServer(trainer, base_url=server.base_url, adapter_dir=tmp_path / "adapters")
    try:
        first = remote.model_name
        assert first in [m["id"] for m in httpx.get(f"{server.base_url}/models").json()["data"]]
        assert _chat(server, model=first)["choices"][0]["token_ids"]
        remote.after_update(trainer)
        served = [m["id"] for m in httpx.get(f"{server.base_url}/models").json()["data"]]
        assert remote.model_name in served and first not in served  # the previous adapter was unloaded
    finally:
        remote.stop()
    assert [m["id"] for m in httpx.get(f"{server.base_url}/models").json()["data"]] == ["policy"]


def test_stop_ends_the_server_and_its_engine_processes() -> None:
    launcher = stand_in_server()
    launcher.start()
    (engine,) = (int(pid) for pid in _log_lines(launcher, "engine pid "))
    assert psutil.pid_exists(engine)
    code = launcher.stop()
    assert code in (0, -signal.SIGTERM)  # ended by SIGTERM, not killed
    assert not launcher.is_running() and not _alive(engine)
    assert launcher.stop() == code  # again: nothing left to do


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    launcher = stand_in_server(env={"STAND_IN_VLLM_IGNORE_SIGTERM": "1"}, stop_timeout=1.0)
    launcher.start()
    (engine,) = (int(pid) for pid in _log_lines(launcher, "engine pid "))
    started = time.monotonic()
    assert launcher.stop() == -9
    assert time.monotonic() - started >= 1.0 and not _alive(engine)


def test_a_server_that_exits_while_starting_fails_with_its_output() -> None:
    launcher = stand_in_server(env={"STAND_IN_VLLM_FAIL": "CUDA out of memory (stand-in)"})
    with pytest.raises(VllmServerError, match=r"exited with code 1 before it was ready(.|\n)*CUDA out of memory"):
        launcher.start()


def test_a_server_not_ready_in_time_is_stopped_and_reported() -> None:
    launcher = stand_in_server(env={"STAND_IN_VLLM_LOAD_SECONDS": "30"}, startup_timeout=2.0)
    with pytest.raises(VllmServerError, match=r"did not serve 'policy'.* within 2 seconds") as failure:
        launcher.start()
    assert not launcher.is_running()
    assert str(launcher.log_path) in str(failure.value)
    (engine,) = (int(pid) for pid in _log_lines(launcher, "engine pid "))
    assert not _alive(engine)  # the engine process the server had started is not orphaned


ENGINE_STARTED_WITHIN = 10.0
"""Seconds the stand-in is given to start its engine process before its start-up times out."""


def test_stop_waits_for_engine_processes_that_end_after_the_server() -> None:
    # Killed while loading, the server ends at once; its engine takes a second more, within the grace period. The
    # start-up timeout leaves the stand-in time to start its engine (its imports take seconds on a busy machine).
    launcher = stand_in_server(
        env={"STAND_IN_VLLM_LOAD_SECONDS": "60", "STAND_IN_VLLM_ENGINE_EXIT_SECONDS": "1"},
        startup_timeout=ENGINE_STARTED_WITHIN,
    )
    started = time.monotonic()
    with pytest.raises(VllmServerError):
        launcher.start()
    (engine,) = (int(pid) for pid in _log_lines(launcher, "engine pid "))
    assert not _alive(engine)
    assert time.monotonic() - started >= ENGINE_STARTED_WITHIN + 1.0  # the start-up timeout, then the engine's second


def test_engine_processes_ignoring_sigterm_are_killed_after_the_grace_period(caplog: pytest.LogCaptureFixture) -> None:
    launcher = stand_in_server(
        env={"STAND_IN_VLLM_LOAD_SECONDS": "60", "STAND_IN_VLLM_ENGINE_EXIT_SECONDS": "-1"},
        startup_timeout=ENGINE_STARTED_WITHIN,
        stop_timeout=1.0,
    )
    with caplog.at_level(logging.WARNING, logger="agentbolt.serving.process"), pytest.raises(VllmServerError):
        launcher.start()
    (engine,) = (int(pid) for pid in _log_lines(launcher, "engine pid "))
    assert not _alive(engine)
    assert any("outlived it" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"port": 70000}, ValueError, "port must be at most 65535"),
        ({"port": "8000"}, TypeError, "port must be an integer"),
        ({"extra_args": "--tensor-parallel-size 2"}, TypeError, "extra_args must be a list of strings"),
        ({"extra_args": ["--tensor-parallel-size", 2]}, TypeError, "extra_args must be a list of strings"),
        ({"program": "vllm"}, TypeError, "program must be a list of strings"),
        ({"program": []}, ValueError, "program must not be empty"),
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be at least 1"),
        ({"max_lora_rank": "64"}, TypeError, "max_lora_rank must be an integer"),
        ({"max_model_len": -1}, ValueError, "max_model_len must be at least 1"),
        ({"startup_timeout": 0}, ValueError, "startup_timeout must be greater than 0"),
        ({"stop_timeout": float("nan")}, ValueError, "stop_timeout must be a finite number"),
    ],
)
def test_bad_launcher_arguments_are_refused_naming_them(kwargs: Dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        VllmServer("stand-in/model", **kwargs)


def test_a_taken_port_is_refused() -> None:
    with taken_port() as port, pytest.raises(VllmServerError, match=f"cannot listen on 127.0.0.1:{port}"):
        stand_in_server(port=port).start()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_api_key_stays_out_of_the_log(caplog: pytest.LogCaptureFixture) -> None:
    launcher = stand_in_server(api_key="sk-not-for-logs")
    with caplog.at_level(logging.INFO, logger="agentbolt.serving.process"):
        launcher.start()
        try:
            assert httpx.get(f"{launcher.base_url}/models", timeout=10).status_code == 401  # the key is required
        finally:
            launcher.stop()
    (started,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Starting")]
    assert "--api-key '***'" in started and "sk-not-for-logs" not in caplog.text


def test_a_program_that_does_not_exist_is_one_error_naming_it() -> None:
    launcher = stand_in_server(program=["/nonexistent/vllm"])
    with pytest.raises(VllmServerError, match=r"cannot run .*\(/nonexistent/vllm\): No such file"):
        launcher.start()
    assert launcher._log is None  # the log file is closed again


def test_a_server_that_exits_silently_names_its_empty_log() -> None:
    launcher = stand_in_server(program=[sys.executable, "-c", "pass"])
    with pytest.raises(VllmServerError, match=r"exited with code 0 before it was ready") as failure:
        launcher.start()
    assert f"{launcher.log_path} is empty" in str(failure.value)
