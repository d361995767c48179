"""The vLLM stand-in (``tests/support/vllm_stand_in``) started like vLLM: through ``agentbolt vllm serve``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

from support.servers import REPO

STAND_IN_PATH = Path(__file__).resolve().parent / "vllm_stand_in"
"""Directory holding the stand-in ``vllm`` package."""


def stand_in_env(**extra: str) -> Dict[str, str]:
    """Environment for a process that should import the stand-in as ``vllm`` (and agentbolt from the repo)."""
    path = os.pathsep.join([str(STAND_IN_PATH), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, **extra}


def stand_in_server(**kwargs: Any) -> Any:
    """A :class:`~agentbolt.serving.vllm.VllmServer` that runs the stand-in through the real ``agentbolt vllm``."""
    from agentbolt.serving.vllm import VllmServer

    options: Dict[str, Any] = {"served_name": "policy", "startup_timeout": 60.0, "stop_timeout": 10.0}
    options.update(kwargs)
    options["env"] = {**stand_in_env(), **options.get("env", {})}
    return VllmServer("stand-in/model", **options)
