"""The custom APO algorithm's results reach the console once the example has set up logging.

In a child interpreter: pytest installs its own logging handlers, which would hide a logger without one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (
    "from examples.apo.apo_custom_algorithm import logger, setup_logging\n"
    "setup_logging()\n"
    "logger.info('Best: candidate %d (%.3f).', 1, 0.5)\n"
)


def test_the_algorithms_results_are_shown_after_setup_logging() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Best: candidate 1 (0.500)." in done.stdout + done.stderr
