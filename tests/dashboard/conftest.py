"""Fixtures of the browser tests: a real ``agentbolt store`` seeded by a real short GRPO run, and headless chromium."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from support.servers import REPO, free_port, start_store_process, wait_healthy

from .browser import launch, skip_reason


@pytest.fixture(scope="session")
def seeded_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an ``agentbolt store`` (SQLite) holding a short GRPO run and the extras of ``seed_run.py``."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("dashboard")
    port = free_port()
    process = start_store_process(work / "store.db", port, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/v1/agl/health", process)
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("AGENTBOLT_METRICS", None)
        seeding = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("seed_run.py")), url, str(work)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert seeding.returncode == 0, seeding.stderr[-4000:]
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module. Playwright's sync API runs an event loop in this thread while it is open, so it
    is closed after each module: the asyncio tests of other modules need the thread free of a running loop."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = launch(playwright)
        try:
            yield instance
        finally:
            instance.close()


@contextlib.contextmanager
def browser_tab(browser: Any, *, bypass_csp: bool) -> Iterator[Any]:
    """A tab in a context of its own (closed on the way out), 1400 x 900, with a 15 s default timeout."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=bypass_csp)
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A tab that ignores the pages' Content-Security-Policy: Playwright's ``wait_for_function`` evaluates a string,
    which the policy refuses. The payload tests then show that the page itself renders markup as text; the policy,
    the second line, is checked on its own (``test_every_page_works_under_its_content_security_policy``)."""
    with browser_tab(browser, bypass_csp=True) as tab:
        yield tab
