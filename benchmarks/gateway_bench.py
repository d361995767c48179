"""Latency the LLM gateway adds, and its throughput, with tracing to a SQLite store on.

Processes, as a user would run them: a fast fake OpenAI-compatible backend in its own process (it stands in for
the model; the gateway is what is measured), the gateway in its own process (``agentbolt proxy``), and a SQLite
store in one of two placements, each measured in turn:

* ``in_gateway`` (top-level keys): ``agentbolt proxy --store <tmp>/bench.db``, the gateway owns the SQLite file;
* ``store_server`` (under ``"store_server"``): ``agentbolt store --path <tmp>/bench.db`` in a third process and
  ``agentbolt proxy --store http://127.0.0.1:<port>``, so sequence ids and spans go over HTTP.

At concurrency 1, requests go round-robin to the backend directly, to the gateway bound to a rollout (each call
recorded as a span with token ids: ``proxy_*``) and to the gateway without a rollout (nothing recorded:
``proxy_untraced_*``); ``added_*`` is the difference of the percentiles with the direct ones. The same is repeated
(200 requests) with a backend that takes ``--backend-delay-ms`` to answer, like a (very fast) model: the store's
sequence-id round trip, which runs alongside the upstream call, is then hidden behind it. Then the backend and the
traced gateway are driven at concurrency 32 for throughput. After stopping the gateway, the script counts the spans
in the store (``spans_recorded`` must equal ``proxy_calls``).

Usage::

    python benchmarks/gateway_bench.py [--requests 1000] [--concurrency 32] [--throughput-requests 3000]
        [--backend-delay-ms 20]

Prints one JSON object and writes it to a result file (``result_files.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from result_files import RunRecord, add_result_options

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


async def _open_store(spec: str) -> Any:
    if spec.startswith("http"):
        from agentbolt.store.client_server import LightningStoreClient

        return LightningStoreClient(spec)
    from agentbolt.store.sqlite import SqliteLightningStore

    return SqliteLightningStore(spec)


async def _new_rollout(spec: str) -> Tuple[str, str]:
    store = await _open_store(spec)
    rollout = await store.start_rollout(input={"benchmark": "gateway"})
    await store.close()
    return rollout.rollout_id, rollout.attempt.attempt_id


async def _count_spans(spec: str, rollout_id: str) -> int:
    store = await _open_store(spec)
    count = len(await store.query_spans(rollout_id))
    await store.close()
    return count


def _stop(processes: List[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in reversed(processes):
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    processes.clear()


def run_setup(args: argparse.Namespace, tmp: str, backend_port: int, store_placement: str) -> Dict[str, Any]:
    """Measure the gateway with its SQLite store in its own process (``"in_gateway"``) or behind
    ``agentbolt store`` (``"store_server"``)."""
    agentbolt = [sys.executable, "-c", "import sys; from agentbolt.cli import main; sys.exit(main())"]
    quiet: Dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    db = f"{tmp}/{store_placement}.db"
    processes: List[subprocess.Popen[bytes]] = []
    try:
        if store_placement == "store_server":
            store_port = _free_port()
            server = subprocess.Popen(
                [*agentbolt, "store", "--path", db, "--port", str(store_port), "--log-level", "WARNING"], **quiet
            )
            processes.append(server)
            _wait_http(store_port, "/v1/agl/health", server)
            spec = f"http://127.0.0.1:{store_port}"
        else:
            spec = db
        rollout_id, attempt_id = asyncio.run(_new_rollout(spec))  # before the gateway opens a SQLite file
        config = Path(tmp) / "models.yaml"
        entries = [
            {
                "model_name": name,
                "litellm_params": {"model": f"hosted_vllm/{name}", "api_base": f"http://127.0.0.1:{backend_port}/v1"},
            }
            for name in ("bench", f"bench-delay-{args.backend_delay_ms}")
        ]
        config.write_text(json.dumps({"model_list": entries}))
        proxy_port = _free_port()
        proxy = subprocess.Popen(
            [
                *agentbolt,
                "proxy",
                "--config",
                str(config),
                "--store",
                spec,
                "--port",
                str(proxy_port),
                "--log-level",
                "WARNING",
            ],
            **quiet,
        )
        processes.append(proxy)
        _wait_http(proxy_port, "/health", proxy)

        path = f"/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
        result: Dict[str, Any] = measure_latency(backend_port, proxy_port, path, args.requests, args.warmup)
        result[f"with_{args.backend_delay_ms}ms_backend"] = measure_latency(
            backend_port, proxy_port, path, 200, 20, model=f"bench-delay-{args.backend_delay_ms}"
        )
        result["direct_throughput_rps"] = round(
            asyncio.run(
                measure_throughput(backend_port, "/v1/chat/completions", args.throughput_requests, args.concurrency)
            ),
            1,
        )
        result["proxy_throughput_rps"] = round(
            asyncio.run(measure_throughput(proxy_port, path, args.throughput_requests, args.concurrency)), 1
        )
        result["proxy_calls"] = args.warmup + args.requests + 220 + args.throughput_requests  # traced calls only
        # Stopping the gateway writes every queued span; then count them in the store.
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=60)
        result["spans_recorded"] = asyncio.run(_count_spans(spec, rollout_id))
    finally:
        _stop(processes)
    return result


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="Measured requests per target at concurrency 1.")
    parser.add_argument("--warmup", type=int, default=100, help="Unmeasured requests per target first.")
    parser.add_argument("--concurrency", type=int, default=32, help="Clients in the throughput phase.")
    parser.add_argument("--throughput-requests", type=int, default=3000, help="Requests per target, throughput phase.")
    parser.add_argument(
        "--backend-delay-ms", type=int, default=20, help="Backend answer delay of the second latency phase."
    )
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    add_result_options(parser)
    args = parser.parse_args()
    if args.serve_backend:
        serve_backend(args.serve_backend)
        return
    if args.requests < 200:
        parser.error("--requests must be at least 200")

    backend_port = _free_port()
    backend = subprocess.Popen(
        [sys.executable, __file__, "--serve-backend", str(backend_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(backend_port, "/", backend)
        with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
            in_gateway = run_setup(args, tmp, backend_port, "in_gateway")
            store_server = run_setup(args, tmp, backend_port, "store_server")
    finally:
        _stop([backend])

    result = {
        **in_gateway,
        "store": "SQLite file opened by the gateway process (agentbolt proxy --store bench.db)",
        "store_server": {
            **store_server,
            "store": "SQLite behind 'agentbolt store' in its own process (agentbolt proxy --store http://...)",
        },
        "concurrency": args.concurrency,
        "requests_concurrency_1": args.requests,
    }
    record.finish(result, args)


if __name__ == "__main__":
    main()
