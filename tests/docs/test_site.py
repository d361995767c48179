"""The documentation site builds with ``mkdocs build --strict``: no broken link, no link to a missing anchor, no
reference to a missing object, no object of the API reference without a docstring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


def _strict_config(tmp_path: Path) -> Path:
    """mkdocs.yml, with a link to a heading that does not exist made a warning too (MkDocs only logs it by
    default), written where ``mkdocs build -f`` reads it; relative paths are made absolute."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["docs_dir"] = str(REPO / config.get("docs_dir", "docs"))
    config["hooks"] = [str(REPO / hook) for hook in config.get("hooks", [])]
    for plugin in config.get("plugins", []):
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            python = plugin["mkdocstrings"]["handlers"]["python"]
            python["paths"] = [str(REPO / path) for path in python.get("paths", ["."])]
    config["validation"] = {**config.get("validation", {}), "anchors": "warn"}
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(_strict_config(tmp_path)),
            "--site-dir",
            str(tmp_path / "site"),
        ],
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
