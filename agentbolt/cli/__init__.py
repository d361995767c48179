"""The ``agentbolt`` command line, also installed as ``agl`` (the reference's name for it)."""

from __future__ import annotations

import sys
from typing import Iterable, Optional


def main(argv: Optional[Iterable[str]] = None) -> int:
    """Entry point of the ``agentbolt`` console script."""
    from agentbolt.cli.app import run

    return run(list(argv) if argv is not None else sys.argv[1:])


def agl_main(argv: Optional[Iterable[str]] = None) -> int:
    """Entry point of the ``agl`` console script: the ``agentbolt`` commands under the reference's command name.

    ``agl store``, ``agl prometheus`` and ``agl vllm`` are ``agentbolt store``, ``agentbolt prometheus`` and
    ``agentbolt vllm``: one implementation, so scripts written for the reference run unchanged.
    """
    from agentbolt.cli.app import run

    return run(list(argv) if argv is not None else sys.argv[1:], prog_name="agl")
