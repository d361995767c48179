"""Stand-in of ``vllm``'s command line: ``serve MODEL`` with the options agentbolt passes, over HTTP routes."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response

from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion, Request


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto")
    serve.add_argument("--max-num-seqs", type=int, default=256)
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument("--generation-config", default="auto")
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--api-key")
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    return parser


def _truthy(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true")


def _app(args: argparse.Namespace) -> FastAPI:
    served: List[str] = list(args.served_model_name or [args.model])
    adapters: Dict[str, str] = {}
    chat = OpenAIServingChat(served)
    completion = OpenAIServingCompletion(served)
    app = FastAPI()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)

    @app.middleware("http")
    async def authorize(request: HttpRequest, call_next: Any) -> Any:
        unauthorized = request.headers.get("authorization") != f"Bearer {args.api_key}"
        if args.api_key and request.url.path.startswith("/v1") and unauthorized:
            return error(401, "Unauthorized")
        return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        names = served + list(adapters)
        return {"object": "list", "data": [{"id": name, "object": "model", "root": args.model} for name in names]}

    async def answer(handler: Any, request: HttpRequest) -> Any:
        body = await request.json()
        if body.get("model") not in served and body.get("model") not in adapters:
            return error(404, f"The model `{body.get('model')}` does not exist.")
        return await handler(Request(body), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HttpRequest) -> Any:
        return await answer(chat.create_chat_completion, request)

    @app.post("/v1/completions")
    async def completions(request: HttpRequest) -> Any:
        return await answer(completion.create_completion, request)

    if _truthy("VLLM_ALLOW_RUNTIME_LORA_UPDATING"):

        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: HttpRequest) -> Any:
            body = await request.json()
            name, path = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not isinstance(path, str):
                return error(400, "lora_name and lora_path are required strings")
            if not args.enable_lora:
                return error(400, "LoRA is not enabled (start with --enable-lora)")
            if name in adapters:
                return error(400, f"The lora adapter '{name}' has already been loaded.")
            if not (Path(path) / "adapter_config.json").is_file():
                return error(400, f"No adapter found at {path}")
            adapters[name] = path
            return Response(f"Success: LoRA adapter '{name}' added successfully.", media_type="text/plain")

        @app.post("/v1/unload_lora_adapter")
        async def unload_lora_adapter(request: HttpRequest) -> Any:
            name = (await request.json()).get("lora_name")
            if name not in adapters:
                return error(404, f"The lora adapter '{name}' cannot be found.")
            del adapters[name]
            return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")

    return app


# The engine process: ends on SIGTERM, after STAND_IN_VLLM_ENGINE_EXIT_SECONDS when set (a negative value: never).
_ENGINE = """
import signal, sys, time
if sys.argv[1]:
    delay = float(sys.argv[1])
    signal.signal(signal.SIGTERM, signal.SIG_IGN if delay < 0 else lambda *_: (time.sleep(delay), sys.exit(0)))
time.sleep(3600)
"""


def main() -> None:
    """Parse ``sys.argv`` like vLLM and serve; exits 2 on unknown options."""
    args = _parser().parse_args(sys.argv[1:])
    print("argv " + json.dumps(sys.argv[1:]), flush=True)
    print("VLLM_ALLOW_RUNTIME_LORA_UPDATING=" + os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", ""), flush=True)
    failure = os.environ.get("STAND_IN_VLLM_FAIL")
    if failure:
        print(failure, flush=True)
        raise SystemExit(1)
    engine = subprocess.Popen([sys.executable, "-c", _ENGINE, os.environ.get("STAND_IN_VLLM_ENGINE_EXIT_SECONDS", "")])
    print(f"engine pid {engine.pid}", flush=True)
    time.sleep(float(os.environ.get("STAND_IN_VLLM_LOAD_SECONDS", "0")))
    import uvicorn
    import uvicorn.server

    if _truthy("STAND_IN_VLLM_IGNORE_SIGTERM"):
        uvicorn.server.HANDLED_SIGNALS = (signal.SIGINT,)  # type: ignore[assignment]
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server = uvicorn.Server(uvicorn.Config(_app(args), host=args.host, port=args.port, log_level="warning"))
    try:
        server.run()
    finally:
        engine.terminate()
        engine.wait()
