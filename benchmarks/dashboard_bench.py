"""How fast the dashboard is on a large store: first paint and paging with 10,000 rollouts, in headless chromium.

Starts ``agentbolt store`` on a fresh SQLite file, enqueues ``--rollouts`` rollouts (a quarter of them validation),
finishes ``--finished`` of them on a worker with a reward span each, then opens the Rollouts page in Debian's
chromium through Playwright (install both with ``make browser`` and ``pip install 'agentbolt[browser-tests]'``).

Measured, ``--repeats`` times each (median and max reported, in milliseconds):

* ``first_paint_ms``: from the start of navigation to ``/rollouts`` until the first page of rows is on screen
  (HTML, script, the API call, rendering);
* ``next_page_ms`` / ``last_page_ms``: from a click on "next" / "last page" until that page's rows are shown;
* ``api_page_ms``: the ``/v1/agl/dashboard/rollouts`` call of one page at offset 0 and at the last offset (the store
  pages it), and ``api_scan_ms``: the same call with a text filter, which reads every rollout;
* ``api_sort_reward_ms``: the first page sorted by reward, which reads the reward of every rollout. It runs first,
  right after seeding, so that the rewards are still those of just-finished rollouts (read from the store on every
  call; the dashboard caches the rewards of rollouts that ended more than 30 s ago).

Usage::

    python benchmarks/dashboard_bench.py [--rollouts 10000] [--finished 500] [--repeats 5] [--api-only]

``--api-only`` skips the browser (no chromium needed).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from dashboard.browser import LAUNCH_ARGS, chromium_path  # noqa: E402
from dashboard.seeding import reward_span  # noqa: E402
from result_files import RunRecord, add_result_options  # noqa: E402


def _free_port() -> int:
    from agentbolt.utils.server_launcher import pick_free_port

    return pick_free_port("127.0.0.1")


async def _seed(url: str, rollouts: int, finished: int) -> None:
    from agentbolt.store.client_server import LightningStoreClient
    from agentbolt.types import EnqueueRolloutRequest

    client = LightningStoreClient(url)
    try:
        for start in range(0, rollouts, 1000):
            batch = [
                EnqueueRolloutRequest(input={"task": f"task {i}"}, mode="val" if i % 4 == 0 else "train")
                for i in range(start, min(start + 1000, rollouts))
            ]
            await client.enqueue_many_rollouts(batch)
        claimed = await client.dequeue_many_rollouts(limit=finished, worker_id="Worker-0")
        for start in range(0, len(claimed), 500):
            chunk = claimed[start : start + 500]
            # Varied rewards, so that sorting by reward has work to do; the store issues the sequence ids.
            spans = [
                reward_span(c.rollout_id, c.attempt.attempt_id, 1, (start + i) % 97 / 96) for i, c in enumerate(chunk)
            ]
            await client.add_spans_with_new_sequence_ids(spans)
            await asyncio.gather(
                *(client.update_attempt(c.rollout_id, c.attempt.attempt_id, status="succeeded") for c in chunk)
            )
    finally:
        await client.close()


def _summary(values: List[float]) -> Dict[str, float]:
    return {"median": round(statistics.median(values), 1), "max": round(max(values), 1)}


def _api_timings(url: str, rollouts: int, repeats: int) -> Dict[str, Any]:
    endpoint = url + "/v1/agl/dashboard/rollouts"
    cases = {
        "api_sort_reward_ms": {"limit": 50, "sort_by": "reward", "sort_order": "desc"},
        "api_page_first_ms": {"limit": 50},
        "api_page_last_ms": {"limit": 50, "offset": max(0, rollouts - 50)},
        "api_scan_text_ms": {"limit": 50, "text": "task 9"},
    }
    results: Dict[str, Any] = {}
    with httpx.Client(timeout=120) as http:
        for name, params in cases.items():
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                http.get(endpoint, params=params).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
            results[name] = _summary(times)
    return results


def _browser_timings(url: str, repeats: int) -> Dict[str, Any]:
    from playwright.sync_api import sync_playwright

    chromium = chromium_path()
    if chromium is None:
        raise SystemExit("Debian's chromium is not installed: run `make browser` (as root)")
    first, following, last = [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH_ARGS)
        try:
            for _ in range(repeats):
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                started = time.perf_counter()
                page.goto(url + "/rollouts", wait_until="commit")
                page.locator("table.rollouts tbody tr").nth(49).wait_for()
                first.append((time.perf_counter() - started) * 1000)
                for button, target in (("next page", following), ("last page", last)):
                    before = page.locator("table.rollouts tbody tr").first.get_attribute("data-rollout-id")
                    started = time.perf_counter()
                    page.get_by_role("button", name=button).click()
                    page.wait_for_function(
                        "(before) => { const r = document.querySelector('table.rollouts tbody tr');"
                        " return r && r.dataset.rolloutId !== before; }",
                        arg=before,
                    )
                    target.append((time.perf_counter() - started) * 1000)
                context.close()
        finally:
            browser.close()
    return {"first_paint_ms": _summary(first), "next_page_ms": _summary(following), "last_page_ms": _summary(last)}


def main() -> None:
    record = RunRecord.start(__file__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--finished", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--api-only", action="store_true", help="measure the API calls only (no browser)")
    add_result_options(parser)
    args = parser.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="agentbolt-dashboard-bench-") as work:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        store = subprocess.Popen(
            [sys.executable, "-m", "agentbolt", "store", "--path", str(Path(work) / "store.db"), "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/v1/agl/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            seeding_started = time.perf_counter()
            with ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, _seed(url, args.rollouts, args.finished)).result()
            seed_seconds = time.perf_counter() - seeding_started
            api = _api_timings(url, args.rollouts, args.repeats)
            browser = {} if args.api_only else _browser_timings(url, args.repeats)
        finally:
            store.terminate()
            store.wait(timeout=30)
    record.finish(
        {
            "rollouts": args.rollouts,
            "finished_with_reward": args.finished,
            "repeats": args.repeats,
            "seed_seconds": round(seed_seconds, 1),
            **api,
            **browser,
        },
        args,
    )


if __name__ == "__main__":
    main()
