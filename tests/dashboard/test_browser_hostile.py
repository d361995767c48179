"""The dashboard against what it must survive: span attribute keys an agent chose to reach the page's own objects, an
attempt of thousands of spans, an address that is not valid, and answers the page cannot read."""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator

import pytest

from agentbolt.store.client_server import LightningStoreClient

from .browser import seeded_store_process
from .conftest import browser_tab
from .seeding import reward_span

pytestmark = pytest.mark.browser

LONG_TRACE = 2_500
"""Spans of the long attempt, before its reward span: more than two of the pages the trace view reads at a time."""
POLLUTING_KEY = "gen_ai.completion.__proto__.dangerouslySetInnerHTML.__html"


async def _seed(url: str) -> Dict[str, str]:
    client = LightningStoreClient(url)
    try:
        hostile = await client.start_rollout(input="hostile keys", worker_id="Worker-0")
        rollout_id, attempt_id = hostile.rollout_id, hostile.attempt.attempt_id
        call = reward_span(rollout_id, attempt_id, 1, 0.5).model_copy(
            update={
                "name": "llm call",
                "attributes": {
                    POLLUTING_KEY: '<img src=x onerror="window.__pwned = 3">',
                    "gen_ai.prompt.0.role": "user",
                    "gen_ai.prompt.0.content": "hello from the agent",
                },
            }
        )
        # Two spans each the parent of the other: no root leads to them.
        cycle = [
            reward_span(rollout_id, attempt_id, 2 + i, 0.0).model_copy(
                update={
                    "name": f"cycle {me}",
                    "span_id": f"cycle-{me}",
                    "parent_id": f"cycle-{other}",
                    "attributes": {},
                }
            )
            for i, (me, other) in enumerate((("a", "b"), ("b", "a")))
        ]
        await client.add_many_spans([call, *cycle])
        await client.update_attempt(rollout_id, attempt_id, status="succeeded")

        long = await client.start_rollout(input="long trace", worker_id="Worker-0")
        long_id, long_attempt = long.rollout_id, long.attempt.attempt_id
        step = reward_span(long_id, long_attempt, 1, 0.0)
        spans = [
            step.model_copy(
                update={"sequence_id": i + 1, "span_id": f"step-{i}", "name": f"step {i}", "attributes": {}}
            )
            for i in range(LONG_TRACE)
        ]
        final = reward_span(long_id, long_attempt, LONG_TRACE + 1, 0.75).model_copy(update={"span_id": "final-reward"})
        await client.add_many_spans([*spans, final])
        await client.update_attempt(long_id, long_attempt, status="succeeded")
        return {"hostile": rollout_id, "long": long_id}
    finally:
        await client.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, str]]:
    with seeded_store_process(tmp_path_factory.mktemp("hostile") / "store.db", _seed) as (url, ids):
        yield {"url": url, **ids}


def test_span_attribute_keys_cannot_reach_the_objects_of_the_page(page: Any, store: Dict[str, str]) -> None:
    # A key such as "gen_ai.completion.__proto__.x" once wrote into Object.prototype while the page read the messages of
    # an LLM call: every object of the page then carried the value, which blanked the trace and froze navigation.
    page.goto(f"{store['url']}/rollouts/{store['hostile']}")
    tree = page.get_by_role("tree", name="span tree")
    tree.get_by_role("treeitem").nth(2).wait_for()
    assert page.evaluate("Object.prototype.hasOwnProperty('dangerouslySetInnerHTML')") is False
    names = tree.locator(".span-name").all_inner_texts()
    assert sorted(n.strip() for n in names) == ["cycle a", "cycle b", "llm call"]  # the cycle is listed too
    tree.locator(".span-name", has_text="llm call").click()
    details = page.locator(".span-details")
    details.get_by_role("heading", name="LLM call", exact=True).wait_for()
    assert "hello from the agent" in details.locator(".message.role-user").inner_text()
    details.get_by_text(re.compile(r"^All attributes")).click()
    assert POLLUTING_KEY in details.get_by_role("table", name="attributes").inner_text()  # shown as it was written
    page.get_by_role("navigation", name="main").get_by_role("link", name="Workers").click()
    page.get_by_role("heading", name="Workers").wait_for()
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_a_long_trace_is_read_a_thousand_spans_at_a_time(page: Any, store: Dict[str, str]) -> None:
    searches: list = []
    page.on("request", lambda r: searches.append(r.post_data_json) if r.url.endswith("/spans/search") else None)
    page.goto(f"{store['url']}/rollouts/{store['long']}")
    rows = page.get_by_role("tree", name="span tree").get_by_role("treeitem")
    rows.first.wait_for()
    assert rows.count() == 1000
    more = page.locator(".more-spans")
    assert more.inner_text().startswith(f"The first 1,000 of {LONG_TRACE + 1:,} spans")
    # The final reward is the last span, past the ones read for the tree: it is read on its own.
    assert page.locator("strong.reward").inner_text() == "0.750"
    assert all(s.get("limit") == 1000 or s.get("name") == "agentlightning.annotation" for s in searches), searches
    more.get_by_role("button", name="show 1,000 more").click()
    page.wait_for_function("document.querySelectorAll('[role=treeitem]').length === 2000")
    # A link to a span past those read shows it all the same.
    page.goto(f"{store['url']}/rollouts/{store['long']}?span=final-reward")
    details = page.locator(".span-details")
    details.get_by_role("table", name="rewards").wait_for()
    assert "0.7500" in details.get_by_role("table", name="rewards").inner_text()
    page.goto(f"{store['url']}/rollouts/{store['long']}?span=no-such-span")
    page.get_by_text("This attempt has no span").wait_for()


def test_addresses_and_answers_the_page_cannot_use_leave_the_app_working(page: Any, store: Dict[str, str]) -> None:
    url = store["url"]
    page.goto(url + "/rollouts/%E0%A4%A")  # not valid percent-encoding
    page.get_by_role("heading", name="Page not found").wait_for()

    page.goto(url + "/rollouts?offset=500")
    page.get_by_role("button", name="Go to the last page").click()
    page.wait_for_url(re.compile(r"offset=0$"))
    page.locator("table.rollouts tbody tr").first.wait_for()

    # What a login wall or a misdirected proxy answers: a page, not the store's JSON.
    page.route(
        "**/v1/agl/dashboard/workers", lambda route: route.fulfill(content_type="text/html", body="<h1>Sign in</h1>")
    )
    page.goto(url + "/workers")
    banner = page.locator(".banner").filter(has_text="not JSON")
    banner.wait_for()
    assert "Sign in" not in page.locator("main").inner_text()

    # JSON the page cannot read: that page says so, and the rest of the app keeps working.
    page.route(
        re.compile(r".*/v1/agl/dashboard/rollouts\?.*"),
        lambda route: route.fulfill(content_type="application/json", body='{"items": null, "total": 1, "limit": 50}'),
    )
    page.goto(url + "/rollouts")
    page.get_by_role("heading", name="This page could not be shown").wait_for()
    page.get_by_role("navigation", name="main").get_by_role("link", name="Settings").click()
    page.get_by_role("heading", name="Settings").wait_for()


@pytest.fixture
def enforcing(browser: Any) -> Iterator[Any]:
    """A tab that applies the pages' Content-Security-Policy (the ``page`` fixture bypasses it)."""
    with browser_tab(browser, bypass_csp=False) as tab:
        yield tab


def test_every_page_works_under_its_content_security_policy(enforcing: Any, store: Dict[str, str]) -> None:
    # The policy lets only the app's own files run: the app itself must need nothing more.
    page = enforcing
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective))"
    )
    url = store["url"]
    page.goto(f"{url}/rollouts/{store['hostile']}")
    page.get_by_role("tree", name="span tree").locator(".span-name", has_text="llm call").click()
    page.locator(".span-details").get_by_role("heading", name="LLM call", exact=True).wait_for()
    page.locator(".timeline-bar").first.wait_for()
    nav = page.get_by_role("navigation", name="main")
    for name in ("Rollouts", "Resources", "Workers", "Training", "Settings"):
        nav.get_by_role("link", name=name).click()
        page.get_by_role("heading", name=name, exact=True).first.wait_for()
    page.get_by_label("Theme").select_option("dark")
    assert page.evaluate("window.__violations") == []
