"""``agentbolt serve``: a real server subprocess on the tiny model, launcher commands, one-line errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.servers import taken_port

from agentbolt.cli.app import run
from agentbolt.serving.launchers import llamacpp_command, vllm_command
from agentbolt.serving.server import find_free_port


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job of a non-interactive shell


@pytest.mark.parametrize(
    ("signum", "sigint_ignored_at_start"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
)
def test_serve_subprocess_answers_and_stops_on_a_signal(
    tiny_model_dir: Path, signum: int, sigint_ignored_at_start: bool
) -> None:
    port = find_free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentbolt", "serve", str(tiny_model_dir), "--port", str(port), "--dtype", "float32"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if sigint_ignored_at_start else None,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "return_token_ids": True}
        data = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60).json()
        assert data["model"] == str(tiny_model_dir) and data["prompt_token_ids"] and data["choices"][0]["token_ids"]
    finally:
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0
    assert f"serving '{tiny_model_dir}' at http://127.0.0.1:{port}/v1" in stderr


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["serve", "./no-such-model"], "neither a registry name"),
        (["serve", "--dtype", "int4"], "unknown dtype 'int4'"),
        (["serve", "--device", "quantum"], "unknown device 'quantum'"),  # before anything loads or listens
        (["serve", "--engine", "llamacpp", "./no-such-model"], "llama.cpp needs a GGUF file"),
        (["serve", "--omp-wait", "busy"], "'busy' is not one of"),
        (["serve", "--log-level", "loud"], "--log-level: Unknown logging level 'LOUD'"),
        (["serve", "--engine", "vllm", "--dry-run", "--device", "cuda"], "--device applies to the transformers"),
        (["serve", "--engine", "llamacpp", "--dry-run", "--lora-dir", "."], "--lora-dir applies to the transformers"),
        (["serve", "--engine", "vllm", "--dry-run", "--quantization", "q8_0"], "--quantization applies to the"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_a_gguf_file_for_the_transformers_engine_is_refused_before_listening(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    port = find_free_port()
    assert run(["serve", str(gguf), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "not the GGUF file" in err and "--engine llamacpp" in err and err.count("\n") == 1


@pytest.mark.parametrize("engine", ["transformers", "llamacpp"])
def test_a_file_named_gguf_that_is_not_one_is_refused(
    tmp_path: Path, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>rate limited</html>")
    argv = ["serve", str(fake), "--engine", engine, "--port", str(find_free_port())]
    assert run(argv + (["--dry-run"] if engine == "llamacpp" else [])) == 2
    err = capsys.readouterr().err
    assert "is not a GGUF file" in err and err.count("\n") == 1


def test_port_in_use_is_reported(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with taken_port() as port:
        assert run(["serve", str(tiny_model_dir), "--port", str(port)]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err


# vLLM needs a CUDA GPU and llama.cpp is an optional extra that is not installed here: only the command lines
# they would be started with can be checked on these machines.
def test_vllm_command(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = vllm_command(
        "org/model", port=9000, dtype="bf16", max_batch_size=32, served_name="policy", max_model_len=4096
    )
    assert command.argv == [
        "vllm", "serve", "org/model", "--host", "127.0.0.1", "--port", "9000", "--dtype", "bfloat16",
        "--max-num-seqs", "32", "--enable-lora", "--max-lora-rank", "64", "--generation-config", "vllm",
        "--served-model-name", "policy", "--max-model-len", "4096",
    ]  # fmt: skip
    assert command.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert run(["serve", str(tiny_model_dir), "--engine", "vllm", "--dry-run", "--extra-arg", "--enforce-eager"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve {tiny_model_dir} ")
    assert line.endswith("--enforce-eager")


def test_llamacpp_command_uses_the_packaged_gguf(capsys: pytest.CaptureFixture[str]) -> None:
    command = llamacpp_command("/m/x.gguf", threads=2, served_name="s", max_model_len=2048)
    assert command.argv[1:] == [
        "-m", "llama_cpp.server", "--model", "/m/x.gguf", "--host", "127.0.0.1", "--port", "8000",
        "--n_threads", "2", "--model_alias", "s", "--n_ctx", "2048",
    ]  # fmt: skip
    assert run(["serve", "--engine", "llamacpp", "--dry-run", "--port", "8123"]) == 0
    line = capsys.readouterr().out.strip()
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in line and "--port 8123" in line
    assert os.path.isfile(line.split("--model ")[1].split(" ")[0])


@pytest.mark.parametrize(("engine", "flag"), [("vllm", "--api-key"), ("llamacpp", "--api_key")])
def test_launched_engines_get_the_api_key(
    tiny_model_dir: Path, engine: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = str(tiny_model_dir) if engine == "vllm" else "smollm2-135m-instruct"
    assert run(["serve", model, "--engine", engine, "--dry-run", "--api-key", "secret"]) == 0
    assert f"{flag} secret" in capsys.readouterr().out


def test_a_model_that_fails_to_load_stops_the_server_with_one_error(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")  # found and read only once the server has started
    assert run(["serve", str(broken), "--port", str(find_free_port())]) == 1
    err = capsys.readouterr().err
    assert "agentbolt: error: the model failed to load" in err
