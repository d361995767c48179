"""A tiny randomly initialised Llama with a byte-level tokenizer, built locally without any download.

It is meant for smoke tests of anything that loads, serves or trains a model: it has the same file layout as a
real Hugging Face model directory (config, safetensors weights, fast tokenizer, ChatML chat template with tool
support), loads in milliseconds and runs a step in a few milliseconds on a CPU. Its output is noise, but the
weights are a deterministic function of ``seed`` and so is sampling with a fixed sampling seed.

Example:
    >>> from agentbolt.models.tiny import create_tiny_model
    >>> path = create_tiny_model("/tmp/tiny-llama")  # doctest: +SKIP
    >>> # agentbolt serve /tmp/tiny-llama
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from agentbolt.models.chat_template import chatml_tools_template
from agentbolt.models.marker import write_marker

__all__ = ["create_tiny_model", "TINY_SPECIAL_TOKENS"]

TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Special tokens of the tiny tokenizer; ids 0, 1, 2 (``<|im_end|>`` is end of turn and EOS)."""


def _build_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE without merges: every byte is one token, so any text round-trips exactly.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: index for index, token in enumerate(TINY_SPECIAL_TOKENS)}
    for symbol in sorted(alphabet):
        vocab[symbol] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(TINY_SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=2048,
    )
    tokenizer.chat_template = chatml_tools_template(None)
    return tokenizer


def create_tiny_model(
    path: Union[str, os.PathLike[str]],
    *,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 2048,
) -> Path:
    """Write a tiny random Llama model directory (about 100 KB of weights with the defaults).

    Args:
        path: Directory to create (existing files in it are overwritten).
        seed: Seed of the weight initialisation; the same seed gives identical weights.
        hidden_size: Model width.
        num_layers: Number of decoder layers.
        num_heads: Attention heads.
        num_kv_heads: Key/value heads (grouped-query attention when smaller than ``num_heads``).
        intermediate_size: MLP width.
        max_position_embeddings: Context length.

    Returns:
        The directory, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and servable by ``agentbolt serve``.

    Raises:
        ImportError: torch / transformers are not installed (the ``train`` extra).
    """
    try:
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the tiny model needs torch and transformers: pip install 'agentbolt[train]' ({exc})"
        ) from exc

    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=0.5,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    write_marker(target, {"name": "tiny-llama", "seed": seed})
    return target
