"""Each token's own bytes, for the ``bytes`` field of OpenAI's logprobs.

A token may hold only part of a UTF-8 character (byte-level BPE writes a rare character as several byte tokens):
decoded alone its text is U+FFFD, but its bytes are what a client joins to rebuild the text. They are read from the
token's string in the vocabulary, the way the tokenizer's own decoder reads it:

* byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM...): every character of the token string stands for one byte, in
  GPT-2's alphabet of 256 printable characters; a token string with a character outside that alphabet (an added
  token) is its own UTF-8 text, as the ``tokenizers`` ByteLevel decoder does;
* byte fallback (SentencePiece models such as Llama 2): a ``<0xAB>`` token is that one byte;
* any other token: the UTF-8 of its text decoded alone.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Dict, Optional, Set

__all__ = ["TokenBytes"]

logger = logging.getLogger(__name__)

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> Dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte, mapped back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in characters:
            characters[byte] = chr(256 + shifted)
            shifted += 1
    return {character: byte for byte, character in characters.items()}


_BYTE_LEVEL = _byte_level_alphabet()


def _decoder_types(tokenizer: Any) -> Set[str]:
    """The ``type`` of the tokenizer's decoder and of the decoders of a ``Sequence`` (empty when it has none)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    try:
        stack = [json.loads(decoder.__getstate__())]
    except (AttributeError, TypeError, ValueError):
        logger.debug("Cannot read the decoder of %s", type(tokenizer).__name__, exc_info=True)
        return set()
    types: Set[str] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            types.add(str(item.get("type")))
            stack.extend(item.get("decoders") or [])
    return types


class TokenBytes:
    """The bytes of a transformers tokenizer's tokens (see the module docstring).

    Args:
        tokenizer: The model's tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        types = _decoder_types(tokenizer)
        self._byte_level = "ByteLevel" in types
        self._byte_fallback = "ByteFallback" in types

    def of(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for (a part of a character's UTF-8 for a byte token)."""
        if self._byte_level or self._byte_fallback:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece:
                found = self._piece_bytes(piece)
                if found is not None:
                    return found
        return str(self._tokenizer.decode([token_id])).encode()

    def _piece_bytes(self, piece: str) -> Optional[bytes]:
        """The bytes of a vocabulary string, or None when the decoder does not read it byte by byte."""
        if self._byte_level:
            if all(character in _BYTE_LEVEL for character in piece):
                return bytes(_BYTE_LEVEL[character] for character in piece)
            return piece.encode()
        match = _BYTE_TOKEN.fullmatch(piece)
        return bytes([int(match.group(1), 16)]) if match else None
