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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional

import typer

from agentbolt.cli.errors import CliError, check_port_free
from agentbolt.cli.request_limits import body_timeout_option, max_request_bytes_option

if TYPE_CHECKING:
    from agentbolt.serving.server import ServingLimits

__all__ = ["HELP", "SERVE_API_KEY_ENV_VAR", "Engine", "OmpWait", "Quantization", "serve_command"]

logger = logging.getLogger(__name__)

HELP = "Serve a model with an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)."

SERVE_API_KEY_ENV_VAR = "AGENTBOLT_SERVE_API_KEY"
"""Bearer token ``agentbolt serve`` requires (``--api-key``)."""


class Engine(str, Enum):
    """Inference engines."""

    transformers = "transformers"
    llamacpp = "llamacpp"
    vllm = "vllm"


class Quantization(str, Enum):
    """Weights the transformers engine serves (see :mod:`agentbolt.serving.quantized`)."""

    auto = "auto"
    none = "none"
    q8_0 = "q8_0"
    q4_1 = "q4_1"


class OmpWait(str, Enum):
    """OpenMP wait policies (see :func:`agentbolt.serving.transformers_engine.configure_openmp`)."""

    spin = "spin"
    passive = "passive"


_TRANSFORMERS = frozenset({Engine.transformers})
_LAUNCHED = frozenset({Engine.vllm, Engine.llamacpp})
_ENGINE_OPTIONS: Dict[str, FrozenSet[Engine]] = {
    "dtype": frozenset({Engine.transformers, Engine.vllm}),
    "threads": frozenset({Engine.transformers, Engine.llamacpp}),
    "max_batch_size": frozenset({Engine.transformers, Engine.vllm}),
    "omp_wait": _TRANSFORMERS,
    "fast_forward": _TRANSFORMERS,
    "prefix_cache_mb": _TRANSFORMERS,
    "device": _TRANSFORMERS,
    "lora_dirs": _TRANSFORMERS,
    "quantization": _TRANSFORMERS,
    "int8_activations": _TRANSFORMERS,
    "max_prompts_per_request": _TRANSFORMERS,
    "max_sequences_per_request": _TRANSFORMERS,
    "max_queued_tokens": _TRANSFORMERS,
    "max_request_bytes": _TRANSFORMERS,
    "body_timeout": _TRANSFORMERS,
    "dry_run": _LAUNCHED,
    "extra": _LAUNCHED,
}
"""The options (by parameter name) that only some engines honour, and those engines; every other option applies to
all three. vLLM and llama-cpp-python's server have no equivalent of the transformers engine's work limits (request
body size and deadline, prompts, sequences and queued tokens per request), so those are not passed on."""


def _progress(message: str) -> None:
    print(f"agentbolt serve: {message}", file=sys.stderr, flush=True)


def _refuse_options_of_other_engines(ctx: typer.Context, engine: Engine) -> None:
    """Refuse the options given on the command line that ``engine`` does not honour, rather than ignore them.

    Raises:
        CliError: Naming each such option, the engines it applies to, and ``engine``.
    """
    by_engines: Dict[FrozenSet[Engine], List[str]] = {}
    for param in ctx.command.params:
        engines = _ENGINE_OPTIONS.get(param.name or "")
        source = ctx.get_parameter_source(param.name or "")
        if engines is None or engine in engines or source is None or source.name in {"DEFAULT", "DEFAULT_MAP"}:
            continue
        by_engines.setdefault(engines, []).append("/".join([*param.opts, *param.secondary_opts]))
    if not by_engines:
        return
    reasons = []
    for engines, flags in by_engines.items():
        names = [e.value for e in Engine if e in engines]
        verb = "applies" if len(flags) == 1 else "apply"
        reasons.append(
            f"{' and '.join(flags)} {verb} to the {' and '.join(names)} engine{'s' if len(names) > 1 else ''} only"
        )
    raise CliError(f"{'; '.join(reasons)}, not --engine {engine.value}")


def serve_command(
    ctx: typer.Context,
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
    api_key: Optional[str] = typer.Option(
        None,
        envvar=SERVE_API_KEY_ENV_VAR,
        show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every route but /health (vllm and llamacpp get it too).",
    ),
    lora_dirs: Optional[List[Path]] = typer.Option(
        None,
        "--lora-dir",
        help="transformers engine: directory POST /v1/load_lora_adapter may load adapters from (repeatable; "
        "without one, loading adapters over HTTP is refused).",
    ),
    max_prompts_per_request: int = typer.Option(64, min=1, help="Prompts in one /v1/completions request."),
    max_sequences_per_request: int = typer.Option(256, min=1, help="Sequences one request may start (prompts x n)."),
    max_queued_tokens: int = typer.Option(
        1_048_576, min=1, help="Tokens of work (prompt + n x max_tokens) queued and running at once; 429 beyond."
    ),
    max_request_bytes: int = max_request_bytes_option(),
    body_timeout: float = body_timeout_option(),
    quantization: Quantization = typer.Option(
        Quantization.auto,
        case_sensitive=False,
        help="transformers engine on CPU: auto serves a model's own GGUF blocks (the embedded model's Q4_1 file: the "
        "same numbers as its float32 weights, ~3x fewer bytes per token) and float weights otherwise; q8_0 / q4_1 "
        "quantize every projection (lossy); none serves float weights in --dtype. Adapters (--lora-dir) need none.",
    ),
    int8_activations: bool = typer.Option(
        False,
        "--int8-activations",
        help="With block weights (--quantization auto on a GGUF-converted model, q8_0, q4_1): quantize each "
        "product's inputs to int8 per block of 32 and multiply in integers, as llama.cpp does. Faster on one stream; "
        "logits no longer equal the float32 model's (docs/serving.md).",
    ),
) -> int:
    """Serve MODEL until SIGINT or SIGTERM."""
    from agentbolt.logging import setup as setup_logging
    from agentbolt.models import ModelNotAvailableError, resolve_gguf, resolve_model
    from agentbolt.serving.params import EngineError

    try:
        setup_logging(log_level.upper())
    except ValueError as exc:
        raise CliError(f"--log-level: {exc}") from None
    _refuse_options_of_other_engines(ctx, engine)  # before any engine is imported or launched
    if engine is Engine.transformers:
        from agentbolt.serving.transformers_engine import configure_openmp

        configure_openmp(omp_wait.value)  # before anything imports torch
    name = served_name or model
    try:
        if engine is Engine.transformers:
            from agentbolt.serving.server import ServingLimits

            limits = ServingLimits(
                max_prompts_per_request, max_sequences_per_request, max_request_bytes, body_timeout=body_timeout
            )
            for directory in lora_dirs or []:
                if not directory.is_dir():
                    raise CliError(f"--lora-dir {directory} is not a directory")
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
                api_key=api_key or None,
                lora_dirs=list(lora_dirs or []),
                limits=limits,
                max_queued_tokens=max_queued_tokens,
                quantization=_quantization_for(quantization.value, bool(lora_dirs)),
                int8_activations=int8_activations,
            )
        from agentbolt.serving import launchers

        # What either launched server is told the same way; each engine adds its own options.
        server: Dict[str, Any] = {
            "host": host,
            "port": port,
            "served_name": name,
            "max_model_len": max_model_len,
            "api_key": api_key or None,
            "extra_args": extra or (),
        }
        if engine is Engine.vllm:
            path = resolve_model(model, progress=_progress).path if _is_local_or_registry(model) else model
            command = launchers.vllm_command(str(path), dtype=dtype, max_batch_size=max_batch_size, **server)
        else:
            command = launchers.llamacpp_command(str(resolve_gguf(model)), threads=threads, **server)
        if dry_run:
            print(command.shell(redact=False))  # asked for: the line as it runs
            return 0
        launchers.check_available(engine.value)
        _progress(f"exec {command.shell()}")
        launchers.exec_command(command)
    except (ModelNotAvailableError, EngineError) as exc:
        raise CliError(str(exc)) from None


def _quantization_for(requested: str, adapters: bool) -> str:
    """``auto`` serves float weights when adapters may be loaded (they need them); explicit choices are kept."""
    if requested == "auto" and adapters:
        return "none"
    if requested in {"q8_0", "q4_1"} and adapters:
        raise CliError(f"--quantization {requested} cannot serve LoRA adapters (--lora-dir): use --quantization none")
    return requested


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
    *,
    api_key: Optional[str],
    lora_dirs: List[Path],
    limits: ServingLimits,
    max_queued_tokens: int,
    quantization: str,
    int8_activations: bool = False,
) -> int:
    from agentbolt.models import resolve_model
    from agentbolt.serving.server import InferenceServer
    from agentbolt.serving.transformers_engine import TransformersEngine, check_device, resolve_dtype
    from agentbolt.utils.server_launcher import LOOPBACK_HOSTS

    resolve_dtype(dtype)
    if device is not None:
        check_device(device)
    check_port_free(host, port)
    resolved = resolve_model(model, progress=_progress)
    if resolved.source == "gguf":
        raise CliError(
            f"the transformers engine serves model directories, not the GGUF file {model!r}: add --engine llamacpp"
        )
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
        max_queued_tokens=max_queued_tokens,
        quantization=quantization,
        int8_activations=int8_activations,
    )
    server = InferenceServer(
        engine, host=host, port=port, log_level="warning", api_key=api_key, adapter_dirs=lora_dirs, limits=limits
    )
    if host not in LOOPBACK_HOSTS and api_key is None:
        _progress(f"warning: listening on {host} without --api-key: anyone who can reach it may use it")
    _progress(f"loading {resolved.path} ({dtype}); /health answers 503 until it is ready")
    _progress(f"serving {name!r} at http://{host}:{port}/v1 (OpenAI-compatible)")
    try:
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled, after shutting down
            server.run(stop_on_load_error=True)
    except RuntimeError as exc:
        raise CliError(str(exc), exit_code=1) from None
    _progress("stopped")
    return 0
