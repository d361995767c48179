"""Times and attempts on the pages: ages and running durations by the store's clock whatever the browser's, absolute
times with their zone, a running attempt's duration, an attempt's metadata and pending retry, and the least refresh
interval of live updates."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Dict, Iterator
from zoneinfo import ZoneInfo

import httpx
import pytest

from agentbolt.store.client_server import LightningStoreClient
from agentbolt.types import RolloutConfig

from .browser import seeded_store_process

pytestmark = pytest.mark.browser

LONG_ERROR = "x" * 5_000
"""The metadata of the failed attempt: longer than a table cell should ever show at once."""


async def _seed(url: str) -> Dict[str, str]:
    client = LightningStoreClient(url)
    try:
        running = await client.start_rollout(input="still running", worker_id="Worker-0")
        attempt = running.attempt
        # Its one heartbeat came when it started: its duration so far is not up to that heartbeat.
        await client.update_attempt(
            running.rollout_id, attempt.attempt_id, status="running", last_heartbeat_time=attempt.start_time
        )
        retried = await client.start_rollout(
            input="to be retried",
            worker_id="Worker-1",
            config=RolloutConfig(max_attempts=3, retry_condition=["failed"]),
        )
        await client.update_attempt(
            retried.rollout_id, retried.attempt.attempt_id, status="failed", metadata={"error": LONG_ERROR}
        )
        return {"running": running.rollout_id, "retried": retried.rollout_id}
    finally:
        await client.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, str]]:
    with seeded_store_process(tmp_path_factory.mktemp("times") / "store.db", _seed) as (url, ids):
        yield {"url": url, **ids}


def _summary(url: str, rollout_id: str) -> Dict[str, Any]:
    items = httpx.get(url + "/v1/agl/dashboard/rollouts", params={"limit": 500}).json()["items"]
    return next(item for item in items if item["rollout_id"] == rollout_id)


def _seconds(text: str) -> float:
    """The seconds a duration or an age the page shows stands for ("850 ms", "12.3 s", "1 min 5 s", "just now")."""
    if text == "just now":
        return 0.0
    shown = re.match(r"^(?:(\d+) min (\d+) s|([\d.]+) (ms|s))\b", text)
    assert shown, f"not a duration: {text!r}"
    if shown.group(1):
        return int(shown.group(1)) * 60 + int(shown.group(2))
    return float(shown.group(3)) / (1000 if shown.group(4) == "ms" else 1)


def _least_shown(before: float, after: float) -> float:
    """The least duration the page may show for one the store put at ``before`` just before the page loaded and at
    ``after`` once it showed: the page knows the store's time to the second (the Date header of its answers), as of
    when an answer arrived, so it may be behind by a second plus the time that answer took, which lies between."""
    return before - 1 - (after - before)


def _cell(table: Any, row: Any, column: str) -> Any:
    headers = [text.rstrip(" ▲▼") for text in table.locator("thead th").all_inner_texts()]  # a sorted column's arrow
    index = headers.index(column)
    return row.locator("td").nth(index)


def test_ages_and_running_durations_follow_the_store_clock_not_the_browser(page: Any, store: Dict[str, str]) -> None:
    server_now = httpx.get(store["url"] + "/v1/agl/dashboard/workers").json()["now"]
    page.clock.install(time=server_now - 3600)  # the browser's clock an hour behind the store's
    before = _summary(store["url"], store["running"])["duration"]
    page.goto(f"{store['url']}/rollouts/{store['running']}")
    duration = page.get_by_role("table", name="rollout summary").locator("tr", has_text="Duration").locator("td")
    duration.filter(has_text="(running)").wait_for()
    attempts = page.get_by_role("table", name="attempts")
    heartbeat = _cell(attempts, attempts.locator("tbody tr").first, "Last heartbeat").inner_text()
    after = _summary(store["url"], store["running"])["duration"]
    least = _least_shown(before, after)
    assert least <= _seconds(duration.inner_text()) <= after + 1, duration.inner_text()
    assert least <= _seconds(heartbeat.removesuffix(" ago")) <= after + 1, heartbeat


def test_a_running_attempt_lasts_until_now_not_until_its_last_heartbeat(page: Any, store: Dict[str, str]) -> None:
    before = _summary(store["url"], store["running"])["duration"]
    page.goto(f"{store['url']}/rollouts/{store['running']}")
    attempts = page.get_by_role("table", name="attempts")
    row = attempts.locator("tbody tr").first
    row.wait_for()
    shown = _cell(attempts, row, "Duration").inner_text()
    after = _summary(store["url"], store["running"])["duration"]
    assert shown.endswith("(running)"), shown
    assert _least_shown(before, after) <= _seconds(shown) <= after + 1, shown


def test_times_are_shown_with_their_zone(browser: Any, store: Dict[str, str]) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True, timezone_id="Asia/Kolkata")
    try:
        page = context.new_page()
        page.set_default_timeout(15_000)
        start = _summary(store["url"], store["retried"])["start_time"]
        expected = datetime.fromtimestamp(start, ZoneInfo("Asia/Kolkata")).strftime("%Y-%m-%d %H:%M:%S") + " UTC+05:30"
        page.goto(store["url"] + "/rollouts?text=to%20be%20retried")
        table = page.get_by_role("table", name="rollouts")
        row = table.locator("tbody tr").first
        row.wait_for()
        assert _cell(table, row, "Started").inner_text() == expected
        assert page.get_by_label("Started after (UTC+05:30)").is_visible()
        assert re.search(r"updated \d\d:\d\d:\d\d UTC\+05:30", page.locator(".live").inner_text())
        page.goto(f"{store['url']}/rollouts/{store['retried']}")
        started = page.get_by_role("table", name="rollout summary").locator("tr", has_text="Started").locator("td")
        started.wait_for()
        assert started.inner_text() == expected
        attempts = page.get_by_role("table", name="attempts")
        assert _cell(attempts, attempts.locator("tbody tr").first, "Started").inner_text().endswith(" UTC+05:30")
    finally:
        context.close()


def test_an_attempt_outcome_is_a_preview_and_a_pending_retry_is_told(page: Any, store: Dict[str, str]) -> None:
    page.goto(f"{store['url']}/rollouts/{store['retried']}")
    attempts = page.get_by_role("table", name="attempts")
    row = attempts.locator("tbody tr").first
    row.wait_for()
    assert len(attempts.locator("tbody tr").all()) == 1, "the next attempt does not exist yet"
    outcome = _cell(attempts, row, "Outcome")
    assert "will be retried: the agent raised an error" in outcome.inner_text()
    assert len(outcome.inner_text()) < 1_000
    outcome.get_by_role("button", name="show all of the metadata of attempt 1").click()
    assert LONG_ERROR in outcome.inner_text()


COUNT_WORKER_REQUESTS = """
window.__workerRequests = 0;
const originalFetch = window.fetch;
window.fetch = (...args) => {
  if (String(args[0]).includes("dashboard/workers")) window.__workerRequests += 1;
  return originalFetch(...args);
};
"""


def test_the_refresh_interval_is_at_least_a_second(page: Any, store: Dict[str, str]) -> None:
    page.goto(store["url"] + "/settings")
    interval = page.get_by_label(re.compile("^Refresh every"))
    interval.fill("0.01")
    page.get_by_role("button", name="Save").click()
    page.get_by_text(re.compile("^Saved, refreshing every 1 s")).wait_for()
    assert interval.input_value() == "1"
    interval.fill("-5")
    page.get_by_role("button", name="Save").click()
    page.get_by_text(re.compile("^Not saved")).wait_for()
    page.reload()
    assert page.get_by_label(re.compile("^Refresh every")).input_value() == "1"

    # An interval stored before the limit existed is raised to it, both in Settings and where the pages poll.
    page.evaluate("localStorage.setItem('agentbolt.dashboard.settings', JSON.stringify({refreshSeconds: 0.01}))")
    page.reload()
    assert page.get_by_label(re.compile("^Refresh every")).input_value() == "1"
    page.add_init_script(COUNT_WORKER_REQUESTS)
    page.clock.install()
    page.goto(store["url"] + "/workers")
    page.get_by_role("table", name="workers").wait_for()
    page.clock.run_for(5_000)
    assert page.evaluate("window.__workerRequests") <= 6  # the first load, then one a second
