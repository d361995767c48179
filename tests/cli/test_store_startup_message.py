"""``agentbolt store`` says in one line where the data of the store it serves lives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from support.servers import free_port

AGENTBOLT = Path(sys.executable).with_name("agentbolt")


def _startup_lines(args: List[str]) -> List[str]:
    """The lines the store prints up to ``serving ...``; then the store is stopped."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    command = [str(AGENTBOLT), "store", "--host", "127.0.0.1", "--port", str(free_port()), *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: List[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if "agentbolt store: serving" in line:
                break
    finally:
        process.terminate()
        process.wait(timeout=60)
    return lines


def test_the_memory_backend_says_its_data_is_in_memory() -> None:
    lines = _startup_lines(["--backend", "memory"])
    assert "agentbolt store: data in memory (lost when the server stops)" in lines, lines


def test_the_sqlite_backend_names_its_file(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    assert f"agentbolt store: data in {db} (sqlite)" in _startup_lines(["--backend", "sqlite", "--path", str(db)])


@pytest.fixture(autouse=True)
def _needs_the_console_script() -> None:
    if not AGENTBOLT.exists():
        pytest.fail(f"the agentbolt console script is not installed beside {sys.executable}: reinstall the package")
