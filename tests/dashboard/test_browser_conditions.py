"""The dashboard under harder conditions: a store requiring an API key, a store that goes away, a reverse proxy
serving it under a path prefix, and a store of 10,000 rollouts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List

import httpx
import pytest
from support.servers import REPO, free_port, wait_healthy

from agentbolt.store.client_server import LightningStoreClient
from agentbolt.types import EnqueueRolloutRequest

from .browser import seeded_store_process

pytestmark = pytest.mark.browser

API_KEY = "dashboard-secret-key"


def _start_memory_store(port: int, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "agentbolt", "store", "--backend", "memory", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--log-level", "WARNING", *extra], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_healthy(f"http://127.0.0.1:{port}/v1/agl/health", process)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def fast_refresh(page: Any) -> Any:
    """The page with live updates every second."""
    page.add_init_script("localStorage.setItem('agentbolt.dashboard.settings', JSON.stringify({refreshSeconds: 1}))")
    return page


def test_a_store_with_an_api_key_asks_for_it_and_never_puts_it_in_a_url(page: Any) -> None:
    port = free_port()
    store = _start_memory_store(port, "--api-key", API_KEY)
    try:
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {API_KEY}"}
        httpx.post(
            url + "/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": "behind a key"}]}, headers=headers
        ).raise_for_status()
        requested: List[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.goto(url + "/rollouts")
        dialog = page.get_by_role("dialog", name="This store needs an API key")
        dialog.wait_for()
        dialog.get_by_label("API key").fill("wrong-key")
        dialog.get_by_role("button", name="Use this key").click()
        dialog.wait_for()  # refused again: the prompt comes back
        dialog.get_by_label("API key").fill(API_KEY)
        dialog.get_by_role("button", name="Use this key").click()
        page.locator("table.rollouts tbody tr").first.wait_for()
        assert "behind a key" in page.locator("table.rollouts").inner_text()
        page.reload()  # the key lasts for the browser session
        page.locator("table.rollouts tbody tr").first.wait_for()
        assert not any(API_KEY in u or "wrong-key" in u for u in [*requested, page.url])
    finally:
        _stop(store)


def test_a_store_that_goes_away_shows_a_banner_and_comes_back_on_retry(fast_refresh: Any) -> None:
    page = fast_refresh
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = _start_memory_store(port)
    try:
        httpx.post(url + "/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": "first"}]}).raise_for_status()
        page.goto(url + "/rollouts")
        page.locator("table.rollouts tbody tr").first.wait_for()
        _stop(store)
        banner = page.get_by_role("alert").filter(has_text="Cannot reach the store")
        banner.wait_for()
        assert "Retrying in" in banner.inner_text()
        assert banner.get_by_role("button", name="Retry now").is_visible()
        banner.get_by_role("button", name="Retry now").click()  # still down: the banner stays
        assert banner.is_visible()
        assert page.locator("table.rollouts tbody tr").count() == 1, "the last data stays on the page"
        store = _start_memory_store(port)
        httpx.post(url + "/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": "second"}]}).raise_for_status()
        banner.wait_for(state="detached")  # the next retry reaches the new store
        page.get_by_text("second").wait_for()
    finally:
        _stop(store)


@pytest.fixture
def prefixed(seeded_store: str) -> Iterator[str]:
    """A reverse proxy serving the seeded store under ``/team/agentbolt/`` (prefix stripped, like nginx would)."""
    script = Path(__file__).with_name("prefix_proxy.py")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(script), seeded_store, str(port), "/team/agentbolt"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/team/agentbolt/v1/agl/health", process)
        yield f"http://127.0.0.1:{port}/team/agentbolt"
    finally:
        _stop(process)


def test_the_app_works_behind_a_path_prefix(page: Any, prefixed: str) -> None:
    page.goto(prefixed + "/rollouts?mode=train&status=succeeded")
    rows = page.locator("table.rollouts tbody tr")
    rows.first.wait_for()
    rows.first.get_by_role("link").first.click()
    page.wait_for_url(re.compile(r"/team/agentbolt/rollouts/ro-"))
    page.get_by_role("tree", name="span tree").get_by_role("treeitem").first.wait_for()
    page.reload()
    page.get_by_role("tree", name="span tree").get_by_role("treeitem").first.wait_for()
    page.get_by_role("navigation", name="main").get_by_role("link", name="Training").click()
    page.wait_for_url(prefixed + "/training")
    page.locator("figure.chart svg").first.wait_for()


LARGE = 10_000


async def _seed_large(url: str) -> None:
    client = LightningStoreClient(url)
    try:
        for batch in range(LARGE // 1000):
            requests = [
                EnqueueRolloutRequest(input={"task": f"task {batch * 1000 + i}"}, mode="train" if i % 4 else "val")
                for i in range(1000)
            ]
            await client.enqueue_many_rollouts(requests)
        for claimed in await client.dequeue_many_rollouts(limit=200, worker_id="Worker-0"):
            await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    finally:
        await client.close()


@pytest.fixture(scope="module")
def large_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with seeded_store_process(tmp_path_factory.mktemp("large") / "store.db", _seed_large) as (url, _):
        yield url


def test_ten_thousand_rollouts_are_paged_not_loaded_at_once(page: Any, large_store: str) -> None:
    sizes: List[int] = []
    page.on(
        "response",
        lambda response: sizes.append(len(response.body())) if "/v1/agl/dashboard/rollouts" in response.url else None,
    )
    page.goto(large_store + "/rollouts")
    rows = page.locator("table.rollouts tbody tr")
    rows.first.wait_for()
    assert rows.count() == 50
    page.get_by_text(f"{LARGE:,} rollouts").wait_for()
    assert page.get_by_role("button", name="succeeded (200)").is_visible()
    page.get_by_role("button", name="last page").click()
    page.wait_for_url(re.compile(r"offset=9950"))
    page.get_by_text("page 200 of 200").wait_for()
    assert rows.count() == 50
    page.get_by_role("button", name="previous page").click()
    page.get_by_text("page 199 of 200").wait_for()
    assert sizes and max(sizes) < 100_000, "each answer holds one page, not the whole store"
