"""The bytes of each token, for the ``bytes`` of chat logprobs: a part of a character is its own bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentbolt.serving.token_bytes import TokenBytes

transformers = pytest.importorskip("transformers")

TEXT = "aé🚀你 x"


def _byte_fallback_tokenizer() -> Any:
    """A SentencePiece-style tokenizer (Llama 2's decoder): characters outside its vocabulary become byte tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "▁": 1, "a": 2, "x": 3, **{f"<0x{byte:02X}>": 4 + byte for byte in range(256)}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def test_byte_level_tokens_are_their_bytes(tiny_model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    token_bytes = TokenBytes(tokenizer)
    ids = tokenizer(TEXT + "<|im_end|>", add_special_tokens=False).input_ids
    assert b"".join(token_bytes.of(token) for token in ids) == (TEXT + "<|im_end|>").encode()
    split = tokenizer("🚀", add_special_tokens=False).input_ids
    assert len(split) == 4 and all(tokenizer.decode([token]) == "\ufffd" for token in split)
    assert [token_bytes.of(token) for token in split] == [bytes([byte]) for byte in "🚀".encode()]


def test_byte_fallback_tokens_are_their_bytes() -> None:
    tokenizer = _byte_fallback_tokenizer()
    token_bytes = TokenBytes(tokenizer)
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == TEXT
    assert b"".join(token_bytes.of(token) for token in ids) == TEXT.encode()
