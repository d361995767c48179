"""The dashboard shipped in the package is the build of the sources in dashboard/ (``make dashboard``)."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest
from support.servers import REPO

from agentbolt.store.dashboard import DASHBOARD_DIR


@pytest.mark.slow
def test_a_fresh_build_of_the_sources_equals_the_committed_one(tmp_path: Path) -> None:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("Node.js and npm are not installed (apt-get install nodejs npm)")
    source = tmp_path / "dashboard"
    shutil.copytree(REPO / "dashboard", source, ignore=shutil.ignore_patterns("node_modules"))
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=source, check=True, capture_output=True, timeout=600)
    subprocess.run(["npm", "run", "typecheck"], cwd=source, check=True, capture_output=True, timeout=600)
    out = tmp_path / "built"
    subprocess.run(["node", "build.mjs", "--out", str(out)], cwd=source, check=True, capture_output=True, timeout=600)

    comparison = filecmp.dircmp(out, DASHBOARD_DIR)
    assert not comparison.left_only and not comparison.right_only, (comparison.left_only, comparison.right_only)
    assert not comparison.diff_files
    assets = filecmp.dircmp(out / "assets", DASHBOARD_DIR / "assets")
    assert not assets.left_only and not assets.right_only and not assets.diff_files
