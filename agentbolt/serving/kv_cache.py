"""Key/value cache of a continuously batched set of left-padded sequences.

Every layer keeps one key and one value buffer of shape ``[batch, kv_heads, capacity, head_dim]``; columns
``[0, length)`` hold the states of the tokens seen so far (left padding included, masked by the engine's attention
mask). Appending a decoding step writes one column in place, and capacity grows geometrically, so a step copies
only the new token's states instead of the whole cache (what concatenation-based caches do). Growth stops at
:attr:`KVCache.planned_length` when the engine knows it (the most columns its sequences can still fill), so a batch
never holds room it cannot use.

The engine reshapes the batch between steps: it keeps some rows (:meth:`KVCache.select_rows`, also used to repeat a
prompt's row for ``n`` choices), drops leading columns nobody attends to any more (:meth:`KVCache.drop_leading`) and
joins newly prefilled sequences (:meth:`KVCache.merge`). Both forward paths use this one cache: the packed fast path
(:mod:`agentbolt.serving.fast_forward`) appends directly, and transformers models see it through
:meth:`KVCache.as_transformers_cache`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

__all__ = ["KVCache"]

_HEADROOM = 64  # columns allocated beyond the current need when a buffer grows


class KVCache:
    """Per-layer key/value buffers with geometric growth (see the module docstring)."""

    def __init__(self) -> None:
        self.keys: List[Optional[torch.Tensor]] = []
        self.values: List[Optional[torch.Tensor]] = []
        self.lengths: List[int] = []
        self.planned_length: Optional[int] = None
        """The most columns the cache will need (set by the engine before each step); growth stops there."""

    @property
    def length(self) -> int:
        """Columns filled (the same for every layer between forward passes)."""
        return self.lengths[0] if self.lengths else 0

    def _ensure_layer(self, layer: int) -> None:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
            self.lengths.append(0)

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Append ``[batch, kv_heads, new, head_dim]`` states to ``layer``; return all its states so far (views)."""
        buffer_k, buffer_v, start = self.reserve(layer, keys, keys.shape[-2])
        end = start + keys.shape[-2]
        buffer_k[:, :, start:end] = keys
        buffer_v[:, :, start:end] = values
        return buffer_k[:, :, :end], buffer_v[:, :, :end]

    def reserve(self, layer: int, like: torch.Tensor, new: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """Count ``new`` more columns as filled in ``layer`` and return its whole key and value buffers and the first
        new column, for the caller to write the new states into (``like`` gives batch, heads, head_dim, dtype)."""
        self._ensure_layer(layer)
        start = self.lengths[layer]
        end = start + new
        buffer_k, buffer_v = self.keys[layer], self.values[layer]
        if buffer_k is None or buffer_v is None or end > buffer_k.shape[-2]:
            capacity = max(end + _HEADROOM, 2 * (buffer_k.shape[-2] if buffer_k is not None else 0))
            if self.planned_length is not None:
                capacity = max(end, min(capacity, self.planned_length))
            shape = (like.shape[0], like.shape[1], capacity, like.shape[-1])
            grown_k, grown_v = like.new_empty(shape), like.new_empty(shape)
            if buffer_k is not None and buffer_v is not None and start:
                grown_k[:, :, :start] = buffer_k[:, :, :start]
                grown_v[:, :, :start] = buffer_v[:, :, :start]
            self.keys[layer], self.values[layer] = buffer_k, buffer_v = grown_k, grown_v
        self.lengths[layer] = end
        return buffer_k, buffer_v, start

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep (or repeat) the batch rows listed in ``index``, in that order."""
        for layer, (buffer_k, buffer_v) in enumerate(zip(self.keys, self.values, strict=True)):
            if buffer_k is not None and buffer_v is not None:
                self.keys[layer] = buffer_k.index_select(0, index)
                self.values[layer] = buffer_v.index_select(0, index)

    def drop_leading(self, columns: int) -> None:
        """Forget the first ``columns`` positions of every row (padding no remaining sequence attends to)."""
        for layer, (buffer_k, buffer_v) in enumerate(zip(self.keys, self.values, strict=True)):
            if buffer_k is not None and buffer_v is not None:
                self.keys[layer] = buffer_k[:, :, columns:]
                self.values[layer] = buffer_v[:, :, columns:]
                self.lengths[layer] -= columns

    def merge(self, other: KVCache) -> None:
        """Append ``other``'s rows below this cache's, left padding the shorter one to the common length.

        The merged buffers are all built before any replaces this cache's, so a failure (out of memory) leaves this
        cache as it was.
        """
        width = max(self.length, other.length)
        layers = max(len(self.keys), len(other.keys))
        self._ensure_layer(layers - 1)
        other._ensure_layer(layers - 1)
        merged: List[Tuple[torch.Tensor, torch.Tensor]] = []
        for layer in range(layers):
            parts_k = [(self.keys[layer], self.lengths[layer]), (other.keys[layer], other.lengths[layer])]
            parts_v = [(self.values[layer], self.lengths[layer]), (other.values[layer], other.lengths[layer])]
            template = next(t for t, _ in parts_k if t is not None)
            rows = sum(t.shape[0] for t, _ in parts_k if t is not None)
            shape = (rows, template.shape[1], width + _HEADROOM, template.shape[3])
            merged_k = template.new_zeros(shape)
            merged_v = template.new_zeros(shape)
            row = 0
            for (part_k, filled), (part_v, _) in zip(parts_k, parts_v, strict=True):
                if part_k is None or part_v is None:
                    continue
                count = part_k.shape[0]
                merged_k[row : row + count, :, width - filled : width] = part_k[:, :, :filled]
                merged_v[row : row + count, :, width - filled : width] = part_v[:, :, :filled]
                row += count
            merged.append((merged_k, merged_v))
        for layer, (merged_k, merged_v) in enumerate(merged):
            self.keys[layer], self.values[layer], self.lengths[layer] = merged_k, merged_v, width

    def as_transformers_cache(self) -> Any:
        """A ``transformers`` cache object whose layers read and write this cache."""
        from transformers.cache_utils import DynamicCache

        layer_class = _transformers_layer_class()
        cache = DynamicCache()
        cache.layers = [layer_class(self, index) for index in range(len(self.keys))]
        cache.layer_class_to_replicate = lambda: layer_class(self, len(cache.layers))  # type: ignore[assignment]
        return cache


@functools.lru_cache(maxsize=1)
def _transformers_layer_class() -> type:
    """The ``transformers`` cache layer class that forwards to one layer of a :class:`KVCache` (built lazily)."""
    from transformers.cache_utils import DynamicLayer

    class KVCacheLayer(DynamicLayer):  # type: ignore[misc]
        def __init__(self, owner: KVCache, index: int) -> None:
            super().__init__()
            owner._ensure_layer(index)
            self.owner, self.index, self.is_initialized = owner, index, True
            buffer_k, buffer_v = owner.keys[index], owner.values[index]
            filled = owner.lengths[index]
            self.keys = buffer_k[:, :, :filled] if buffer_k is not None else None
            self.values = buffer_v[:, :, :filled] if buffer_v is not None else None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Tuple[Any, Any]:
            self.keys, self.values = self.owner.append(self.index, key_states, value_states)
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.owner.lengths[self.index]

    return KVCacheLayer
