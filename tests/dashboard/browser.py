"""Playwright on Debian's chromium for the dashboard tests: finding the browser, launching it for this network."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Optional, Tuple, TypeVar

import pytest
from support.servers import free_port, start_store_process, wait_healthy

T = TypeVar("T")

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


@contextlib.contextmanager
def seeded_store_process(path: Path, seed: Callable[[str], Awaitable[T]]) -> Iterator[Tuple[str, T]]:
    """An ``agentbolt store`` over the SQLite file ``path``, seeded by ``seed(url)``: its URL and what ``seed`` returned.

    Skips the test when the browser tests cannot run here (nothing is started then).
    """
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    port = free_port()
    process = start_store_process(path, port, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/v1/agl/health", process)
        # The browser's event loop runs in this thread: seed from another one.
        with ThreadPoolExecutor(1) as pool:
            seeded = pool.submit(asyncio.run, seed(url)).result()  # type: ignore[arg-type]
        yield url, seeded
    finally:
        process.terminate()
        process.wait(timeout=30)
