"""The ``agentbolt`` command line."""

from __future__ import annotations

import sys
from typing import Iterable, Optional


def main(argv: Optional[Iterable[str]] = None) -> int:
    """Entry point of the ``agentbolt`` console script."""
    from agentbolt.cli.app import run

    return run(list(argv) if argv is not None else sys.argv[1:])
