"""Convert a GGUF model file into a cached safetensors model directory.

transformers can load a GGUF file (dequantizing it) but refuses to ``save_pretrained`` such a model, and the load
is slow (most of it is tokenizer parsing). We therefore load it once, rebuild a plain model from its config, copy
the dequantized weights in, and save model, tokenizer and a tool-aware chat template as a normal directory that
loads in a second or two.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Optional

from agentbolt.models.chat_template import chatml_tools_template
from agentbolt.models.marker import write_marker

__all__ = ["convert_gguf"]

logger = logging.getLogger(__name__)


def _report(progress: Optional[Callable[[str], None]], message: str) -> None:
    logger.info(message)
    if progress is not None:
        progress(message)


def convert_gguf(
    gguf_file: Path,
    target: Path,
    *,
    default_system_prompt: Optional[str] = None,
    metadata: Optional[Dict[str, str]] = None,
    progress: Optional[Callable[[str], None]] = None,
) -> Path:
    """Convert ``gguf_file`` into a safetensors model directory at ``target``.

    The directory is written next to ``target`` under a temporary name and renamed into place at the end, so an
    interrupted conversion never leaves a half-written model behind. Weights are stored in float32 (the exact
    dequantized values); pick the compute dtype when loading.

    Args:
        gguf_file: The GGUF file.
        target: Output directory (replaced if it exists).
        default_system_prompt: Default system prompt of the chat template written with the tokenizer; for
            ChatML models the template gains tool support (see :mod:`agentbolt.models.chat_template`).
        metadata: Extra fields stored in the marker file (:data:`agentbolt.models.marker.MARKER_FILE`).
        progress: Called with a short message at each step.

    Returns:
        ``target``.

    Raises:
        ImportError: torch / transformers / gguf are not installed (the ``train`` extra).
    """
    try:
        import torch  # noqa: F401
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"converting GGUF models needs torch and transformers: pip install 'agentbolt[train]' ({exc})"
        ) from exc

    started = time.monotonic()
    folder, name = str(gguf_file.parent), gguf_file.name
    _report(progress, f"Reading tokenizer from {name} (takes ~10-30 s)...")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _report(progress, "Dequantizing weights...")
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    state = gguf_model.state_dict()
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    _report(progress, "Rebuilding a plain model from the config...")
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    really_missing = [key for key in missing if key not in tied]
    if really_missing or unexpected:
        raise RuntimeError(f"GGUF weights do not match the model: missing {really_missing}, unexpected {unexpected}")
    if missing:
        model.tie_weights()
    del gguf_model, state

    if tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template:
        tokenizer.chat_template = chatml_tools_template(default_system_prompt)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config is not None and tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _report(progress, f"Saving safetensors model to {target}...")
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        write_marker(staging, {"converted_from": str(gguf_file), **(metadata or {})})
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _report(progress, f"Converted {name} in {time.monotonic() - started:.1f} s")
    return target
