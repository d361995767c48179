"""Playwright on Debian's chromium for the dashboard tests: finding the browser, launching it for this network."""

from __future__ import annotations

import shutil
from typing import Any, Optional

import pytest

LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> Optional[str]:
    """Debian's chromium (installed by ``make browser``), if present."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def skip_reason() -> Optional[str]:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install 'agentbolt[browser-tests]')"
    if chromium_path() is None:
        return "Debian's chromium is not installed (`make browser` installs it as root with apt-get)"
    return None


def launch(playwright: Any) -> Any:
    """A headless chromium browser."""
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=LAUNCH_ARGS)


requires_browser = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
