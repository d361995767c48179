"""agentbolt: train AI agents from the traces of their LLM calls.

``import agentbolt as agl`` exposes the top-level names of Agent Lightning v0.3, plus ``GRPO``, ``SFT``,
``ParetoAPO``, ``FewShotAPO`` and ``SqliteLightningStore``. Each name is imported on first access, so ``import agentbolt``
stays fast and pulls in no heavy dependency. The names and the modules they come from are listed once, in the type
stub ``__init__.pyi`` beside this file: type checkers and IDEs read it as ordinary imports, and the lazy loader reads
it on first access.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

from agentbolt.utils.lazy import LazyExports

__version__ = "0.3.1"

_LAZY = LazyExports(__name__, Path(__file__).with_suffix(".pyi"))


def __getattr__(name: str) -> Any:
    """Import an exported name on first access; ``__all__`` is built on first access too."""
    if name == "__all__":
        globals()["__all__"] = names = ["__version__", *_LAZY.names()]
        return names
    return _LAZY.load(name)


def __dir__() -> List[str]:
    return _LAZY.dir()
