"""Prefix-tree construction for one verify pass (pure tensor code, no model).

Contract: `build_tree(root, candidates, prefix_len)` merges candidate token
sequences (each a continuation AFTER `root`, the already-known next target token)
into a prefix tree whose node 0 is `root`. It returns node tokens, parent indices,
depths, position ids and the additive float attention mask that lets each node
see the whole prefix (the KV cache) plus its own ancestors and itself. Shared
prefixes are stored once; an empty candidate set gives the single-node tree.
`max_nodes` caps the tree; candidates are taken in order (best first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class Tree:
    tokens: list[int]                      # [q] node tokens, node 0 = root
    parents: list[int]                     # [q] parent index, -1 for the root
    depths: list[int]                      # [q] 0 for the root
    children: list[dict[int, int]]         # per node: token -> child node
    source: list[int] = field(default_factory=list)  # [q] first candidate that made the node (-1 root)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def ancestors(self) -> torch.Tensor:
        """Bool [q, q]: entry (i, j) is True when node j is i itself or an ancestor of i."""
        q = self.size
        anc = torch.zeros(q, q, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                anc[i] = anc[p]
            anc[i, i] = True
        return anc

    def attention_mask(self, prefix_len: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """Additive float mask [1, 1, q, prefix_len + q]: 0 where attending is allowed, dtype-min elsewhere.

        A boolean 4D mask would be added as 0/1 by eager attention, silently wrong.
        """
        q = self.size
        allowed = torch.cat([torch.ones(q, prefix_len, dtype=torch.bool), self.ancestors()], dim=1)
        mask = torch.full((q, prefix_len + q), torch.finfo(dtype).min, dtype=dtype)
        mask.masked_fill_(allowed, 0.0)
        return mask.to(device)[None, None]

    def position_ids(self, prefix_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Long [1, q]: prefix_len + depth."""
        return (torch.tensor(self.depths, dtype=torch.long) + prefix_len).to(device)[None]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def build_tree(root: int, candidates: Sequence[Sequence[int]], max_nodes: int | None = None) -> Tree:
    """Merge candidate continuations of `root` into a prefix tree (see module docstring)."""
    tree = Tree(tokens=[int(root)], parents=[-1], depths=[0], children=[{}], source=[-1])
    for ci, cand in enumerate(candidates):
        node = 0
        for tok in cand:
            tok = int(tok)
            child = tree.children[node].get(tok)
            if child is None:
                if max_nodes is not None and tree.size >= max_nodes:
                    break
                child = tree.size
                tree.tokens.append(tok)
                tree.parents.append(node)
                tree.depths.append(tree.depths[node] + 1)
                tree.children.append({})
                tree.source.append(ci)
                tree.children[node][tok] = child
            node = child
    return tree


def accept(tree: Tree, argmax: Sequence[int]) -> tuple[list[int], int]:
    """Walk the tree along the target's argmax.

    argmax[i] is the target's greedy next token after node i. Returns the accepted
    path (node indices, starting with the root) and the bonus token: the target's
    argmax after the last accepted node, so every pass yields at least one token.
    """
    path = [0]
    node = 0
    while True:
        child = tree.children[node].get(int(argmax[node]))
        if child is None:
            break
        path.append(child)
        node = child
    return path, int(argmax[node])
