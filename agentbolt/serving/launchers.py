"""Command lines that start external OpenAI-compatible servers: vLLM (GPU) and llama.cpp (CPU, GGUF).

Both engines are separate programs; agentbolt builds their command line from the same options as the
transformers engine and replaces the current process with them (signals then reach the server directly).

- ``vllm``: ``vllm serve MODEL`` with runtime LoRA loading enabled (``/v1/load_lora_adapter``) and
  ``--max-num-seqs`` as the batch size. vLLM itself returns ``prompt_token_ids`` / ``token_ids`` when a request
  sets ``return_token_ids`` (vLLM >= 0.10.2).
- ``llamacpp``: ``python -m llama_cpp.server`` (the ``llama-cpp-python`` package, extra ``agentbolt[llamacpp]``)
  on the model's GGUF file; registry models use the GGUF shipped in their PyPI package directly. This server does
  not return token ids and does not batch concurrent requests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Dict, List, NoReturn, Optional, Sequence

from agentbolt.serving.params import EngineError

__all__ = ["LaunchCommand", "check_available", "exec_command", "llamacpp_command", "vllm_command"]

_SECRET_OPTIONS = frozenset({"--api-key", "--api_key"})
"""Options whose value :meth:`LaunchCommand.shell` hides."""
_VLLM_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}
_VLLM_DTYPES.update({"half": "float16", "float32": "float32", "fp32": "float32", "float": "float32", "auto": "auto"})


@dataclass
class LaunchCommand:
    """A program to run.

    Attributes:
        argv: Program and arguments.
        env: Variables added to the current environment.
    """

    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)

    def shell(self, *, redact: bool = True) -> str:
        """The command as one shell-quoted line, for display.

        Args:
            redact: Show the value of an API-key option (``--api-key``, ``--api_key``) as ``***``, so that a log or
                a progress line does not carry the token. False gives the line as it runs.
        """
        import shlex

        argv = list(self.argv)
        if redact:
            for index, arg in enumerate(argv[:-1]):
                if arg in _SECRET_OPTIONS:
                    argv[index + 1] = "***"
        prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items()))
        line = " ".join(shlex.quote(arg) for arg in argv)
        return f"{prefix} {line}" if prefix else line


def vllm_command(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "bfloat16",
    max_batch_size: int = 256,
    served_name: Optional[str] = None,
    max_model_len: Optional[int] = None,
    max_lora_rank: int = 64,
    api_key: Optional[str] = None,
    extra_args: Sequence[str] = (),
) -> LaunchCommand:
    """Build ``vllm serve`` for ``model`` (a local directory or hub id); with ``api_key`` it requires that token.

    Raises:
        EngineError: Unknown dtype.
    """
    vllm_dtype = _VLLM_DTYPES.get(dtype.lower())
    if vllm_dtype is None:
        raise EngineError(f"unknown dtype {dtype!r} for vLLM; use bfloat16, float16, float32 or auto")
    argv = ["vllm", "serve", model, "--host", host, "--port", str(port), "--dtype", vllm_dtype]
    argv += ["--max-num-seqs", str(max_batch_size), "--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    # vLLM otherwise applies the model's generation_config.json (top_k, top_p, repetition penalty) to every request
    # that does not set them: samples would come from another distribution than the one the trainer scores.
    argv += ["--generation-config", "vllm"]
    if served_name:
        argv += ["--served-model-name", served_name]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if api_key:
        argv += ["--api-key", api_key]
    argv += list(extra_args)
    return LaunchCommand(argv=argv, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})


def llamacpp_command(
    gguf_file: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    threads: Optional[int] = None,
    served_name: Optional[str] = None,
    max_model_len: Optional[int] = None,
    chat_format: Optional[str] = None,
    api_key: Optional[str] = None,
    extra_args: Sequence[str] = (),
) -> LaunchCommand:
    """Build ``python -m llama_cpp.server`` for a GGUF file; with ``api_key`` it requires that token."""
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", gguf_file, "--host", host, "--port", str(port)]
    if threads:
        argv += ["--n_threads", str(threads)]
    if served_name:
        argv += ["--model_alias", served_name]
    argv += ["--n_ctx", str(max_model_len or 4096)]
    if chat_format:
        argv += ["--chat_format", chat_format]
    if api_key:
        argv += ["--api_key", api_key]
    argv += list(extra_args)
    return LaunchCommand(argv=argv)


def check_available(engine: str) -> None:
    """Raise if the program behind ``engine`` (``vllm`` or ``llamacpp``) is not installed.

    Raises:
        EngineError: With the pip command that installs it.
    """
    if engine == "vllm" and shutil.which("vllm") is None:
        raise EngineError("vLLM is not installed: pip install 'agentbolt[vllm]' (needs a CUDA GPU)")
    if engine == "llamacpp" and importlib.util.find_spec("llama_cpp") is None:
        raise EngineError("llama.cpp is not installed: pip install 'agentbolt[llamacpp]'")


def exec_command(command: LaunchCommand) -> NoReturn:
    """Replace the current process with ``command``."""
    env = {**os.environ, **command.env}
    os.execvpe(command.argv[0], command.argv, env)
