"""The dashboard in headless chromium against a real ``agentbolt store`` seeded by a real short GRPO run.

Each page is opened by its URL (so every view survives a reload), then used as a person would: filters, sorting,
the trace tree of an attempt, resource diffs, training curves, settings. The screenshots in docs/dashboard.md are
taken here: with ``AGENTBOLT_DOC_SCREENSHOTS=1`` (``make dashboard-screenshots``) they replace
``docs/images/dashboard-*.png``; otherwise they go to a temporary folder, so a test run never changes the checkout.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import httpx
import pytest
from support.servers import REPO

from .seeding import SCRIPT_PAYLOAD

pytestmark = pytest.mark.browser

SHOTS = (
    REPO / "docs" / "images"
    if os.environ.get("AGENTBOLT_DOC_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "agentbolt-dashboard-screenshots"
)
NO_VALUE = "\u2013"  # what the table shows for a missing value


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"dashboard-{name}.png"), full_page=False)


def _rollouts(url: str, **params: Any) -> List[Dict[str, Any]]:
    return httpx.get(url + "/v1/agl/dashboard/rollouts", params={"limit": 500, **params}).json()["items"]


def _rows(page: Any) -> Any:
    return page.locator("table.rollouts tbody tr")


def test_the_rollouts_page_shows_the_run(page: Any, seeded_store: str) -> None:
    page.goto(seeded_store + "/")
    page.wait_for_url(re.compile(r"/rollouts$"))
    page.get_by_role("heading", name="Rollouts").wait_for()
    _rows(page).first.wait_for()
    total = len(_rollouts(seeded_store))
    assert total > 20
    assert _rows(page).count() == min(total, 50)
    assert page.get_by_role("button", name=re.compile(r"^succeeded \(\d+\)")).is_visible()
    assert page.get_by_text(f"{total} rollouts").is_visible()
    _shot(page, "rollouts")


def test_filters_and_sorting_live_in_the_url_and_survive_a_reload(page: Any, seeded_store: str) -> None:
    page.goto(seeded_store + "/rollouts")
    _rows(page).first.wait_for()
    page.get_by_role("group", name="filter by status").get_by_role("button", name=re.compile(r"^failed")).click()
    page.wait_for_url(re.compile(r"status=failed"))
    expected = {r["rollout_id"] for r in _rollouts(seeded_store, status="failed")}
    page.wait_for_function(f"document.querySelectorAll('table.rollouts tbody tr').length === {len(expected)}")
    shown = set(_rows(page).evaluate_all("rows => rows.map(r => r.dataset.rolloutId)"))
    assert shown == expected

    page.goto(seeded_store + "/rollouts")
    page.get_by_label("Search input or id").fill("retry me")
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_url(re.compile(r"text=retry"))
    page.wait_for_function("document.querySelectorAll('table.rollouts tbody tr').length === 1")
    page.reload()
    _rows(page).first.wait_for()
    assert _rows(page).count() == 1 and "retry me" in _rows(page).first.inner_text()
    assert page.get_by_label("Search input or id").input_value() == "retry me"

    page.goto(seeded_store + "/rollouts?mode=val")
    page.wait_for_function("document.querySelectorAll('table.rollouts tbody tr').length > 0")
    modes = _rows(page).evaluate_all("rows => rows.map(r => r.children[2].textContent)")
    assert set(modes) == {"val"}

    page.goto(seeded_store + "/rollouts?sort=reward&order=desc&mode=train")
    _rows(page).first.wait_for()
    rewards = [
        float(x) for x in _rows(page).evaluate_all("rows => rows.map(r => r.children[4].textContent)") if x != NO_VALUE
    ]
    assert rewards == sorted(rewards, reverse=True)
    page.get_by_role("button", name=re.compile("^Reward")).click()
    page.wait_for_url(re.compile(r"order=asc"))


def test_a_rollout_page_shows_attempts_input_reward_and_the_trace_tree(page: Any, seeded_store: str) -> None:
    rollout = next(r for r in _rollouts(seeded_store, mode="train", status="succeeded") if r["reward"] is not None)
    page.goto(f"{seeded_store}/rollouts/{rollout['rollout_id']}")
    page.get_by_role("heading", name=re.compile("^Rollout")).wait_for()
    assert page.get_by_role("table", name="attempts").locator("tbody tr").count() == 1
    assert float(page.locator("strong.reward").inner_text()) == pytest.approx(rollout["reward"], abs=1e-3)
    assert (
        "ping" in page.locator("#input-title + pre").inner_text()
        or "pong" in page.locator("#input-title + pre").inner_text()
    )
    tree = page.get_by_role("tree", name="span tree")
    tree.get_by_role("treeitem").first.wait_for()
    names = tree.locator(".span-name").all_inner_texts()
    assert any("agentlightning.operation" in n for n in names)
    assert any("agentbolt.llm_call" in n for n in names)
    levels = tree.get_by_role("treeitem").evaluate_all("items => items.map(i => Number(i.getAttribute('aria-level')))")
    assert max(levels) >= 2, "the draft and final operations sit under the solve operation"
    # The gateway's record of an LLM call: messages, response, token counts, token ids and logprobs.
    tree.locator(".span-name", has_text="agentbolt.llm_call").first.click()
    page.wait_for_url(re.compile(r"span="))
    details = page.locator(".span-details")
    details.get_by_role("heading", name=re.compile("^LLM call")).wait_for()
    assert (
        details.locator(".message.role-user").first.inner_text().count("ping")
        + details.locator(".message.role-user").first.inner_text().count("pong")
        == 1
    )
    assert details.get_by_role("table", name="token counts").get_by_text("yes").count() >= 2
    details.get_by_text(re.compile(r"^Response token ids and logprobs")).click()
    assert details.locator(".logprob").count() >= 1
    _shot(page, "trace")
    # The selected span is part of the URL: a reload shows it again.
    page.reload()
    page.locator(".span-details").get_by_role("heading", name=re.compile("^LLM call")).wait_for()


def test_a_retried_rollout_shows_each_attempt_and_why_it_was_retried(page: Any, seeded_store: str) -> None:
    (retried,) = _rollouts(seeded_store, text="retry me")
    page.goto(f"{seeded_store}/rollouts/{retried['rollout_id']}")
    attempts = page.get_by_role("table", name="attempts").locator("tbody tr")
    attempts.nth(1).wait_for()
    assert attempts.count() == 2
    assert "retried as attempt 2: the agent raised an error" in attempts.first.inner_text()
    assert page.get_by_role("list", name="attempt timeline").get_by_role("listitem").count() == 2
    page.get_by_role("button", name=re.compile("^attempt 1, failed")).click()
    page.wait_for_url(re.compile(r"/attempts/"))
    page.locator("#trace-title", has_text="Trace of attempt 1").wait_for()


def test_html_and_scripts_in_agent_data_are_shown_as_text(page: Any, seeded_store: str) -> None:
    (rollout, *_) = [r for r in _rollouts(seeded_store, text="onerror") if r["mode"] == "val"]
    page.goto(f"{seeded_store}/rollouts/{rollout['rollout_id']}")
    page.get_by_role("heading", name="Input").wait_for()
    page.get_by_text("window.__pwned = 1", exact=False).first.wait_for()
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("main script, main img, main b").count() == 0
    assert SCRIPT_PAYLOAD.replace('"', '\\"') in page.locator("#input-title + pre").inner_text()
    page.goto(f"{seeded_store}/rollouts?text=onerror")
    _rows(page).first.wait_for()
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_a_huge_attribute_is_truncated_until_show_all(page: Any, seeded_store: str) -> None:
    (huge,) = _rollouts(seeded_store, text="huge")
    page.goto(f"{seeded_store}/rollouts/{huge['rollout_id']}")
    page.locator(".span-name").first.click()
    details = page.locator(".span-details")
    details.get_by_text(re.compile(r"more characters")).first.wait_for()
    cell = details.locator("table.attributes tr", has_text="agent.output").locator("pre")
    assert len(cell.inner_text()) < 5000
    cell.get_by_role("button", name="show all of agent.output").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('table.attributes pre')].some(p => p.textContent.length >= 2000000)"
    )


def test_unknown_ids_show_a_not_found_page(page: Any, seeded_store: str) -> None:
    page.goto(seeded_store + "/rollouts/ro-does-not-exist")
    page.get_by_role("heading", name="Rollout not found").wait_for()
    assert page.get_by_text("ro-does-not-exist").is_visible()
    page.goto(seeded_store + "/no/such/page")
    page.get_by_role("heading", name="Page not found").wait_for()
    page.goto(seeded_store + "/resources/rs-nope")
    page.get_by_role("heading", name="Resources not found").wait_for()


def test_resources_list_versions_and_diff_two_prompt_templates(page: Any, seeded_store: str) -> None:
    versions = httpx.get(seeded_store + "/v1/agl/resources", params={"sort_by": "update_time"}).json()["items"]
    templates = [v["resources_id"] for v in versions if "prompt" in v["resources"]]
    assert len(templates) == 2
    page.goto(f"{seeded_store}/resources?compare={templates[0]}&with={templates[1]}")
    diff = page.get_by_label("differences")
    diff.wait_for()
    assert diff.locator(".diff-add").count() >= 2 and diff.locator(".diff-remove").count() >= 1
    assert "Think first." in diff.locator(".diff-add").all_inner_texts()[-1] or any(
        "Think first." in t for t in diff.locator(".diff-add").all_inner_texts()
    )
    rows = page.get_by_role("table", name="resource versions").locator("tbody tr")
    assert rows.count() == len(versions)
    llm_version = next(v for v in versions if "prompt" not in v["resources"])
    page.goto(f"{seeded_store}/resources/{llm_version['resources_id']}")
    page.get_by_role("heading", name=re.compile(llm_version["resources_id"])).wait_for()
    assert page.get_by_text("word-llama").first.is_visible()
    page.goto(f"{seeded_store}/resources?compare={templates[0]}&with={templates[1]}")
    page.get_by_label("differences").wait_for()
    _shot(page, "resources")


def test_resource_scores_are_shown_per_purpose_as_the_prompt_optimizer_scores(page: Any, seeded_store: str) -> None:
    # The seeded candidate's full-validation rollouts: 0.25, NaN, 1.0, and 0.5 from a rollout that then failed.
    (scored, *_) = _rollouts(seeded_store, text="scored a")
    page.goto(seeded_store + "/resources")
    row = page.get_by_role("table", name="resource versions").locator("tbody tr", has_text=scored["resources_id"])
    row.wait_for()
    score = row.locator("ul.scores li", has_text="val-full")
    score.wait_for()
    assert score.inner_text() == "val-full 0.313 over 4 rollouts"
    assert page.get_by_text("unrewarded rollouts and NaN or infinite rewards count 0").is_visible()


def test_a_nan_reward_is_shown_as_it_was_emitted(page: Any, seeded_store: str) -> None:
    (rollout,) = _rollouts(seeded_store, text="nan reward")
    assert rollout["reward"] == "NaN"
    page.goto(seeded_store + "/rollouts?text=nan+reward")
    _rows(page).first.wait_for()
    assert _rows(page).first.locator("td").nth(4).inner_text() == "NaN"
    page.goto(f"{seeded_store}/rollouts/{rollout['rollout_id']}")
    page.locator("strong.reward").wait_for()
    assert page.locator("strong.reward").inner_text() == "NaN"
    tree = page.get_by_role("tree", name="span tree")
    assert tree.locator(".reward-badge").inner_text() == "reward NaN"


def test_invalid_parameters_of_a_shared_link_are_left_out_with_a_notice(page: Any, seeded_store: str) -> None:
    failed = _rollouts(seeded_store, status="failed")
    page.goto(seeded_store + "/rollouts?offset=-5&sort=bogus&order=sideways&status=weird&status=failed&size=7")
    page.wait_for_url(re.compile(r"/rollouts\?status=failed$"))
    page.wait_for_function(f"document.querySelectorAll('table.rollouts tbody tr').length === {len(failed)}")
    notice = page.get_by_role("status", name="parameters left out")
    left_out = notice.locator("code").all_inner_texts()
    assert sorted(left_out) == ["offset=-5", "order=sideways", "size=7", "sort=bogus", "status=weird"]
    assert "Input should be 'queuing'" in notice.inner_text()  # the store's own reason, naming the valid values
    assert page.get_by_text("Could not load the rollouts").count() == 0
    statuses = set(_rows(page).evaluate_all("rows => rows.map(r => r.children[1].textContent)"))
    assert statuses == {"failed"}
    notice.get_by_role("button", name="Dismiss").click()
    notice.wait_for(state="detached")


def test_workers_show_status_heartbeat_and_throughput(page: Any, seeded_store: str) -> None:
    page.goto(seeded_store + "/workers")
    table = page.get_by_role("table", name="workers")
    table.locator("tbody tr").first.wait_for()
    text = table.inner_text()
    assert "Worker-0" in text and "ago" in text
    row = table.locator("tbody tr", has_text="Worker-0")
    assert float(row.locator("td").nth(4).inner_text()) > 0
    _shot(page, "workers")


def test_training_curves_show_each_step_and_the_validation_points(page: Any, seeded_store: str) -> None:
    records = httpx.get(seeded_store + "/v1/agl/metrics").json()["items"]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    page.goto(seeded_store + "/training")
    reward = page.locator("figure.chart", has_text="Reward")
    reward.locator("svg path").first.wait_for()
    assert reward.locator("circle").count() >= 3 + 4  # train points and validation markers
    accuracy = page.locator("figure.chart", has_text="Validation accuracy")
    assert accuracy.locator("circle").count() == 4
    for title, keys in (
        ("Loss", ["update/loss", "update/pg_loss"]),
        ("KL to the reference", ["update/kl"]),
        ("Entropy", ["update/entropy"]),
    ):
        points = sum(1 for r in records for k in keys if r["values"].get(k) is not None)
        assert points > 0 and page.locator("figure.chart", has_text=title).locator("circle").count() == points
    assert page.get_by_label("Run").input_value().startswith("grpo-dashboard-run-")  # log_dir name, time, 4 hex
    _shot(page, "training")


def test_settings_change_the_theme_and_the_refresh_interval(page: Any, seeded_store: str) -> None:
    page.goto(seeded_store + "/settings")
    page.get_by_label("Theme").select_option("dark")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.get_by_label(re.compile("^Refresh every")).fill("7")
    page.get_by_role("button", name="Save").click()
    page.reload()
    assert page.get_by_label(re.compile("^Refresh every")).input_value() == "7"
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.get_by_role("button", name="Test connection").click()
    page.get_by_text(re.compile("^Connected to")).wait_for()
    page.goto(seeded_store + "/rollouts")
    _rows(page).first.wait_for()
    _shot(page, "rollouts-dark")


def test_new_rollouts_appear_without_a_reload(page: Any, seeded_store: str) -> None:
    page.goto(seeded_store + "/settings")
    page.evaluate("localStorage.setItem('agentbolt.dashboard.settings', JSON.stringify({refreshSeconds: 1}))")
    page.goto(seeded_store + "/rollouts?text=live-update-marker")
    page.get_by_text("No rollout matches.").wait_for()
    httpx.post(
        seeded_store + "/v1/agl/queues/rollouts/enqueue",
        json={"rollouts": [{"input": "live-update-marker", "mode": "test"}]},
    ).raise_for_status()
    _rows(page).first.wait_for(timeout=10_000)
    assert "live-update-marker" in _rows(page).first.inner_text()
    assert "queuing" in _rows(page).first.inner_text()


def test_pages_pass_an_accessibility_smoke_check(page: Any, seeded_store: str) -> None:
    axe_playwright = pytest.importorskip("axe_playwright_python.sync_playwright")
    axe = axe_playwright.Axe()
    rollout = _rollouts(seeded_store, mode="train", status="succeeded")[0]["rollout_id"]
    problems: Dict[str, List[str]] = {}
    for path, ready in [
        ("/rollouts", "table.rollouts tbody tr"),
        (f"/rollouts/{rollout}", "[role=treeitem]"),
        ("/resources", "table tbody tr"),
        ("/workers", "table tbody tr"),
        ("/training", "figure.chart svg"),
        ("/settings", "form"),
    ]:
        page.goto(seeded_store + path)
        page.locator(ready).first.wait_for()
        results = axe.run(page)
        serious = [
            f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:5]}"
            for v in results.response["violations"]
            if v["impact"] in ("serious", "critical")
        ]
        if serious:
            problems[path] = serious
    assert not problems, problems
