"""Pack training samples that share token prefixes into one sequence, each shared token computed once.

The rollouts of a GRPO group answer the same task, so their first LLM calls share the whole prompt (system message,
examples, question: often hundreds of tokens) and later calls share it too, followed by the earlier turns. Padded
batches compute that prompt once per sample. :func:`pack_samples` instead builds the prefix tree (trie) of the
samples' token sequences and lays its nodes out as one sequence: a node stands for one token at one depth of a
prefix shared by every sample passing through it.

The forward over the packed sequence is exact, not an approximation:

* every node attends to itself and its ancestors in the tree, and only to them (an explicit ``[L, L]`` attention
  mask), which is the causal context that token has in each sample passing through it;
* its position id is its depth, the position it has in those samples;
* the log-prob of a sample's response token at depth ``d`` is read from the hidden state of the sample's node at
  depth ``d - 1``, exactly as a padded forward reads it from the previous position.

Gradients flow from every sample's loss into the shared nodes and are summed there by autograd, so the gradient
equals the padded batch's (up to float summation order). The saving is the shared prompt: a group of 8 rollouts
whose first calls share a 500-token prompt packs 8 x 540 = 4,320 tokens into about 500 + 8 x 40 = 820.

:func:`prefix_tree` builds the tree of any token sequences and each sequence's path through it; the SFT trainer
packs its samples (several target segments each) with it too (``packing="prefix"``). :func:`pack_samples` lays GRPO
samples out with the same response-aligned layout as :class:`~agentbolt.algorithm.grpo.trainer.ResponseBatch`
(``targets``, ``response_mask`` of shape ``[B, R]``, each response in the last columns of its row), plus
``source_positions``: the packed position whose hidden state predicts each target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import torch

from agentbolt.algorithm.grpo.samples import TokenSample

__all__ = [
    "PackedBatch",
    "PrefixTree",
    "attention_implementation",
    "pack_samples",
    "packable",
    "uses_sliding_window",
    "prefix_order",
    "prefix_tree",
    "tree_logits",
]


def packable(model: Any) -> bool:
    """Whether packed forwards are exact for ``model``: a plain output head, an attention that reads 4-D masks, and
    no sliding-window attention (the packed forward's tree mask replaces the model's own mask, window included)."""
    from agentbolt.serving.logits import plain_output_head

    return (
        plain_output_head(model)
        and attention_implementation(model) in ("sdpa", "eager")
        and not uses_sliding_window(model)
    )


def uses_sliding_window(model: Any) -> bool:
    """Whether some attention layer of ``model`` sees only a window of the positions before it (Mistral v0.1,
    Gemma 2-3, Phi-3, Qwen2 with ``use_sliding_window``)."""
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    config = get_text_config() if callable(get_text_config) else config
    if not getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", True) is False:
        return False
    layer_types = getattr(config, "layer_types", None)
    return layer_types is None or any("sliding" in str(kind) for kind in layer_types)


def attention_implementation(model: Any) -> Any:
    """The attention implementation ``model``'s config names (``sdpa``, ``eager``, ``flash_attention_2``...)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


@dataclass
class PrefixTree:
    """Token sequences laid out as one sequence of prefix-tree nodes, each shared prefix token once.

    Attributes:
        input_ids: ``[1, L]`` the token of each tree node.
        position_ids: ``[1, L]`` each node's depth.
        parents: ``[L]`` each node's parent position (-1 for roots).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor

    @property
    def length(self) -> int:
        """``L``, the packed sequence length."""
        return int(self.input_ids.shape[1])

    @property
    def computed_tokens(self) -> int:
        """Tokens a forward over this batch computes: ``L``."""
        return self.length

    def attention_mask(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The additive ``[1, 1, L, L]`` mask: 0 where a node may attend (itself, its ancestors), else ``dtype``'s min.

        Parents precede their children in the packed order, so each row is its parent's row plus the diagonal.
        """
        allowed = torch.zeros((self.length, self.length), dtype=torch.bool)
        for node, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                allowed[node] = allowed[parent]
            allowed[node, node] = True
        mask = torch.full((self.length, self.length), torch.finfo(dtype).min, dtype=dtype)
        mask.masked_fill_(allowed, 0.0)
        return mask.to(device)[None, None]

    def to(self, device: torch.device) -> PrefixTree:
        """The same tree with its model inputs on ``device``."""
        return PrefixTree(self.input_ids.to(device), self.position_ids.to(device), self.parents)


def prefix_tree(sequences: Sequence[Sequence[int]]) -> Tuple[PrefixTree, List[List[int]]]:
    """Build the prefix tree (trie) of token sequences.

    Returns:
        The tree, and for each sequence its path: the node of each of its tokens, so the hidden state that predicts
        token ``t`` of sequence ``i`` is the one at packed position ``paths[i][t - 1]``.

    Raises:
        ValueError: No sequences, or an empty one.
    """
    if not sequences:
        raise ValueError("cannot pack an empty list of samples")
    tokens: List[int] = []
    parents: List[int] = []
    depths: List[int] = []
    children: Dict[Tuple[int, int], int] = {}
    paths: List[List[int]] = []
    for index, sequence in enumerate(sequences):
        if not sequence:
            raise ValueError(f"sample {index} has no tokens")
        parent = -1
        path: List[int] = []
        for depth, token in enumerate(sequence):
            node = children.get((parent, token))
            if node is None:
                node = len(tokens)
                children[(parent, token)] = node
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
            path.append(node)
            parent = node
        paths.append(path)
    tree = PrefixTree(
        input_ids=torch.tensor([tokens], dtype=torch.long),
        position_ids=torch.tensor([depths], dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
    )
    return tree, paths


@dataclass
class PackedBatch(PrefixTree):
    """GRPO samples packed as one prefix-tree sequence, with response-aligned views.

    Attributes:
        targets: ``[B, R]`` response tokens, right-aligned (padding columns hold 0).
        response_mask: ``[B, R]`` true on response tokens.
        source_positions: ``[B, R]`` packed position whose hidden state predicts ``targets`` (0 on padding).
    """

    targets: torch.Tensor
    response_mask: torch.Tensor
    source_positions: torch.Tensor

    @property
    def response_width(self) -> int:
        """``R``, the number of response-aligned columns."""
        return int(self.targets.shape[1])

    def to(self, device: torch.device) -> PackedBatch:
        """The same batch with every tensor on ``device``."""
        return PackedBatch(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.parents,
            self.targets.to(device),
            self.response_mask.to(device),
            self.source_positions.to(device),
        )


def pack_samples(samples: Sequence[TokenSample]) -> PackedBatch:
    """Build the prefix tree of the samples' prompt + response tokens and its response-aligned views.

    Raises:
        ValueError: No samples, or a sample with an empty prompt or response (a response token needs a previous
            token to be predicted from).
    """
    for index, sample in enumerate(samples):
        if not sample.prompt_ids or not sample.response_ids:
            raise ValueError(f"sample {index} has an empty prompt or response")
    tree, paths = prefix_tree([sample.token_ids for sample in samples])
    width = max(len(sample.response_ids) for sample in samples)
    targets = torch.zeros((len(samples), width), dtype=torch.long)
    response_mask = torch.zeros((len(samples), width), dtype=torch.bool)
    source_positions = torch.zeros((len(samples), width), dtype=torch.long)
    for row, (sample, path) in enumerate(zip(samples, paths, strict=True)):
        count, start = len(sample.response_ids), len(sample.prompt_ids)
        targets[row, width - count :] = torch.tensor(sample.response_ids, dtype=torch.long)
        response_mask[row, width - count :] = True
        source_positions[row, width - count :] = torch.tensor(path[start - 1 : start - 1 + count], dtype=torch.long)
    return PackedBatch(tree.input_ids, tree.position_ids, tree.parents, targets, response_mask, source_positions)


def tree_logits(model: Any, tree: PrefixTree, sources: torch.Tensor) -> torch.Tensor:
    """Float32 logits of the hidden states at packed positions ``sources`` (any shape; result ``[*sources, V]``).

    The model body runs once over the whole tree (with its tree mask, on the tree's device); only the hidden states
    at ``sources`` are projected to the vocabulary, in float32 (:func:`~agentbolt.serving.logits.float32_head`).
    ``model`` must be :func:`packable`.
    """
    from agentbolt.serving.logits import body_hidden_states, float32_head

    hidden = body_hidden_states(
        model,
        input_ids=tree.input_ids,
        attention_mask=tree.attention_mask(model.dtype, tree.input_ids.device),
        position_ids=tree.position_ids,
        use_cache=False,
    )[0]
    return float32_head(model, hidden[sources])


def prefix_order(sequences: Sequence[List[int]], indices: Iterable[int]) -> List[int]:
    """``indices`` sorted so that sequences sharing a prefix are neighbours (lexicographic token order).

    Chunking the sorted list into micro-batches keeps sequences with a common prompt together, so packing shares it.
    """
    return sorted(indices, key=sequences.__getitem__)
