"""Latency the LLM gateway adds, and its throughput, with tracing to a SQLite store on.

Three processes besides this one, as a user would run them:

* a fast fake OpenAI-compatible backend (it stands in for the model; the gateway is what is measured),
* ``agentbolt store --path <tmp>/bench.db`` (SQLite store server),
* ``agentbolt proxy --config <models.yaml> --store http://127.0.0.1:<store port>`` (the gateway).

At concurrency 1, requests go round-robin to the backend directly, to the gateway bound to a rollout (each call
recorded as a span with token ids: ``proxy_*``) and to the gateway without a rollout (nothing recorded:
``proxy_untraced_*``); ``added_*`` is the difference of the percentiles with the direct ones. The same is repeated
(200 requests) with a backend that takes ``--backend-delay-ms`` to answer, like a (very fast) model: the store's
sequence-id round trip, which runs alongside the upstream call, is then hidden behind it. Then the backend and the
traced gateway are driven at concurrency 32 for throughput. The script checks that every traced call was recorded
in the store.

Usage::

    python benchmarks/gateway_bench.py [--requests 1000] [--concurrency 32] [--throughput-requests 3000]
        [--backend-delay-ms 20]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REQUEST = {
    "model": "bench",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ],
    "max_tokens": 16,
    "temperature": 0.0,
}


# -- the fake backend (runs in its own process) ----------------------------------------------------------------------


class _BackendProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server answering every POST with a fixed chat completion (vLLM layout)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: Optional[asyncio.Transport] = None
        self.counter = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < head_end + 4 + length:
                return
            body = self.buffer[head_end + 4 : head_end + 4 + length]
            self.buffer = self.buffer[head_end + 4 + length :]
            self._answer(body)

    def _answer(self, body: bytes) -> None:
        request = json.loads(body) if body else {}
        self.counter += 1
        response: Dict[str, Any] = {
            "id": f"chatcmpl-{os.getpid()}-{self.counter}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "bench"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris."},
                    "finish_reason": "stop",
                    "logprobs": {
                        "content": [
                            {"token": "Paris", "logprob": -0.01, "bytes": [80, 97, 114, 105, 115], "top_logprobs": []},
                            {"token": ".", "logprob": -0.2, "bytes": [46], "top_logprobs": []},
                        ]
                    },
                }
            ],
            "usage": {"prompt_tokens": 32, "completion_tokens": 2, "total_tokens": 34},
        }
        if request.get("return_token_ids"):
            response["prompt_token_ids"] = list(range(100, 132))
            response["choices"][0]["token_ids"] = [12366, 13]
        payload = json.dumps(response).encode()
        assert self.transport is not None
        message = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        # A model named "<name>-delay-<ms>" answers after that many milliseconds (a stand-in for generation time).
        _, _, delay_ms = str(request.get("model", "")).partition("-delay-")
        if delay_ms.isdigit():
            asyncio.get_running_loop().call_later(int(delay_ms) / 1000, self.transport.write, message)
        else:
            self.transport.write(message)


def serve_backend(port: int) -> None:
    """Process body of the fake backend."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_BackendProtocol, "127.0.0.1", port, backlog=1024)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        async with server:
            await stop.wait()

    asyncio.run(main())


# -- helpers ---------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(port: int, path: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process {process.args} exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", path)
            if connection.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port} within {timeout} s")


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _timed_post(connection: http.client.HTTPConnection, path: str, body: bytes) -> float:
    start = time.perf_counter()
    connection.request("POST", path, body=body, headers={"content-type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - start
    if response.status != 200:
        raise RuntimeError(f"POST {path} answered {response.status}: {data[:300]!r}")
    return elapsed * 1000.0


def measure_latency(
    backend_port: int, proxy_port: int, traced_path: str, requests: int, warmup: int, model: str = "bench"
) -> Dict[str, float]:
    """Round-robin over three keep-alive connections (concurrency 1): the backend directly, the gateway with
    tracing (URL bound to a rollout), and the gateway without tracing (plain ``/v1`` URL)."""
    body = json.dumps({**REQUEST, "model": model}).encode()
    targets = {
        "direct": (backend_port, "/v1/chat/completions"),
        "proxy": (proxy_port, traced_path),
        "proxy_untraced": (proxy_port, "/v1/chat/completions"),
    }
    connections = {name: http.client.HTTPConnection("127.0.0.1", port) for name, (port, _) in targets.items()}
    samples: Dict[str, List[float]] = {name: [] for name in targets}
    for i in range(warmup + requests):
        for name, (_, path) in targets.items():
            elapsed = _timed_post(connections[name], path, body)
            if i >= warmup:
                samples[name].append(elapsed)
    for connection in connections.values():
        connection.close()
    result: Dict[str, float] = {}
    for name, values in samples.items():
        result[f"{name}_p50_ms"] = _percentile(values, 50)
        result[f"{name}_p99_ms"] = _percentile(values, 99)
    for q in ("p50", "p99"):
        result[f"added_{q}_ms"] = result[f"proxy_{q}_ms"] - result[f"direct_{q}_ms"]
        result[f"added_untraced_{q}_ms"] = result[f"proxy_untraced_{q}_ms"] - result[f"direct_{q}_ms"]
    return {key: round(value, 3) for key, value in result.items()}


async def measure_throughput(port: int, path: str, total: int, concurrency: int) -> float:
    """Requests per second with ``concurrency`` clients sharing ``total`` requests."""
    import aiohttp

    body = json.dumps(REQUEST).encode()
    remaining = total
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                async with session.post(
                    f"http://127.0.0.1:{port}{path}", data=body, headers={"content-type": "application/json"}
                ) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"POST {path} answered {response.status}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start)


async def _store_setup(store_url: str) -> Tuple[str, str]:
    from agentbolt.store.client_server import LightningStoreClient

    client = LightningStoreClient(store_url)
    rollout = await client.start_rollout(input={"benchmark": "gateway"})
    await client.close()
    return rollout.rollout_id, rollout.attempt.attempt_id


async def _count_spans(store_url: str, rollout_id: str, expected: int, timeout: float = 60.0) -> int:
    from agentbolt.store.client_server import LightningStoreClient

    client = LightningStoreClient(store_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            spans = await client.query_spans(rollout_id)
            if len(spans) >= expected or time.monotonic() > deadline:
                return len(spans)
            await asyncio.sleep(0.2)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="Measured requests per target at concurrency 1.")
    parser.add_argument("--warmup", type=int, default=100, help="Unmeasured requests per target first.")
    parser.add_argument("--concurrency", type=int, default=32, help="Clients in the throughput phase.")
    parser.add_argument("--throughput-requests", type=int, default=3000, help="Requests per target, throughput phase.")
    parser.add_argument(
        "--backend-delay-ms", type=int, default=20, help="Backend answer delay of the second latency phase."
    )
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_backend:
        serve_backend(args.serve_backend)
        return
    if args.requests < 200:
        parser.error("--requests must be at least 200")

    load_before = os.getloadavg()
    backend_port, store_port, proxy_port = _free_port(), _free_port(), _free_port()
    agentbolt = [sys.executable, "-c", "import sys; from agentbolt.cli import main; sys.exit(main())"]
    processes: List[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        try:
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            backend = subprocess.Popen([sys.executable, __file__, "--serve-backend", str(backend_port)], **quiet)
            processes.append(backend)
            store = subprocess.Popen(
                [*agentbolt, "store", "--path", f"{tmp}/bench.db", "--port", str(store_port), "--log-level", "WARNING"],
                **quiet,
            )
            processes.append(store)
            _wait_http(backend_port, "/", backend)
            _wait_http(store_port, "/v1/agl/health", store)
            store_url = f"http://127.0.0.1:{store_port}"
            config = Path(tmp) / "models.yaml"
            config.write_text(
                json.dumps(
                    {
                        "model_list": [
                            {
                                "model_name": name,
                                "litellm_params": {
                                    "model": f"hosted_vllm/{name}",
                                    "api_base": f"http://127.0.0.1:{backend_port}/v1",
                                },
                            }
                            for name in ("bench", f"bench-delay-{args.backend_delay_ms}")
                        ]
                    }
                )
            )
            proxy_cmd = [*agentbolt, "proxy", "--config", str(config), "--store", store_url, "--port", str(proxy_port)]
            proxy = subprocess.Popen([*proxy_cmd, "--log-level", "WARNING"], **quiet)
            processes.append(proxy)
            _wait_http(proxy_port, "/health", proxy)

            rollout_id, attempt_id = asyncio.run(_store_setup(store_url))
            proxy_path = f"/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
            latency = measure_latency(backend_port, proxy_port, proxy_path, args.requests, args.warmup)
            delayed = measure_latency(
                backend_port, proxy_port, proxy_path, 200, 20, model=f"bench-delay-{args.backend_delay_ms}"
            )
            direct_rps = asyncio.run(
                measure_throughput(backend_port, "/v1/chat/completions", args.throughput_requests, args.concurrency)
            )
            proxy_rps = asyncio.run(
                measure_throughput(proxy_port, proxy_path, args.throughput_requests, args.concurrency)
            )
            expected = args.warmup + args.requests + 220 + args.throughput_requests  # traced calls only
            recorded = asyncio.run(_count_spans(store_url, rollout_id, expected))
        finally:
            for process in reversed(processes):
                process.send_signal(signal.SIGTERM)
            for process in reversed(processes):
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()

    result = {
        **latency,
        f"with_{args.backend_delay_ms}ms_backend": delayed,
        "concurrency": args.concurrency,
        "direct_throughput_rps": round(direct_rps, 1),
        "proxy_throughput_rps": round(proxy_rps, 1),
        "requests_concurrency_1": args.requests,
        "proxy_calls": expected,
        "spans_recorded": recorded,
        "store": "agentbolt store (SQLite) in its own process; gateway writes spans over HTTP",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "loadavg_1min_before": round(load_before[0], 2),
            "loadavg_1min_after": round(os.getloadavg()[0], 2),
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
