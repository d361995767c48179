"""A vLLM server as a child process: started with the right options, awaited until it serves, stopped cleanly.

:class:`VllmServer` runs ``agentbolt vllm serve MODEL ...`` (vLLM's own CLI, instrumented so that responses carry
token ids, see :mod:`agentbolt.instrumentation.vllm`) with runtime LoRA loading enabled, so a trainer can publish
each new adapter with ``POST /v1/load_lora_adapter`` (GRPO's ``policy_server_url``) and the gateway records exact
token ids and logprobs. It is ready when ``GET /health`` answers 200 and ``GET /v1/models`` lists the served name;
it is stopped with SIGTERM to its process group (vLLM's engine processes included), then SIGKILL after a grace
period.

Typical use on a GPU machine (a fragment: it needs vLLM and a GPU)::

    with VllmServer("Qwen/Qwen2.5-0.5B-Instruct", served_name="policy") as server:
        algorithm = GRPO(model="Qwen/Qwen2.5-0.5B-Instruct", policy_server_url=server.base_url, ...)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Dict, List, Optional, Sequence

from agentbolt.serving.launchers import vllm_command
from agentbolt.serving.process import ModelServerProcess, ServerProcessError
from agentbolt.utils.checks import check_count, check_list_of_str, check_port, check_positive

__all__ = ["INSTRUMENTED_VLLM", "VllmServer", "VllmServerError"]

logger = logging.getLogger(__name__)

INSTRUMENTED_VLLM: List[str] = [sys.executable, "-m", "agentbolt", "vllm"]
"""The program that replaces ``vllm`` in the command line: vLLM's CLI run by ``agentbolt vllm``."""


class VllmServerError(ServerProcessError):
    """The vLLM server could not start, did not become ready in time, or exited."""


class VllmServer(ModelServerProcess):
    """vLLM's OpenAI-compatible server, run as a child process (lifecycle: :class:`ModelServerProcess`).

    Args:
        model: Model directory or hub id.
        host: Interface to bind.
        port: Port (None: a free one).
        dtype: Weights dtype (``bfloat16``, ``float16``, ``float32``, ``auto``).
        max_batch_size: ``--max-num-seqs``.
        served_name: Name clients request (default: ``model``).
        max_model_len: Context length (default: the model's).
        max_lora_rank: Largest LoRA rank the server accepts.
        api_key: Bearer token the server requires (``--api-key``); used by the readiness checks.
        extra_args: Further vLLM arguments (``--tensor-parallel-size 2``, ``--gpu-memory-utilization 0.8``...).
        program: Command that takes vLLM's arguments (default :data:`INSTRUMENTED_VLLM`; ``["vllm"]`` runs the
            plain CLI, without token ids by default).
        env: Variables added to the server's environment.
        log_path: File receiving the server's output (default: a temporary file, kept for inspection).
        startup_timeout: Seconds allowed for loading the model and becoming ready.
        stop_timeout: Seconds the server gets to exit after SIGTERM before SIGKILL.

    Raises:
        EngineError: An unknown dtype.
        TypeError: An argument of the wrong type (a port that is not an integer, ``extra_args`` or ``program``
            given as one string instead of a list of strings...); the message names it.
        ValueError: A port outside 0-65535, a count below 1, a timeout of 0 or less, an empty ``program``.
    """

    error_type = VllmServerError

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        dtype: str = "bfloat16",
        max_batch_size: int = 256,
        served_name: Optional[str] = None,
        max_model_len: Optional[int] = None,
        max_lora_rank: int = 64,
        api_key: Optional[str] = None,
        extra_args: Sequence[str] = (),
        program: Optional[Sequence[str]] = None,
        env: Optional[Dict[str, str]] = None,
        log_path: Optional[os.PathLike[str] | str] = None,
        startup_timeout: float = 900.0,
        stop_timeout: float = 30.0,
    ) -> None:
        from agentbolt.utils.server_launcher import pick_free_port

        check_port(port, "port")
        check_count(max_batch_size, "max_batch_size")
        check_count(max_lora_rank, "max_lora_rank")
        check_count(max_model_len, "max_model_len", optional=True)
        for name, value in (("startup_timeout", startup_timeout), ("stop_timeout", stop_timeout)):
            check_positive(value, name)
        extra_args = check_list_of_str(extra_args, "extra_args")
        if program is not None and not check_list_of_str(program, "program"):
            raise ValueError("program must not be empty: give the command that takes vLLM's arguments, e.g. ['vllm']")
        port = port if port is not None else pick_free_port(host)
        served_name = served_name or model
        command = vllm_command(
            model,
            host=host,
            port=port,
            dtype=dtype,
            max_batch_size=max_batch_size,
            served_name=served_name,
            max_model_len=max_model_len,
            max_lora_rank=max_lora_rank,
            api_key=api_key,
            extra_args=extra_args,
        )
        prefix = list(program) if program is not None else list(INSTRUMENTED_VLLM)
        command.argv = prefix + command.argv[1:]  # replaces the bare ``vllm``
        command.env.update(env or {})
        super().__init__(
            command,
            served_name=served_name,
            host=host,
            port=port,
            api_key=api_key,
            label="vLLM",
            log_path=log_path,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
        )

    def __enter__(self) -> VllmServer:
        self.start()
        return self
