"""The documentation site builds with ``mkdocs build --strict``: no broken link, no reference to a missing object,
no object of the API reference without a docstring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    site = tmp_path / "site"
    for page in ("index.html", "tutorial/index.html", "reference/trainer/index.html", "examples/index.html"):
        assert (site / page).is_file(), page
    assert "Trainer" in (site / "reference" / "trainer" / "index.html").read_text()
