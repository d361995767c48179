"""Suite-wide setup: compile the serving engine's decoding kernels before the first test.

Building them takes about half a minute once per machine (later runs load the cached library). Doing it here keeps
that time out of whichever test happens to start the first inference engine.
"""

from __future__ import annotations

import importlib.util
import logging
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest_plugins = ["support.models"]

# The tests send SIGINT to the processes they start, as Ctrl-C would. A suite started as a background job of a
# non-interactive shell inherits SIGINT ignored, and an ignored signal stays ignored across exec, so those children
# would never see it. A handler set here is reset to the default in every child instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session: pytest.Session) -> None:
    if importlib.util.find_spec("torch") is None:
        return
    from agentbolt.serving.decode_kernels import load_decode_kernels

    load_decode_kernels()


@pytest.fixture(autouse=True)
def _results_outside_the_repository(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Benchmarks run by tests write their result files to a temporary folder, never to benchmarks/results/."""
    monkeypatch.setenv("AGENTBOLT_RESULTS_DIR", str(tmp_path_factory.mktemp("results", numbered=True)))


@pytest.fixture(autouse=True)
def _library_logging_restored() -> Iterator[None]:
    """A command line run in process configures the ``agentbolt`` logger (its handler writes to the console of that
    test); later tests must find it as it was, or their console output holds its log lines."""
    logger = logging.getLogger("agentbolt")
    saved = (logger.level, list(logger.handlers), logger.propagate, logger.disabled)
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate, logger.disabled = saved[2], saved[3]


@pytest.fixture
def file_in_the_way(tmp_path: Path) -> Path:
    """A plain file, for options that name a directory to create: nothing can be created below it."""
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


@pytest.fixture
def store_server_process(tmp_path: Path) -> Iterator[Any]:
    """An ``agentbolt store`` server process on a SQLite file in ``tmp_path``, stopped after the test."""
    from support.servers import StoreServerProcess

    server = StoreServerProcess(tmp_path / "store.db")
    server.start()
    try:
        yield server
    finally:
        server.stop()
