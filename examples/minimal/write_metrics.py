"""Record counters and histograms to the console and to Prometheus at once, through ``MultiMetricsBackend``.

A ``ConsoleMetricsBackend`` logs rolling rates and percentiles; a ``PrometheusMetricsBackend`` (on its own
registry) is served at ``http://127.0.0.1:PORT/metrics`` by ``prometheus_client`` for a scraper. Both receive every
registration and recording. At the end the script scrapes its own endpoint once and prints the metrics it serves.

Usage (needs ``prometheus-client``, in the ``dev`` extra or ``pip install prometheus-client``)::

    python -m examples.minimal.write_metrics
    python -m examples.minimal.write_metrics --port 9464 --events 50 --keep-serving 60   # then curl :9464/metrics
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
import urllib.request
from typing import List, Optional

from agentbolt.utils.metrics import ConsoleMetricsBackend, MultiMetricsBackend, PrometheusMetricsBackend
from agentbolt.utils.server_launcher import pick_free_port
from examples.common.arguments import count, number, require_port_free, tcp_port

LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0)


async def record(tracker: MultiMetricsBackend, events: int, seed: int = 0) -> None:
    """Register two metrics and record ``events`` simulated requests on both backends."""
    tracker.register_counter("example.requests", label_names=["route", "status"])
    tracker.register_histogram("example.latency_seconds", label_names=["route"], buckets=LATENCY_BUCKETS)
    rng = random.Random(seed)
    for index in range(events):
        route = "/v1/chat/completions" if index % 3 else "/v1/models"
        status = "500" if rng.random() < 0.1 else "200"
        await tracker.inc_counter("example.requests", labels={"route": route, "status": status})
        await tracker.observe_histogram("example.latency_seconds", rng.uniform(0.0, 0.6), labels={"route": route})


def serve_and_record(port: int, events: int, log_interval: float = 1.0, keep_serving: float = 0.0) -> str:
    """Serve the Prometheus registry on ``port``, record, and return what a scrape of ``/metrics`` answers.

    ``/metrics`` stays up ``keep_serving`` seconds after the scrape (for a scraper of your own).
    """
    import prometheus_client

    registry = prometheus_client.CollectorRegistry()
    tracker = MultiMetricsBackend(
        [ConsoleMetricsBackend(log_interval_seconds=log_interval), PrometheusMetricsBackend(registry=registry)]
    )
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        asyncio.run(record(tracker, events))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
        time.sleep(keep_serving)
        return scraped
    finally:
        server.shutdown()
        thread.join(timeout=5)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.minimal.write_metrics", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=tcp_port, default=None, help="port of /metrics (default: a free one)")
    parser.add_argument("--events", type=count(0), default=30, help="simulated requests recorded (default: 30)")
    parser.add_argument(
        "--keep-serving", type=number(minimum=0.0), default=0.0, help="seconds to keep /metrics up afterwards"
    )
    args = parser.parse_args(argv)
    if args.port is not None:
        require_port_free(parser, "--port", "127.0.0.1", args.port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    port = args.port or pick_free_port("127.0.0.1")
    print(f"Prometheus metrics at http://127.0.0.1:{port}/metrics")
    scraped = serve_and_record(port, args.events, keep_serving=args.keep_serving)
    print("\n".join(line for line in scraped.splitlines() if line.startswith("example_")))


if __name__ == "__main__":
    main()
