"""`import agentbolt` stays light and exposes the compatible top-level names."""

from __future__ import annotations

import subprocess
import sys

import agentbolt

HEAVY_MODULES = ["torch", "transformers", "peft", "openai", "litellm", "fastapi", "uvicorn", "aiohttp", "httpx"]


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_import_agentbolt_pulls_no_heavy_dependency() -> None:
    loaded = _modules_after("import agentbolt")
    assert not loaded & set(HEAVY_MODULES)


def test_types_and_store_interfaces_pull_no_heavy_dependency() -> None:
    loaded = _modules_after("import agentbolt.types, agentbolt.store.base; from agentbolt import Rollout, Span")
    assert not loaded & set(HEAVY_MODULES)


def test_version_and_unknown_name() -> None:
    assert agentbolt.__version__ == "0.3.1"
    try:
        agentbolt.DoesNotExist  # noqa: B018
    except AttributeError as exc:
        assert "DoesNotExist" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("unknown attribute must raise AttributeError")


def test_exported_types_resolve() -> None:
    from agentbolt.types import Rollout, RolloutConfig

    assert agentbolt.Rollout is Rollout
    assert agentbolt.RolloutConfig is RolloutConfig
    assert "Rollout" in dir(agentbolt)
