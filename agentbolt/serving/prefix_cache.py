"""Key/value states of prompt prefixes the engine has already computed, reused by later prompts that start the same.

Agent prompts repeat themselves: every call of a role starts with the same system message, tool schemas and worked
examples (often hundreds of tokens), and the rollouts of a GRPO group send the same prompt many times over. Prefilling
that prefix again for every request is most of the cost of a rollout on a CPU. :class:`PrefixCache` keeps the
key/value states of prompt prefixes in blocks of ``block_size`` tokens, chained like a trie: a block is found by its
parent block and its own tokens, so two prompts share exactly the blocks of their common prefix. A prompt's last,
partial block is kept too, as a *tail* that later prompts reuse where they continue it token for token (the same
prompt sent again, as the rollouts of a group do, then prefills only its last token). A new request reuses the
longest chain of cached blocks that starts its prompt, and the tail after it, and prefills only the rest.

Reuse is exact in arithmetic: the states of a token depend only on the tokens before it and on the weights, so the
cache is valid for one set of weights and one adapter (its *namespace*); the engine resets it whenever either
changes. It is not bit-exact in every precision: prefilling a prompt in one piece and prefilling only its last token
after cached states round differently in bfloat16 and with quantized blocks, so the log-probs of a repeated prompt
can differ in their second or third decimal (and a seeded sample can differ).

Memory is bounded by ``max_bytes``; the least recently used blocks go first. A lookup touches a chain from its root,
so a block is always used at least as recently as its descendants, and eviction removes leaves before their parents.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import torch

__all__ = ["CachedBlock", "PrefixCache"]

LayerStates = Callable[[int, int, int], Tuple["torch.Tensor", "torch.Tensor"]]
"""``(layer, start, end) -> (keys, values)`` of positions ``[start, end)``, each ``[kv_heads, end - start, head_dim]``."""


@dataclass
class CachedBlock:
    """The key/value states of one block of ``block_size`` prompt tokens, for every layer."""

    key: Tuple[int, Tuple[int, ...]]
    keys: List[torch.Tensor]
    values: List[torch.Tensor]
    nbytes: int

    @property
    def length(self) -> int:
        """Tokens whose states the block holds (``block_size``, or fewer for a prompt's tail)."""
        return len(self.key[1])


class PrefixCache:
    """Block-chained key/value states of prompt prefixes (see the module docstring).

    Args:
        block_size: Tokens per block; only whole blocks are cached and reused.
        max_bytes: Memory the cached states may take; least recently used blocks are evicted beyond it.

    Raises:
        ValueError: ``block_size`` or ``max_bytes`` below 1.
    """

    def __init__(self, block_size: int = 32, max_bytes: int = 256 * 2**20) -> None:
        if block_size < 1 or max_bytes < 1:
            raise ValueError(f"block_size and max_bytes must be positive, got {block_size} and {max_bytes}")
        self.block_size = block_size
        self.max_bytes = max_bytes
        self.namespace: Optional[Hashable] = None
        self._blocks: OrderedDict[Tuple[int, Tuple[int, ...]], CachedBlock] = OrderedDict()
        self._ids: Dict[Tuple[int, Tuple[int, ...]], int] = {}
        self._next_id = 1
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def use_namespace(self, namespace: Hashable) -> None:
        """Serve states computed under ``namespace`` (weights version and adapter); a new namespace empties the cache."""
        if namespace != self.namespace:
            self.clear()
            self.namespace = namespace

    def clear(self) -> None:
        """Forget every cached block."""
        self._blocks.clear()
        self._ids.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def _chain(self, tokens: Sequence[int]) -> List[Tuple[int, Tuple[int, ...]]]:
        """The keys of the whole blocks of ``tokens``, root first, as far as the cache has them."""
        keys: List[Tuple[int, Tuple[int, ...]]] = []
        parent = 0
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            key = (parent, tuple(tokens[start : start + size]))
            block_id = self._ids.get(key)
            if block_id is None:
                break
            keys.append(key)
            parent = block_id
        return keys

    def cached_length(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest cached prefix of ``tokens`` (whole blocks), without marking anything used."""
        return len(self._chain(tokens)) * self.block_size

    def match(self, tokens: Sequence[int], limit: int) -> List[CachedBlock]:
        """The cached blocks that start ``tokens``, whole blocks then the longest tail continuing them, for up to
        ``limit`` tokens; marks them recently used. The last block may hold more than ``limit`` allows: the caller
        uses only the first ``limit`` tokens' states."""
        size = self.block_size
        chain = self._chain(tokens)
        keys = chain[: -(-max(0, limit) // size)]  # whole blocks, the last one possibly reaching past the limit
        covered = len(keys) * size
        if covered < limit and len(keys) == len(chain):
            parent = self._ids[keys[-1]] if keys else 0
            for length in range(min(size - 1, len(tokens) - covered), 0, -1):
                tail = (parent, tuple(tokens[covered : covered + length]))
                if tail in self._blocks:
                    keys.append(tail)
                    break
        blocks = []
        for key in keys:
            self._blocks.move_to_end(key)
            blocks.append(self._blocks[key])
        if blocks:
            self.hits += 1
            self.reused_tokens += min(sum(block.length for block in blocks), max(0, limit))
        return blocks

    def insert(self, tokens: Sequence[int], states: LayerStates, layers: int) -> None:
        """Cache the blocks of ``tokens`` not cached yet, the whole ones and the tail; ``states`` reads their
        key/value states."""
        size = self.block_size
        parent = 0
        for start in range(0, len(tokens), size):
            key = (parent, tuple(tokens[start : start + size]))
            block_id = self._ids.get(key)
            if block_id is None:
                keys, values = [], []
                for layer in range(layers):
                    layer_keys, layer_values = states(layer, start, start + len(key[1]))
                    keys.append(layer_keys.clone())
                    values.append(layer_values.clone())
                nbytes = sum(t.numel() * t.element_size() for t in keys + values)
                block_id = self._next_id
                self._next_id += 1
                self._ids[key] = block_id
                self._blocks[key] = CachedBlock(key, keys, values, nbytes)
                self.nbytes += nbytes
            else:
                self._blocks.move_to_end(key)
            parent = block_id
        self._evict()

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self._blocks:
            key, block = self._blocks.popitem(last=False)
            del self._ids[key]
            self.nbytes -= block.nbytes

    def stats(self) -> Dict[str, Any]:
        """``blocks``, ``bytes``, ``hits`` (lookups that reused a block) and ``reused_tokens`` so far."""
        return {
            "blocks": len(self._blocks),
            "bytes": self.nbytes,
            "hits": self.hits,
            "reused_tokens": self.reused_tokens,
        }
