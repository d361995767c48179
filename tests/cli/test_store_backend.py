"""``agentbolt store --backend``: the choices it shows are the backends that exist.

``mongo`` (the reference's backend) is refused with a message naming the backends that exist, but neither ``--help``
nor the error about an unknown value offers it as a choice. The installed console script runs as a subprocess; the
other checks run the same entry point in process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from agentbolt.cli import main

AGENTBOLT = Path(sys.executable).with_name("agentbolt")
BACKENDS = ("sqlite", "memory", "postgres")


def _run(args: List[str]) -> subprocess.CompletedProcess[str]:
    if not AGENTBOLT.exists():
        pytest.fail(f"the agentbolt console script is not installed beside {sys.executable}: reinstall the package")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([str(AGENTBOLT), *args], env=env, capture_output=True, text=True, timeout=120)


def test_help_lists_the_backends_that_exist_and_not_mongo() -> None:
    result = _run(["store", "--help"])
    assert result.returncode == 0, result.stderr
    assert "<sqlite|memory|postgres>" in result.stdout
    assert "mongo" not in result.stdout.lower()


def test_an_unknown_backend_lists_the_backends_that_exist_and_not_mongo() -> None:
    result = _run(["store", "--backend", "foo"])
    assert result.returncode == 2
    err = result.stderr.strip()
    assert err.startswith("agentbolt: error:") and "--backend" in err and "'foo'" in err, err
    assert all(f"'{name}'" in err for name in BACKENDS), err
    assert "mongo" not in err.lower()
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("value", ["mongo", "MONGO"])
def test_mongo_is_still_refused_with_the_backends_that_exist(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "--backend", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("agentbolt: error: MongoDB is not a store backend of agentbolt"), err
    assert all(f"--backend {name}" in err for name in BACKENDS)
    assert len(err.splitlines()) == 1, err


def test_backends_are_still_read_in_any_case(capsys: pytest.CaptureFixture[str]) -> None:
    # Parsed as the memory backend: refused only for what memory cannot do.
    assert main(["store", "--backend", "Memory", "--workers", "2"]) == 2
    assert "--workers > 1 needs a store shared between processes" in capsys.readouterr().err
