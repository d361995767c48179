"""Every name in ``agentbolt.__all__`` resolves at run time and is typed for type checkers.

``agentbolt/__init__.pyi`` lists the exported names once, as explicit re-exports: type checkers read it, and the lazy
loader in ``agentbolt/__init__.py`` imports each name from the module given there. These tests check the stub's form,
that the run-time names are the objects it names, and run mypy over a user-style snippet to show that the names carry
their real types (not ``Any``).
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import agentbolt

INIT = Path(agentbolt.__file__)
STUB = INIT.with_suffix(".pyi")


def _stub_imports() -> Dict[str, Tuple[str, str]]:
    """Exported name -> (module, attribute), read from ``agentbolt/__init__.pyi``; every import must re-export."""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    names: Dict[str, Tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr | ast.AnnAssign):  # the docstring and ``__version__: str``
            continue
        assert isinstance(node, ast.ImportFrom) and node.module is not None, ast.dump(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: write `import {alias.name} as {alias.name}`"
            names[alias.name] = (node.module, alias.name)
    return names


def test_every_name_in_all_resolves() -> None:
    missing = [name for name in agentbolt.__all__ if not hasattr(agentbolt, name)]
    assert not missing
    namespace: Dict[str, object] = {}
    exec("from agentbolt import *", namespace)
    assert set(agentbolt.__all__) <= set(namespace)
    assert set(agentbolt.__all__) <= set(dir(agentbolt))


def test_stub_imports_are_the_run_time_objects() -> None:
    static = _stub_imports()
    assert set(static) == set(agentbolt.__all__) - {"__version__"}
    assert len(agentbolt.__all__) == len(set(agentbolt.__all__))
    for name, (module, attribute) in static.items():
        exported = getattr(importlib.import_module(module), attribute)
        if name == "reward" and getattr(agentbolt, name) is sys.modules.get("agentbolt.reward"):
            continue  # the deprecated module agentbolt.reward, once imported, is bound there (and callable)
        assert getattr(agentbolt, name) is exported, name


def test_reward_stays_callable_after_the_deprecated_module_is_imported() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import agentbolt.reward

        @agentbolt.reward
        def score(value: float) -> float:
            return value

    assert callable(agentbolt.reward) and score.__name__ == "score" and score is not agentbolt.reward


def test_grpo_and_sqlite_store_are_the_classes() -> None:
    import agentbolt.algorithm
    from agentbolt.algorithm.grpo.algorithm import GRPO
    from agentbolt.store.sqlite import SqliteLightningStore

    assert agentbolt.GRPO is GRPO and agentbolt.algorithm.GRPO is GRPO
    assert agentbolt.SqliteLightningStore is SqliteLightningStore


def test_apo_and_verl_name_the_missing_implementation() -> None:
    for name, module in (("APO", "agentbolt.algorithm.apo"), ("VERL", "agentbolt.algorithm.verl")):
        factory = getattr(agentbolt, name)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            with pytest.raises(ImportError, match=module.replace(".", r"\.")):
                factory()


def _mypy_errors(tmp_path: Path, code: str) -> List[Tuple[int, str]]:
    """Run mypy over ``code`` as a user module; returns (line, error code) of each error."""
    snippet = tmp_path / "user_code.py"
    snippet.write_text(textwrap.dedent(code), encoding="utf-8")
    # agentbolt is found through MYPYPATH (an editable install is invisible to mypy); third-party packages are left
    # out, so the check reads agentbolt's own annotations and takes seconds, not minutes.
    env = {**os.environ, "MYPYPATH": str(INIT.parent.parent)}
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--no-site-packages",
        "--follow-imports=silent",
        "--no-implicit-reexport",  # as under --strict: a name is public only if re-exported explicitly
        "--cache-dir",
        str(tmp_path / "mypy-cache"),
        "--show-error-codes",
        "--no-error-summary",
        "--no-pretty",
        snippet.name,
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    errors: List[Tuple[int, str]] = []
    for line in result.stdout.splitlines():
        if ": error: " not in line:
            continue
        location, message = line.split(": error: ", 1)
        assert message.endswith("]"), line
        errors.append((int(location.split(":")[1]), message.rsplit("[", 1)[1].rstrip("]")))
    return errors


def test_mypy_sees_every_public_name_with_its_real_type(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    names = "\n".join(f"agl.{name}" for name in agentbolt.__all__)
    code = f"""\
import agentbolt as agl

{names}

trainer: agl.Trainer = agl.Trainer(n_runners=1)
store: agl.LightningStore = agl.SqliteLightningStore("store.db")
rollout: agl.Rollout = agl.Rollout(rollout_id="r", input=None, start_time=0.0)
grpo: agl.GRPO = agl.GRPO(batch_size=1)

agl.Trainer(n_runners="two")
agl.emit_reward("high")
agl.GRPO(config=3)
agl.NoSuchName
"""
    first_wrong = code.splitlines().index('agl.Trainer(n_runners="two")') + 1
    errors = _mypy_errors(tmp_path, code)
    assert errors == [
        (first_wrong, "arg-type"),
        (first_wrong + 1, "arg-type"),
        (first_wrong + 2, "arg-type"),
        (first_wrong + 3, "attr-defined"),
    ]
