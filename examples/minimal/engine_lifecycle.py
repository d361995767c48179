"""An inference engine's lifecycle as a context manager: start, wait until it serves, use, stop.

``LocalModelServer`` runs ``agentbolt serve`` (the transformers engine) as a child process in its own process group:
entering the ``with`` block refuses a taken port, starts the server, and returns once ``/health`` answers and
``/v1/models`` lists the served name; leaving it sends SIGTERM to the whole group (SIGKILL after a grace period),
also when the block raised. ``VllmServer`` (GPU machines, ``agentbolt[vllm]``) has the same lifecycle.

Usage::

    python -m examples.minimal.engine_lifecycle                       # the embedded SmolLM2-135M
    python -m examples.minimal.engine_lifecycle --model /path/to/hf-model-dir --dtype float32
    python -m examples.minimal.engine_lifecycle --engine vllm --model Qwen/Qwen2.5-0.5B-Instruct   # needs a GPU
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import List, Optional

import httpx

from agentbolt.models import ModelNotAvailableError, resolve_model
from agentbolt.serving.process import LocalModelServer, ModelServerProcess, ServerProcessError
from examples.common.environment import CONFIGURATION_ERROR


@dataclass
class LifecycleReport:
    """What the run observed: the server's process id, one reply, and whether the process is gone after the block."""

    pid: int
    reply: str
    exit_code: Optional[int]
    process_gone: bool


def make_server(engine: str, model: str, dtype: str) -> ModelServerProcess:
    """``agentbolt serve`` (``engine="transformers"``) or vLLM's server for ``model``, served as ``engine-demo``."""
    if engine == "vllm":
        from agentbolt.serving.vllm import VllmServer

        return VllmServer(model, served_name="engine-demo", dtype=dtype)
    return LocalModelServer(model, served_name="engine-demo", dtype=dtype, max_batch_size=2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run(engine: str = "transformers", model: str = "smollm2-135m-instruct", dtype: str = "bfloat16") -> LifecycleReport:
    """Start the server in a ``with`` block, ask it one question, and check that leaving the block stopped it."""
    server = make_server(engine, model, dtype)
    with server:
        assert server.pid is not None
        pid = server.pid
        response = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": server.served_name, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8},
            timeout=120,
        )
        response.raise_for_status()
        reply = response.json()["choices"][0]["message"]["content"] or ""
    exit_code = server.stop()  # already stopped by the block: stop() is idempotent and returns the exit code
    return LifecycleReport(pid=pid, reply=reply, exit_code=exit_code, process_gone=not _alive(pid))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.minimal.engine_lifecycle", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="registry name, local directory or hub id")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    args = parser.parse_args(argv)
    if args.engine == "transformers":  # vLLM resolves its own models
        try:
            resolve_model(args.model)
        except ModelNotAvailableError as exc:
            parser.exit(CONFIGURATION_ERROR, f"error: --model: {exc}\n")
    try:
        report = run(args.engine, args.model, args.dtype)
    except ServerProcessError as exc:
        parser.exit(1, f"error: {exc}\n")
    print(f"served by pid {report.pid}: {report.reply!r}")
    print(f"after the block: exit code {report.exit_code}, process gone: {report.process_gone}")


if __name__ == "__main__":
    main()
