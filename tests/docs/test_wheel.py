"""A wheel built from the repository holds the package and its data files, and works installed on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_holds_the_package_data_and_imports(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    [wheel] = tmp_path.glob("agentbolt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "agentbolt"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    data_files = [name for name in tracked if not name.endswith(".py")]
    assert data_files, "the package has data files (py.typed, the kernels' C++ source)"
    assert [name for name in data_files if name not in names] == []
    assert not any(name.startswith(("tests/", "examples/", "benchmarks/", "docs/")) for name in names)

    target = tmp_path / "installed"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import agentbolt, pathlib; "
            "root = pathlib.Path(agentbolt.__file__).parent; "
            "assert (root / 'serving' / 'csrc' / 'decode_kernels.cpp').is_file(); print(root)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr[-4000:]
    assert check.stdout.strip().startswith(str(target))
