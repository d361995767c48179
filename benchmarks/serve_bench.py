"""Throughput and latency of ``agentbolt serve``'s transformers engine, measured over HTTP.

Starts ``agentbolt serve`` in a child process on a free port, sends streaming chat completions at each concurrency
level from this process (every request generates exactly ``--max-tokens`` tokens: ``ignore_eos``), and prints
JSON: aggregate generated tokens/s, time to first token (p50/max), request latency, and the server's peak RSS.
With ``--compare-generate`` it then times plain batched ``model.generate`` on the same prompts, in this process
with the same threads and OpenMP policy, as a reference point.

Usage:
    python benchmarks/serve_bench.py                      # embedded SmolLM2-135M, bf16, 2 threads
    python benchmarks/serve_bench.py --dtype float32 --concurrency 1 8 16
    python benchmarks/serve_bench.py --omp-wait passive --no-fast-forward --compare-generate
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx
from result_files import RunRecord, add_result_options


def _prompts(count: int) -> List[List[Dict[str, str]]]:
    topics = ["the sea", "a robot", "autumn", "a lighthouse", "bread", "the moon", "a library", "rain"]
    return [
        [{"role": "user", "content": f"Write a short story about {topics[i % len(topics)]}."}] for i in range(count)
    ]


async def _one(client: httpx.AsyncClient, messages: List[Dict[str, str]], max_tokens: int) -> Dict[str, float]:
    body = {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.7, "stream": True}
    body["return_token_ids"] = True
    started = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", "/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                count = len(choice.get("token_ids", []))
                if count and first is None:
                    first = time.perf_counter() - started
                tokens += count
    return {"ttft": first or 0.0, "latency": time.perf_counter() - started, "tokens": tokens}


async def _level(base_url: str, concurrency: int, rounds: int, max_tokens: int) -> Dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await _one(client, _prompts(1)[0], 4)  # warm-up
        results: List[Dict[str, float]] = []
        started, client_cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            results += await asyncio.gather(*(_one(client, m, max_tokens) for m in _prompts(concurrency)))
        elapsed, client_cpu = time.perf_counter() - started, time.process_time() - client_cpu
    tokens = sum(r["tokens"] for r in results)
    ttfts = [r["ttft"] for r in results]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "generated_tokens": tokens,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(tokens / elapsed, 1),
        "ttft_p50_s": round(statistics.median(ttfts), 3),
        "ttft_max_s": round(max(ttfts), 3),
        "latency_p50_s": round(statistics.median(r["latency"] for r in results), 3),
        "client_cpu_s": round(client_cpu, 3),  # CPU time this (client) process took from the server's cores
    }


def _plain_generate(model_dir: str, dtype: str, threads: int, batch: int, max_tokens: int) -> Dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentbolt.serving.transformers_engine import resolve_dtype

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=resolve_dtype(dtype)).eval()
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in _prompts(batch)]
    tokenizer.padding_side = "left"
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = {"do_sample": True, "temperature": 0.7, "pad_token_id": tokenizer.pad_token_id}
    with torch.inference_mode():
        model.generate(**encoded, max_new_tokens=4, **kwargs)
        started = time.perf_counter()
        model.generate(**encoded, max_new_tokens=max_tokens, min_new_tokens=max_tokens, **kwargs)
    elapsed = time.perf_counter() - started
    return {"batch": batch, "tokens_per_s": round(batch * max_tokens / elapsed, 1)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _peak_rss_mb(pid: int) -> Optional[float]:
    """Peak resident set size of a live process (Linux ``VmHWM``), or ``None`` elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _start_server(args: argparse.Namespace, model_dir: str, port: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "agentbolt", "serve", model_dir, "--port", str(port)]
    command += ["--dtype", args.dtype, "--threads", str(args.threads), "--max-batch-size", str(args.max_batch_size)]
    command += ["--omp-wait", args.omp_wait, "--served-name", args.model, "--log-level", "WARNING"]
    if not args.fast_forward:
        command.append("--no-fast-forward")
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while True:
        if process.poll() is not None:
            raise SystemExit(f"agentbolt serve exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit("agentbolt serve did not become ready within 10 minutes")
        time.sleep(0.2)


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="Waves of requests per concurrency level.")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--omp-wait", choices=["spin", "passive"], default="spin", help="Server's OpenMP policy.")
    parser.add_argument("--no-fast-forward", dest="fast_forward", action="store_false", help="transformers forward.")
    parser.add_argument("--compare-generate", action="store_true", help="Also time plain batched model.generate.")
    add_result_options(parser)
    args = parser.parse_args()

    from agentbolt.models import resolve_model

    model_dir = str(resolve_model(args.model, progress=lambda message: print(message, file=sys.stderr)).path)
    port = _free_port()
    started = time.perf_counter()
    server = _start_server(args, model_dir, port)
    load_seconds = time.perf_counter() - started
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        levels = [asyncio.run(_level(base_url, c, args.rounds, args.max_tokens)) for c in args.concurrency]
        peak_rss = _peak_rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.communicate(timeout=60)
            stopped_on_sigint = True
        except subprocess.TimeoutExpired:  # recorded: the figures above were measured before the stop
            server.kill()
            server.communicate()
            stopped_on_sigint = False
    reference = None
    if args.compare_generate:  # after the server exited, with the same OpenMP policy and threads
        from agentbolt.serving.transformers_engine import configure_openmp

        configure_openmp(args.omp_wait)
        reference = [_plain_generate(model_dir, args.dtype, args.threads, c, args.max_tokens) for c in args.concurrency]
    report = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": args.threads,
        "max_batch_size": args.max_batch_size,
        "max_tokens": args.max_tokens,
        "omp_wait": args.omp_wait,
        "fast_forward": args.fast_forward,
        "load_seconds": round(load_seconds, 2),
        "levels": levels,
        "plain_generate": reference,
        "server_peak_rss_mb": peak_rss,
        "server_stopped_on_sigint": stopped_on_sigint,
    }
    record.finish(report, args)


if __name__ == "__main__":
    main()
