"""Throughput and latency of ``agentbolt serve``'s transformers engine, measured over HTTP.

Starts the OpenAI-compatible server in-process on a free port, sends streaming chat completions at each
concurrency level (every request generates exactly ``--max-tokens`` tokens: ``ignore_eos``), and prints JSON:
aggregate generated tokens/s, time to first token (p50/max), request latency, and peak RSS of the process. With
``--compare-generate`` it also times plain batched ``model.generate`` on the same prompts as a reference point.

Usage:
    python benchmarks/serve_bench.py                      # embedded SmolLM2-135M, bf16, 2 threads
    python benchmarks/serve_bench.py --dtype float32 --concurrency 1 8 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import time
from typing import Any, Dict, List

import httpx


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
        started = time.perf_counter()
        for _ in range(rounds):
            results += await asyncio.gather(*(_one(client, m, max_tokens) for m in _prompts(concurrency)))
        elapsed = time.perf_counter() - started
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
    }


def _plain_generate(engine: Any, batch: int, max_tokens: int) -> Dict[str, Any]:
    import torch

    tokenizer, model = engine.tokenizer, engine.model
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="Waves of requests per concurrency level.")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--compare-generate", action="store_true", help="Also time plain batched model.generate.")
    args = parser.parse_args()

    from agentbolt.serving.transformers_engine import TransformersEngine, configure_openmp

    configure_openmp()  # as `agentbolt serve` does, before torch is imported
    from agentbolt.models import resolve_model
    from agentbolt.serving.server import InferenceServer

    model_dir = resolve_model(args.model, progress=lambda message: print(message, file=os.sys.stderr)).path
    engine = TransformersEngine(
        model_dir, dtype=args.dtype, threads=args.threads, max_batch_size=args.max_batch_size, served_name=args.model
    )
    started = time.perf_counter()
    server = InferenceServer(engine, port=0)
    server.start()
    load_seconds = time.perf_counter() - started
    try:
        levels = [asyncio.run(_level(server.base_url, c, args.rounds, args.max_tokens)) for c in args.concurrency]
        reference = None
        if args.compare_generate:
            with engine.weights_update():  # keep the engine idle while generate() runs
                reference = [_plain_generate(engine, c, args.max_tokens) for c in args.concurrency]
    finally:
        server.stop()
    report = {
        "benchmark": "serve",
        "model": args.model,
        "dtype": args.dtype,
        "threads": args.threads,
        "max_batch_size": args.max_batch_size,
        "max_tokens": args.max_tokens,
        "load_seconds": round(load_seconds, 2),
        "levels": levels,
        "plain_generate": reference,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
