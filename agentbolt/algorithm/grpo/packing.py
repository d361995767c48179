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

The result has the same response-aligned layout as :class:`~agentbolt.algorithm.grpo.trainer.ResponseBatch`
(``targets``, ``response_mask`` of shape ``[B, R]``, each response in the last columns of its row), plus
``source_positions``: the packed position whose hidden state predicts each target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

from agentbolt.algorithm.grpo.samples import TokenSample

__all__ = ["PackedBatch", "pack_samples", "prefix_order"]


@dataclass
class PackedBatch:
    """Samples packed as one prefix-tree sequence.

    Attributes:
        input_ids: ``[1, L]`` the token of each tree node.
        position_ids: ``[1, L]`` each node's depth.
        parents: ``[L]`` each node's parent position (-1 for roots).
        targets: ``[B, R]`` response tokens, right-aligned (padding columns hold 0).
        response_mask: ``[B, R]`` true on response tokens.
        source_positions: ``[B, R]`` packed position whose hidden state predicts ``targets`` (0 on padding).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    parents: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    source_positions: torch.Tensor

    @property
    def length(self) -> int:
        """``L``, the packed sequence length."""
        return int(self.input_ids.shape[1])

    @property
    def computed_tokens(self) -> int:
        """Tokens a forward over this batch computes: ``L``."""
        return self.length

    @property
    def response_width(self) -> int:
        """``R``, the number of response-aligned columns."""
        return int(self.targets.shape[1])

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
    if not samples:
        raise ValueError("cannot pack an empty list of samples")
    tokens: List[int] = []
    parents: List[int] = []
    depths: List[int] = []
    children: Dict[Tuple[int, int], int] = {}
    paths: List[List[int]] = []
    for index, sample in enumerate(samples):
        if not sample.prompt_ids or not sample.response_ids:
            raise ValueError(f"sample {index} has an empty prompt or response")
        parent = -1
        path: List[int] = []
        for depth, token in enumerate(sample.prompt_ids + sample.response_ids):
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

    width = max(len(sample.response_ids) for sample in samples)
    targets = torch.zeros((len(samples), width), dtype=torch.long)
    response_mask = torch.zeros((len(samples), width), dtype=torch.bool)
    source_positions = torch.zeros((len(samples), width), dtype=torch.long)
    for row, (sample, path) in enumerate(zip(samples, paths, strict=True)):
        count, start = len(sample.response_ids), len(sample.prompt_ids)
        targets[row, width - count :] = torch.tensor(sample.response_ids, dtype=torch.long)
        response_mask[row, width - count :] = True
        source_positions[row, width - count :] = torch.tensor(path[start - 1 : start - 1 + count], dtype=torch.long)
    return PackedBatch(
        input_ids=torch.tensor([tokens], dtype=torch.long),
        position_ids=torch.tensor([depths], dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        targets=targets,
        response_mask=response_mask,
        source_positions=source_positions,
    )


def prefix_order(samples: Sequence[TokenSample], indices: Sequence[int]) -> List[int]:
    """``indices`` sorted so that samples sharing a prompt prefix are neighbours (lexicographic token order).

    Chunking the sorted list into micro-batches keeps a group's samples together, so packing shares their prompt.
    """
    return sorted(indices, key=lambda i: samples[i].prompt_ids + samples[i].response_ids)
