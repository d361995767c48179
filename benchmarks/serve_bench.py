"""Throughput and latency of ``agentbolt serve``'s transformers engine, measured over HTTP.

Starts ``agentbolt serve`` in a child process on a free port, sends streaming chat completions at each concurrency
level from this process (every request generates exactly ``--max-tokens`` tokens: ``ignore_eos``), and prints
JSON: aggregate generated tokens/s, time to first token (p50/max), request latency, and the server's peak RSS.
With ``--compare-generate`` it then times plain batched ``model.generate`` on the same prompts, in this process
with the same threads and OpenMP policy, as a reference point.

With ``--llama-server PATH`` (built by ``benchmarks/build_llama_server.sh``) it also starts llama.cpp's server on the
model's GGUF file (the embedded model's shipped Q4_1 file) with the same threads and as many slots as
``--max-batch-size``, and measures both servers in one run, alternating them level by level and round by round.
llama.cpp ignores ``ignore_eos``, so its requests bias every end-of-generation token to -inf instead: both generate
exactly ``--max-tokens`` tokens per request (counted and reported). Ratios between the two are what to compare when
the machine is busy.

Usage:
    python benchmarks/serve_bench.py                      # embedded SmolLM2-135M, 2 threads, default weights
    python benchmarks/serve_bench.py --dtype float32 --quantization none --concurrency 1 8 16
    python benchmarks/serve_bench.py --omp-wait passive --no-fast-forward --compare-generate
    python benchmarks/serve_bench.py --llama-server "$(bash benchmarks/build_llama_server.sh)" --rounds 3
    python benchmarks/serve_bench.py --int8-activations --llama-server "$(bash benchmarks/build_llama_server.sh)"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


async def _one(
    client: httpx.AsyncClient, messages: List[Dict[str, str]], max_tokens: int, peer: bool
) -> Dict[str, float]:
    body: Dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "stream": True}
    if peer:  # llama.cpp: no ignore_eos, so the end-of-generation tokens can never be sampled
        body["logit_bias"] = {str(token): -1000 for token in _END_TOKENS}
        body["stream_options"] = {"include_usage": True}
    else:
        body.update(ignore_eos=True, return_token_ids=True)
    started = time.perf_counter()
    first = None
    tokens = chunks = 0
    request = client.build_request("POST", "/chat/completions", json=body)
    try:
        response = await client.send(request, stream=True)
    except httpx.RemoteProtocolError:
        # A kept-alive connection the server closed as this request was sent (seen once with llama-server): the
        # request never reached it, so send it again, once, on a new connection.
        _RETRIED["llama_server" if peer else "serve"] += 1
        response = await client.send(request, stream=True)
    try:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                count = len(choice.get("token_ids", [])) or (
                    1 if peer and choice.get("delta", {}).get("content") else 0
                )
                if count and first is None:
                    first = time.perf_counter() - started
                chunks += count
    finally:
        await response.aclose()
    return {"ttft": first or 0.0, "latency": time.perf_counter() - started, "tokens": tokens or chunks}


async def _level(base_url: str, concurrency: int, rounds: int, max_tokens: int, peer: bool = False) -> Dict[str, Any]:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await _one(client, _prompts(1)[0], 4, peer)  # warm-up
        results: List[Dict[str, float]] = []
        started, client_cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            results += await asyncio.gather(*(_one(client, m, max_tokens, peer) for m in _prompts(concurrency)))
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


_END_TOKENS: List[int] = []  # the model's end-of-generation token ids (set in main)
_RETRIED = {"serve": 0, "llama_server": 0}  # requests sent again after their connection closed, per server


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


def _merge(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One level's figures over its rounds: summed tokens and time, medians of the per-round medians."""
    tokens = sum(r["generated_tokens"] for r in rounds)
    seconds = sum(r["seconds"] for r in rounds)
    return {
        "concurrency": rounds[0]["concurrency"],
        "requests": sum(r["requests"] for r in rounds),
        "generated_tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
        "tokens_per_s_rounds": [r["tokens_per_s"] for r in rounds],
        "ttft_p50_s": round(statistics.median(r["ttft_p50_s"] for r in rounds), 3),
        "ttft_max_s": max(r["ttft_max_s"] for r in rounds),
        "latency_p50_s": round(statistics.median(r["latency_p50_s"] for r in rounds), 3),
        "client_cpu_s": round(sum(r["client_cpu_s"] for r in rounds), 3),
    }


def _end_tokens(model_dir: str) -> List[int]:
    """Token ids that end a generation: EOS of the tokenizer and generation config, and ChatML's end of turn."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = {tokenizer.eos_token_id}
    try:
        configured = GenerationConfig.from_pretrained(model_dir).eos_token_id
        ids.update(configured if isinstance(configured, list) else [configured])
    except OSError:
        pass
    for text in ("<|im_end|>", "<|endoftext|>", "</s>"):
        token = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token, int) and token != tokenizer.unk_token_id:
            ids.add(token)
    return sorted(i for i in ids if isinstance(i, int))


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
    command += ["--quantization", args.quantization]
    if args.int8_activations:
        command.append("--int8-activations")
    if not args.fast_forward:
        command.append("--no-fast-forward")
    return _wait_healthy(subprocess.Popen(command, stderr=subprocess.PIPE, text=True), port, "agentbolt serve")


def _start_llama_server(args: argparse.Namespace, gguf_file: str, port: int) -> subprocess.Popen[str]:
    binary = Path(args.llama_server)
    command = [str(binary), "-m", gguf_file, "--port", str(port), "--host", "127.0.0.1", "-t", str(args.threads)]
    command += ["-np", str(args.max_batch_size), "-c", str(args.max_batch_size * 1024), "--no-webui"]
    environment = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environment)
    return _wait_healthy(process, port, "llama-server")


def _wait_healthy(process: subprocess.Popen[str], port: int, name: str) -> subprocess.Popen[str]:
    deadline = time.monotonic() + 600
    while True:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"{name} did not become ready within 10 minutes")
        time.sleep(0.2)


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="auto", choices=["auto", "none", "q8_0", "q4_1"])
    parser.add_argument(
        "--int8-activations", action="store_true", help="Serve with --int8-activations (integer block products)."
    )
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary, measured side by side.")
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
    _END_TOKENS.extend(_end_tokens(model_dir))
    port = _free_port()
    started = time.perf_counter()
    server = _start_server(args, model_dir, port)
    load_seconds = time.perf_counter() - started
    peer = peer_port = None
    if args.llama_server:
        from agentbolt.models import resolve_gguf

        peer_port = _free_port()
        peer = _start_llama_server(args, str(resolve_gguf(args.model)), peer_port)
    levels: List[Dict[str, Any]] = []
    peer_levels: List[Dict[str, Any]] = []
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        for concurrency in args.concurrency:
            ours: List[Dict[str, Any]] = []
            theirs: List[Dict[str, Any]] = []
            for round_index in range(args.rounds):  # alternate who goes first, round by round
                order = [False, True] if round_index % 2 == 0 else [True, False]
                for is_peer in order if peer is not None else [False]:
                    url = f"http://127.0.0.1:{peer_port}/v1" if is_peer else base_url
                    try:
                        result = asyncio.run(_level(url, concurrency, 1, args.max_tokens, peer=is_peer))
                    except httpx.HTTPError as exc:
                        name = "llama-server" if is_peer else "agentbolt serve"
                        running = (peer if is_peer else server).poll() is None  # type: ignore[union-attr]
                        raise SystemExit(
                            f"{name} failed at concurrency {concurrency}, round {round_index + 1}: {exc!r} "
                            f"({'still running' if running else 'exited'}; its stderr follows this message)"
                        ) from exc
                    (theirs if is_peer else ours).append(result)
            levels.append(_merge(ours))
            if theirs:
                peer_levels.append(_merge(theirs))
        peak_rss = _peak_rss_mb(server.pid)
        peer_rss = _peak_rss_mb(peer.pid) if peer is not None else None
    finally:
        stopped_on_sigint = True
        for process in [server] if peer is None else [server, peer]:
            process.send_signal(signal.SIGINT)
            try:
                _, errors = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:  # recorded: the figures above were measured before the stop
                print(f"process {process.pid} did not stop within 60 s of SIGINT: killed", file=sys.stderr)
                process.kill()
                _, errors = process.communicate()
                stopped_on_sigint = False
            if sys.exc_info()[0] is not None:  # failing: show what the server said
                tail = "\n".join((errors or "").splitlines()[-30:])
                print(f"--- stderr of {' '.join(process.args[:3])} (last lines) ---\n{tail}", file=sys.stderr)
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
        "quantization": args.quantization,
        "int8_activations": args.int8_activations,
        "load_seconds": round(load_seconds, 2),
        "levels": levels,
        "plain_generate": reference,
        "server_peak_rss_mb": peak_rss,
        "server_stopped_on_sigint": stopped_on_sigint,
        "requests_sent_again": dict(_RETRIED),
        "llama_server": None
        if peer is None
        else {"binary": args.llama_server, "levels": peer_levels, "peak_rss_mb": peer_rss, "end_tokens": _END_TOKENS},
    }
    record.finish(report, args)


if __name__ == "__main__":
    main()
