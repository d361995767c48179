"""``agentbolt serve MODEL``: an OpenAI-compatible inference server.

MODEL is a registry name (default: the embedded SmolLM2-135M-Instruct, converted on first use), a local model
directory or a hub id. The ``transformers`` engine runs in this process; ``vllm`` and ``llamacpp`` start those
servers with the equivalent options (``--dry-run`` prints their command instead).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from enum import Enum
from typing import List, Optional

import typer

from agentbolt.cli.errors import CliError

__all__ = ["HELP", "Engine", "OmpWait", "serve_command"]

logger = logging.getLogger(__name__)

HELP = "Serve a model with an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)."


class Engine(str, Enum):
    """Inference engines."""

    transformers = "transformers"
    llamacpp = "llamacpp"
    vllm = "vllm"


class OmpWait(str, Enum):
    """OpenMP wait policies (see :func:`agentbolt.serving.transformers_engine.configure_openmp`)."""

    spin = "spin"
    passive = "passive"


def _progress(message: str) -> None:
    print(f"agentbolt serve: {message}", file=sys.stderr, flush=True)


def serve_command(
    model: str = typer.Argument("smollm2-135m-instruct", help="Registry name, model directory or hub id."),
    engine: Engine = typer.Option(Engine.transformers, case_sensitive=False, help="Inference engine."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; use 0.0.0.0 to accept remote clients."),
    port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
    dtype: str = typer.Option("bfloat16", help="Compute dtype: bfloat16, float32 or float16."),
    threads: Optional[int] = typer.Option(None, min=1, help="CPU threads (default: torch's choice)."),
    max_batch_size: int = typer.Option(8, min=1, help="Sequences decoded together."),
    omp_wait: OmpWait = typer.Option(
        OmpWait.spin,
        case_sensitive=False,
        help="transformers engine on CPU: how idle OpenMP threads wait. spin (fastest when the server has the "
        "cores to itself) or passive (when other busy processes share them).",
    ),
    fast_forward: bool = typer.Option(
        True,
        help="transformers engine: the lean CPU forward for Llama-architecture models (--no-fast-forward runs the "
        "transformers forward).",
    ),
    prefix_cache_mb: int = typer.Option(
        256,
        min=0,
        help="transformers engine: memory for the key/value states of prompt prefixes that later prompts reuse "
        "(0 disables).",
    ),
    max_model_len: Optional[int] = typer.Option(None, min=16, help="Context length (default: the model's)."),
    served_name: Optional[str] = typer.Option(None, help="Model name reported to clients (default: MODEL)."),
    device: Optional[str] = typer.Option(None, help="transformers engine device: cpu, cuda, cuda:1 (default: auto)."),
    dry_run: bool = typer.Option(False, help="vllm/llamacpp: print the server command instead of running it."),
    log_level: str = typer.Option("INFO", help="Logging level."),
    extra: Optional[List[str]] = typer.Option(None, "--extra-arg", help="vllm/llamacpp: extra argument (repeatable)."),
) -> int:
    """Serve MODEL until SIGINT or SIGTERM."""
    from agentbolt.logging import setup as setup_logging
    from agentbolt.models import ModelNotAvailableError, resolve_gguf, resolve_model
    from agentbolt.serving.params import EngineError

    setup_logging(log_level.upper())
    if engine is Engine.transformers:
        from agentbolt.serving.transformers_engine import configure_openmp

        configure_openmp(omp_wait.value)  # before anything imports torch
    name = served_name or model
    try:
        if engine is Engine.transformers:
            return _serve_transformers(
                model,
                name,
                host,
                port,
                dtype,
                threads,
                max_batch_size,
                max_model_len,
                device,
                fast_forward,
                prefix_cache_mb,
            )
        from agentbolt.serving import launchers

        if engine is Engine.vllm:
            path = resolve_model(model, progress=_progress).path if _is_local_or_registry(model) else model
            command = launchers.vllm_command(
                str(path),
                host=host,
                port=port,
                dtype=dtype,
                max_batch_size=max_batch_size,
                served_name=name,
                max_model_len=max_model_len,
                extra_args=extra or (),
            )
        else:
            command = launchers.llamacpp_command(
                str(resolve_gguf(model)),
                host=host,
                port=port,
                threads=threads,
                served_name=name,
                max_model_len=max_model_len,
                extra_args=extra or (),
            )
        if dry_run:
            print(command.shell())
            return 0
        launchers.check_available(engine.value)
        _progress(f"exec {command.shell()}")
        launchers.exec_command(command)
    except (ModelNotAvailableError, EngineError) as exc:
        raise CliError(str(exc)) from None


def _is_local_or_registry(model: str) -> bool:
    from pathlib import Path

    from agentbolt.models import REGISTRY

    return model in REGISTRY or Path(model).expanduser().exists()


def _serve_transformers(
    model: str,
    name: str,
    host: str,
    port: int,
    dtype: str,
    threads: Optional[int],
    max_batch_size: int,
    max_model_len: Optional[int],
    device: Optional[str],
    fast_forward: bool,
    prefix_cache_mb: int,
) -> int:
    from agentbolt.models import resolve_model
    from agentbolt.serving.server import InferenceServer
    from agentbolt.serving.transformers_engine import TransformersEngine, resolve_dtype

    resolve_dtype(dtype)
    _check_port_free(host, port)
    resolved = resolve_model(model, progress=_progress)
    engine = TransformersEngine(
        resolved.path,
        dtype=dtype,
        device=device,
        threads=threads,
        max_batch_size=max_batch_size,
        max_model_len=max_model_len,
        served_name=name,
        fast_forward=fast_forward,
        prefix_cache_mb=prefix_cache_mb,
    )
    server = InferenceServer(engine, host=host, port=port, log_level="warning")
    _progress(f"loading {resolved.path} ({dtype}); /health answers 503 until it is ready")
    _progress(f"serving {name!r} at http://{host}:{port}/v1 (OpenAI-compatible)")
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled, after shutting down
        server.run()
    _progress("stopped")
    return 0


def _check_port_free(host: str, port: int) -> None:
    from agentbolt.utils.server_launcher import bind_socket

    try:
        bind_socket(host, port).close()
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
